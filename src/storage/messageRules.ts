/**
 * The message operations of the `Storage` contract, written once over the few row operations a
 * backend provides (`MessageRows`): what a refused save was, where a taken timestamp message goes,
 * what a page is, how a channel's messages are counted, what an ack does. A backend gives its row
 * operations and may replace an operation built here by its own when it does the same faster in
 * its store (DynamoDB's concurrent saves and acks, SQL's one-transaction saves and one-statement
 * count and ack).
 */
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import { type Notification, sortkeyMs } from "../domain/notification.ts"
import {
  addsToChannel,
  nextFreeMs,
  type SaveOutcome,
  sortKeyMsOf,
  sortKeyOf,
  TIMESTAMP_END,
  timestampLowerBound,
  TOPIC_END,
  topicKeyBounds,
  TOPIC_PREFIX
} from "./model.ts"
import type { StorageError, StorageService } from "./Storage.ts"

/** A message row as a read returns it: its sort key and the message it holds. */
export interface ReadRow {
  readonly sortKey: string
  readonly message: Notification
}

/** What a backend provides for messages: the rows of one user in one month's message table. */
export interface MessageRows {
  /**
   * Save `message` at its sort key if the row there lets it (`mayWriteOver`), and when it did not,
   * tell why (`saveOutcome`: a conditional put, then a look at the row). `operation` names the
   * `Storage` operation in a failure.
   */
  readonly save: (operation: string, uaid: string, table: string, message: Notification) => Effect.Effect<SaveOutcome, StorageError>
  /**
   * Readable rows (unexpired at `now` ms, no tombstones) with `lo < sortKey < hi`, in sort-key
   * order, `limit` at most. The limit counts readable rows only: a page of expired rows and
   * tombstones ending among topic rows would leave the topic rows after it unread.
   */
  readonly readable: (
    operation: string,
    uaid: string,
    table: string,
    lo: string,
    hi: string,
    limit: number,
    now: number
  ) => Effect.Effect<ReadonlyArray<ReadRow>, StorageError>
  /**
   * Delete the row at `sortKey`: with `version`, only if it holds that message (not its tombstone),
   * true when it did; without, whatever it holds (true).
   */
  readonly remove: (operation: string, uaid: string, table: string, sortKey: string, version?: string) => Effect.Effect<boolean, StorageError>
  /**
   * The row at `sortKey`, if it holds the message of `version` (not its tombstone), becomes its
   * tombstone (`model.ts`) as of `now` ms; true when it did.
   */
  readonly bury: (operation: string, uaid: string, table: string, sortKey: string, version: string, now: number) => Effect.Effect<boolean, StorageError>
}

/** The message operations of the `Storage` service. */
export type MessageOperations = Pick<
  StorageService,
  | "saveMessage"
  | "saveMessages"
  | "countChannelMessages"
  | "fetchTopicMessages"
  | "fetchMessages"
  | "fetchTimestampMessages"
  | "deleteMessage"
  | "cancelMessage"
  | "ackMessages"
  | "replaceTopicMessage"
>

/**
 * The write rule of a message row, for a row that holds `existing` (a message or its tombstone,
 * `cancelled`): a timestamp message goes over nothing but its own live row (the same version: a
 * save retried after a lost answer stores it once); a topic message replaces the row unless that
 * one was accepted later (its sort ms; its `timestamp` seconds for rows of older versions); nothing
 * goes over the message's own tombstone. Stores with conditional writes say the same in their
 * conditions.
 */
export const mayWriteOver = (existing: Notification & { readonly cancelled?: boolean | undefined }, message: Notification): boolean => {
  const ownTombstone = existing.cancelled === true && existing.version === message.version
  if (message.topic === undefined) return existing.version === message.version && existing.cancelled !== true
  return !ownTombstone && sortkeyMs(existing) <= sortkeyMs(message)
}

/**
 * What a save refused by the write rule was: `cancelled` over its own tombstone, else `taken` for a
 * timestamp message (another message holds its key) or `superseded` for a topic message.
 */
const refusedSave = (message: Notification, ownTombstone: boolean): SaveOutcome =>
  ownTombstone ? "cancelled" : message.topic === undefined ? "taken" : "superseded"

/** A step of a generator that runs in an Effect or as a store's statements: anything `yield*` can run. */
type Step<Y, A> = { [Symbol.iterator](): Iterator<Y, A, any> }

/**
 * A backend's `save` of one message: its `put` (the write rule; true when written), and when that
 * wrote nothing, what refused it (whether the row is the message's own tombstone, `ownTombstone`).
 */
export function* saveOutcome<P, T>(
  message: Notification,
  put: Step<P, boolean>,
  ownTombstone: () => Step<T, boolean>
): Generator<P | T, SaveOutcome, any> {
  if (yield* put) return "stored"
  return refusedSave(message, yield* ownTombstone())
}

/**
 * Save `first`, and while its key is taken, the message `next` makes of it at the next ms (a save
 * of messages whose ids are out keeps the id: `nextFreeMs`; a push not yet answered gets a new id
 * naming the ms). What was saved last and how it went: stored, superseded or cancelled.
 */
export function* saveAtFreeMs<S, N>(
  save: (message: Notification) => Step<S, SaveOutcome>,
  first: Notification,
  next: (message: Notification) => Step<N, Notification>
): Generator<S | N, { readonly outcome: SaveOutcome; readonly placed: Notification }, any> {
  let placed = first
  let outcome = yield* save(placed)
  while (outcome === "taken") outcome = yield* save(placed = yield* next(placed))
  return { outcome, placed }
}

/** The id kept: the next ms alone (the `next` of `saveAtFreeMs` for messages whose ids are out). */
export function* keepingTheId(message: Notification): Generator<never, Notification> {
  return nextFreeMs(message)
}

/** One page from `lo` to the last timestamp row, as the contract returns it. */
const pageOf = (rows: ReadonlyArray<ReadRow>, limit: number) => {
  const last = rows.at(-1)
  return {
    messages: rows.map((row) => row.message),
    lastSortKey: last === undefined ? undefined : sortKeyMsOf(last.sortKey),
    more: rows.length === limit
  }
}

/** Rows a channel's count reads at a time. */
const COUNT_PAGE = 1000

/** Save messages whose ids are out (`saveMessages`): each at its key or the next ms free, the id kept; the messages as stored, or undefined where not. */
export const saveKeepingTheId = (save: (message: Notification) => Effect.Effect<SaveOutcome, StorageError>, message: Notification) =>
  Effect.map(Effect.gen(() => saveAtFreeMs(save, message, keepingTheId)), ({ outcome, placed }) => (outcome === "stored" ? placed : undefined))

/** The `Storage` message operations over `rows`, each replaced by `faster`'s when it has one. */
export const makeMessageOperations = (rows: MessageRows, faster: Partial<MessageOperations> = {}): MessageOperations => {
  const save = (operation: string, uaid: string, table: string) => (message: Notification) => rows.save(operation, uaid, table, message)

  const page = (operation: string, uaid: string, table: string, lo: string, limit: number) =>
    Effect.flatMap(Clock.currentTimeMillis, (now) => Effect.map(rows.readable(operation, uaid, table, lo, TIMESTAMP_END, limit, now), (read) => pageOf(read, limit)))

  const operations: MessageOperations = {
    saveMessage: (uaid, table, message) => save("saveMessage", uaid, table)(message),
    saveMessages: Effect.fnUntraced(function*(uaid, table, messages) {
      const saved: Array<Notification> = []
      for (const message of messages) {
        const placed = yield* saveKeepingTheId(save("saveMessages", uaid, table), message)
        if (placed !== undefined) saved.push(placed)
      }
      return saved
    }),
    countChannelMessages: Effect.fnUntraced(function*(uaid, table, channelId, atMost, replacing) {
      const now = yield* Clock.currentTimeMillis
      let counted = 0
      let lo = TOPIC_PREFIX
      while (counted < atMost) {
        const read = yield* rows.readable("countChannelMessages", uaid, table, lo, TIMESTAMP_END, COUNT_PAGE, now)
        counted += read.filter((row) => addsToChannel(row.message, channelId, replacing)).length
        const last = read.at(-1)
        if (last === undefined || read.length < COUNT_PAGE) break
        lo = last.sortKey
      }
      return Math.min(atMost, counted)
    }),
    fetchTopicMessages: (uaid, table, limit) =>
      Effect.flatMap(Clock.currentTimeMillis, (now) =>
        Effect.map(rows.readable("fetchTopicMessages", uaid, table, TOPIC_PREFIX, TOPIC_END, limit, now), (read) => read.map((row) => row.message))),
    fetchMessages: (uaid, table, limit) => page("fetchMessages", uaid, table, TOPIC_PREFIX, limit),
    fetchTimestampMessages: (uaid, table, after, limit) => page("fetchTimestampMessages", uaid, table, timestampLowerBound(after), limit),
    deleteMessage: (uaid, table, key, version) => rows.remove("deleteMessage", uaid, table, sortKeyOf(key), version),
    cancelMessage: (uaid, table, key, version) =>
      Effect.flatMap(Clock.currentTimeMillis, (now) => rows.bury("cancelMessage", uaid, table, sortKeyOf(key), version, now)),
    ackMessages: (uaid, table, acked) =>
      Effect.flatMap(Clock.currentTimeMillis, (now) =>
        Effect.forEach(acked, ({ key, version }) => rows.bury("ackMessages", uaid, table, sortKeyOf(key), version, now), { discard: true })),
    replaceTopicMessage: (uaid, table, message) => {
      if (message.topic === undefined) return Effect.succeed(false)
      const [lo, hi] = topicKeyBounds(message.channelId, message.topic)
      return Effect.flatMap(Clock.currentTimeMillis, (now) =>
        Effect.flatMap(rows.readable("replaceTopicMessage", uaid, table, lo, hi, 1, now), ([row]) =>
          row === undefined || sortkeyMs(row.message) >= sortkeyMs(message)
            ? Effect.succeed(false)
            : rows.bury("replaceTopicMessage", uaid, table, row.sortKey, row.message.version, now)))
    }
  }
  return { ...operations, ...faster }
}
