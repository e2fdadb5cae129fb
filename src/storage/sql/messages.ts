/**
 * The SQL stores' messages, in a month's message table (`{prefix}_{YYYY}_{MM}`): one row per
 * message keyed by (`uaid`, `chidmessageid`: `01:` topic, `02:` timestamp), with its `expiry`
 * (seconds), and its tombstone once cancelled or acked (`cancelled` 1, content gone, key and
 * version kept, expiry cut to `TOMBSTONE_SECONDS` from then: the sweep deletes it within minutes,
 * `sql/sweep.ts`); on either store's driver (`sql/driver.ts`).
 *
 * Expiry is judged by the Effect `Clock` on every read (`expiry > now`), as on the other layers.
 */
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import { type MessageKey, type Notification, sortkeyMs } from "../../domain/notification.ts"
import {
  messageSortKey,
  nextFreeMs,
  type SaveOutcome,
  sortKeyMsOf,
  sortKeyOf,
  TIMESTAMP_END,
  TIMESTAMP_PREFIX,
  timestampLowerBound,
  TOMBSTONE_SECONDS,
  TOPIC_END,
  TOPIC_PREFIX,
  topicSortKey
} from "../model.ts"
import { jsonList } from "./dialect.ts"
import { changed, fromExcluded, nothing, placeholders, sql, type Sql, type SqlDriver } from "./driver.ts"
import { ident, MESSAGE_COLUMNS, messageFromRow, type MessageRow, messageValues } from "./tables.ts"
import type { AckedRow, MessageSave } from "../Storage.ts"

const COLUMNS = MESSAGE_COLUMNS.split(", ")
/** A message row's values, and the update of a row it replaces (every column but the key). */
const VALUES = placeholders(COLUMNS.length)
const UPDATE_ALL = fromExcluded(COLUMNS.slice(2))

/** An operation that judges expiry: `now` is the caller's Clock (ms). */
export const atNow = <A, E>(body: (now: number) => Effect.Effect<A, E>): Effect.Effect<A, E> => Effect.flatMap(Clock.currentTimeMillis, body)

export const makeSqlMessages = ({ dialect, one, run }: SqlDriver) => {
  /**
   * One message: a timestamp message into a free sort key or over its own row (the same
   * `updateid`: a save retried after a lost answer stores it once), never over another
   * message; a topic message replaces the row unless that one was accepted later (its sort
   * ms, or its `timestamp` seconds for rows without one); none over its own tombstone.
   */
  function* putMessage(uaid: string, table: string, message: Notification): Sql<SaveOutcome> {
    const insert = `INSERT INTO ${ident(table)} AS m (${MESSAGE_COLUMNS}) VALUES (${VALUES})
      ON CONFLICT (uaid, chidmessageid) DO UPDATE SET ${UPDATE_ALL}`
    const written = message.topic === undefined
      ? yield sql(`${insert} WHERE m.updateid = excluded.updateid AND m.cancelled IS NULL`, ...messageValues(uaid, message))
      : yield sql(
        `${insert} WHERE coalesce(m.sortkey_timestamp, m.timestamp * 1000) <= $${COLUMNS.length + 1}
         AND (m.cancelled IS NULL OR m.updateid IS DISTINCT FROM excluded.updateid)`,
        ...messageValues(uaid, message),
        sortkeyMs(message)
      )
    if (written.changes > 0) return "stored"
    const tombstone = yield sql(
      `SELECT 1 FROM ${ident(table)} WHERE uaid = $1 AND chidmessageid = $2 AND updateid = $3 AND cancelled IS NOT NULL`,
      uaid,
      messageSortKey(message),
      message.version
    )
    return tombstone.rows.length > 0 ? "cancelled" : message.topic === undefined ? "taken" : "superseded"
  }

  /** Readable rows (not expired at `now`, not tombstones) after `lo` and before `hi`, `limit` at most. */
  const readable = (table: string, uaid: string, lo: string, hi: string, now: number, limit: number) =>
    sql(
      `SELECT * FROM ${ident(table)} WHERE uaid = $1 AND chidmessageid > $2 AND chidmessageid < $3
       AND (expiry IS NULL OR expiry > $4) AND cancelled IS NULL ORDER BY chidmessageid LIMIT $5`,
      uaid,
      lo,
      hi,
      Math.floor(now / 1000),
      limit
    )

  /**
   * One page: `limit` readable rows (expired rows and tombstones are not counted: a page of
   * them ending among topic rows would leave the topic rows after it unread).
   */
  const messagePage = (operation: string, uaid: string, table: string, lo: string, limit: number) =>
    atNow((now) =>
      one(operation, readable(table, uaid, lo, TIMESTAMP_END, now, limit), (result) => {
        const rows = result.rows as unknown as ReadonlyArray<MessageRow>
        const last = rows.at(-1)
        return {
          messages: rows.flatMap((row) => messageFromRow(row) ?? []),
          lastSortKey: last === undefined ? undefined : sortKeyMsOf(last.chidmessageid),
          more: rows.length === limit
        }
      })
    )

  /** A user's messages, each at its key or the next ms free (`saveMessages`). */
  function* saveAll(uaid: string, table: string, messages: ReadonlyArray<Notification>): Sql<ReadonlyArray<Notification>> {
    const saved: Array<Notification> = []
    for (const message of messages) {
      let placed = message
      let outcome = yield* putMessage(uaid, table, placed)
      while (outcome === "taken") outcome = yield* putMessage(uaid, table, placed = nextFreeMs(placed))
      if (outcome === "stored") saved.push(placed)
    }
    return saved
  }

  /**
   * What a row becomes when it is buried: its tombstone, key and version kept, expiring
   * `TOMBSTONE_SECONDS` after `now` (the statement's parameter `$n`) unless the message expires sooner.
   */
  const bury = (n: number) =>
    `SET cancelled = 1, data = NULL, headers = NULL, expiry = CASE WHEN expiry IS NULL OR expiry > $${n} THEN $${n} ELSE expiry END`
  const tombstoneExpiry = (now: number) => Math.floor(now / 1000) + TOMBSTONE_SECONDS

  return {
    saveMessage: (uaid: string, table: string, message: Notification) => run("saveMessage", () => putMessage(uaid, table, message)),
    saveMessages: (uaid: string, table: string, messages: ReadonlyArray<Notification>) =>
      run("saveMessages", () => saveAll(uaid, table, messages), messages.length > 0),
    saveManyMessages: (saves: ReadonlyArray<MessageSave>) =>
      run("saveManyMessages", function*() {
        const saved: Array<ReadonlyArray<Notification>> = []
        for (const save of saves) saved.push(yield* saveAll(save.uaid, save.table, save.messages))
        return saved
      }, saves.length > 0),
    /** The channel's topic rows (a range) and timestamp rows (the user's, by the key's end), readable ones, `atMost` at most. */
    countChannelMessages: (uaid: string, table: string, channelId: string, atMost: number, replacing?: string) =>
      atNow((now) =>
        one(
          "countChannelMessages",
          sql(
            `SELECT count(*) AS n FROM (SELECT 1 FROM ${ident(table)} WHERE uaid = $1 AND (
               (chidmessageid > $2 AND chidmessageid < $3 AND chidmessageid LIKE $4)
               OR (chidmessageid >= $5 AND chidmessageid < $6 AND chidmessageid <> $7))
             AND (expiry IS NULL OR expiry > $8) AND cancelled IS NULL LIMIT $9) AS counted`,
            uaid,
            TIMESTAMP_PREFIX,
            TIMESTAMP_END,
            `${TIMESTAMP_PREFIX}%:${channelId}`,
            `${TOPIC_PREFIX}${channelId}:`,
            `${TOPIC_PREFIX}${channelId};`,
            replacing === undefined ? "" : topicSortKey(channelId, replacing),
            Math.floor(now / 1000),
            atMost
          ),
          ({ rows }) => Number((rows[0] as { readonly n: unknown } | undefined)?.n ?? 0)
        )
      ),
    fetchTopicMessages: (uaid: string, table: string, limit: number) =>
      atNow((now) =>
        one(
          "fetchTopicMessages",
          readable(table, uaid, TOPIC_PREFIX, TOPIC_END, now, limit),
          ({ rows }) => rows.flatMap((row) => messageFromRow(row as unknown as MessageRow) ?? [])
        )
      ),
    fetchMessages: (uaid: string, table: string, limit: number) => messagePage("fetchMessages", uaid, table, TOPIC_PREFIX, limit),
    fetchTimestampMessages: (uaid: string, table: string, after: number | undefined, limit: number) =>
      messagePage("fetchTimestampMessages", uaid, table, timestampLowerBound(after), limit),
    deleteMessage: (uaid: string, table: string, key: MessageKey, version?: string) =>
      version === undefined
        ? one("deleteMessage", sql(`DELETE FROM ${ident(table)} WHERE uaid = $1 AND chidmessageid = $2`, uaid, sortKeyOf(key)), () => true)
        : one(
          "deleteMessage",
          sql(`DELETE FROM ${ident(table)} WHERE uaid = $1 AND chidmessageid = $2 AND updateid = $3 AND cancelled IS NULL`, uaid, sortKeyOf(key), version),
          changed
        ),
    /** One statement: each row still holding its acked version becomes its tombstone (rows found by key, then version). */
    ackMessages: (uaid: string, table: string, rows: ReadonlyArray<AckedRow>) =>
      rows.length === 0 ? Effect.void : atNow((now) =>
        one(
          "ackMessages",
          sql(
            `UPDATE ${ident(table)} ${bury(4)} WHERE uaid = $1 AND chidmessageid ${dialect.inList(2)} AND cancelled IS NULL
             AND (chidmessageid, updateid) IN (SELECT value->>0, value->>1 FROM ${dialect.tuples(3)})`,
            uaid,
            jsonList(rows.map((row) => sortKeyOf(row.key))),
            jsonList(rows.map((row) => [sortKeyOf(row.key), row.version])),
            tombstoneExpiry(now)
          ),
          nothing
        )
      ),
    /** The row becomes its tombstone if it holds the message of `version`. */
    cancelMessage: (uaid: string, table: string, key: MessageKey, version: string) =>
      atNow((now) =>
        one(
          "cancelMessage",
          sql(
            `UPDATE ${ident(table)} ${bury(4)} WHERE uaid = $1 AND chidmessageid = $2 AND updateid = $3 AND cancelled IS NULL`,
            uaid,
            sortKeyOf(key),
            version,
            tombstoneExpiry(now)
          ),
          changed
        )
      )
  }
}
