/**
 * The Storage service: router records, per-month channel sets and messages, in autopush's DynamoDB
 * layout (`model.ts`): a router table of one row per user, keyed by uaid, holding its router record;
 * a message table per month, keyed by uaid and sort key, holding each user's channel rows and
 * messages; a receipt table of push receipts. Four layers implement it, SQLite (`sqlite/layer.ts`: the
 * embedded default), PostgreSQL (`postgres/layer.ts`: fleets without AWS), DynamoDB (`dynamo/layer.ts`: AWS,
 * DynamoDB Local, Alternator, and the dynalite of `dynalite/embedded.ts`) and in-memory (`memory/layer.ts`), and
 * all pass the one contract suite in `test/storage/`.
 *
 * Message tables are named explicitly by every message operation: the router record says which
 * table a user lives in (`currentMonth`), and the connection node decides when a user moves on.
 * Every read filters expired items against the Effect `Clock` (TTL deletion is lazy or absent), and
 * leaves out the tombstones cancelled and acked messages leave (`cancelMessage`, `ackMessages`, `model.ts`).
 *
 * Tables must exist before use (`createTables`; every node keeps them present: `tableKeeper.ts`); an
 * operation on a missing table fails with a `StorageError` whose reason is `MissingTable`
 * (`failures.ts`: why an operation failed, and whether to retry it).
 * Table names, rotation and the stale-user month range: `tables.ts`; sort keys: `model.ts`.
 */
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import type { MessageKey, Notification } from "../domain/notification.ts"
import type { MessageStatus, ReceiptSubscription, StatusUpdate } from "../domain/receipt.ts"
import type { UserRecord } from "../domain/user.ts"
import type { StorageError } from "./failures.ts"
import type { ManySaves } from "./manySaves.ts"
import type { SaveOutcome } from "./model.ts"

export { failureText, hasReason, StorageError, storageUnavailable } from "./failures.ts"

/** A session of a node, as its router record names it. */
export interface NodeSession {
  readonly uaid: string
  readonly connectedAt: number
}

/** `clearNodeIds` as one `clearNodeId` per session, `concurrency` at once (stores without transactions). */
export const clearNodeIdsEach = (clearNodeId: StorageService["clearNodeId"], concurrency: number): StorageService["clearNodeIds"] =>
(nodeId, sessions) =>
  Effect.map(
    Effect.forEach(sessions, (session) => clearNodeId(session.uaid, nodeId, session.connectedAt), { concurrency }),
    (cleared) => cleared.filter((one) => one).length
  )

/** One page of a user's message rows, in sort-key order. */
interface MessagePage {
  readonly messages: ReadonlyArray<Notification>
  /** Sort key (ms) of the last row read, expired or not, if a timestamp row: where the next timestamp page starts. */
  readonly lastSortKey?: number | undefined
  /** Rows after this page may exist: it was full (false: there were none when it was read). */
  readonly more: boolean
}

/** A stored message a client acked: its row's key and the message's version. */
export interface AckedRow {
  readonly key: MessageKey
  readonly version: string
}

/** Fields of a router record that `updateUser` may change. */
export type UserPatch = Partial<Omit<UserRecord, "uaid">>

export interface TableStatus {
  readonly table: string
  readonly ok: boolean
  readonly cause?: string | undefined
}

/** A table's status by whether it is there. */
export const tableFound = (table: string, found: boolean): TableStatus => (found ? { table, ok: true } : { table, ok: false, cause: "table not found" })

export interface StorageService extends ManySaves<StorageError> {
  // ── router table ─────────────────────────────────────────────────────────────────────────────
  readonly getUser: (uaid: string) => Effect.Effect<UserRecord | undefined, StorageError>
  /** Write the whole record unless a record with a newer-or-equal `connectedAt` exists; true when written. */
  readonly registerUser: (user: UserRecord) => Effect.Effect<boolean, StorageError>
  /**
   * Overwrite an existing record unless it has a newer-or-equal `connectedAt`; false when it is newer
   * or gone (a user dropped while a client reconnects stays dropped: that client gets a new uaid).
   */
  readonly resumeUser: (user: UserRecord) => Effect.Effect<boolean, StorageError>
  /** Change fields of an existing record; false when there is no record. */
  readonly updateUser: (uaid: string, patch: UserPatch) => Effect.Effect<boolean, StorageError>
  /**
   * Remove the router record, then everything the user has in its current message table (in that
   * order: once the record is gone no hello can resume the user, whatever is still being deleted).
   * With `ifConnectedAt`, only if the record still has that `connectedAt` (nobody resumed the user
   * since it was read). True when a record was dropped.
   */
  readonly dropUser: (uaid: string, options?: { readonly ifConnectedAt?: number }) => Effect.Effect<boolean, StorageError>
  /** Remove `nodeId` only if both `nodeId` and `connectedAt` still match; true when cleared. */
  readonly clearNodeId: (uaid: string, nodeId: string, connectedAt: number) => Effect.Effect<boolean, StorageError>
  /**
   * `clearNodeId` for many sessions of one node at once (a node that stops leaves the records of
   * all its sessions together: on SQL stores one statement per 500 sessions, where one each would
   * cost a commit each); how many records were cleared.
   */
  readonly clearNodeIds: (nodeId: string, sessions: ReadonlyArray<NodeSession>) => Effect.Effect<number, StorageError>

  // ── broadcasts (one item of the router table, shared by every node) ──────────────────────────
  /** The broadcast set: id → version. */
  readonly getBroadcasts: Effect.Effect<ReadonlyMap<string, string>, StorageError>
  readonly putBroadcast: (id: string, version: string) => Effect.Effect<void, StorageError>
  /** True when there was such a broadcast. */
  readonly deleteBroadcast: (id: string) => Effect.Effect<boolean, StorageError>

  // ── message tables ───────────────────────────────────────────────────────────────────────────
  /** The table new users and migrated users go to now (by the Clock; the single table without rotation). */
  readonly currentMessageTable: Effect.Effect<string>
  /** Tables a user's `currentMonth` may name and still be served (last month, this month, next when due). */
  readonly activeMessageTables: Effect.Effect<ReadonlyArray<string>>
  /**
   * Add a channel to the user's set in that table; false (nothing added) when the set already holds
   * `maxChannels` other channels. Adding a channel that is there already is a success. Costs the same
   * whatever the size of the set.
   */
  readonly addChannel: (
    uaid: string,
    table: string,
    channelId: string,
    maxChannels?: number
  ) => Effect.Effect<boolean, StorageError>
  /** Add channels without a limit (moving a user's set to a new month). */
  readonly addChannels: (uaid: string, table: string, channelIds: Iterable<string>) => Effect.Effect<void, StorageError>
  /** True when the channel was there. */
  readonly removeChannel: (uaid: string, table: string, channelId: string) => Effect.Effect<boolean, StorageError>
  readonly getChannels: (uaid: string, table: string) => Effect.Effect<ReadonlySet<string>, StorageError>
  /** Whether the user's set in that table holds the channel (one read, whatever the size of the set). */
  readonly hasChannel: (uaid: string, table: string, channelId: string) => Effect.Effect<boolean, StorageError>
  /**
   * Store a message. A topic message replaces the channel's message of that topic unless that one was
   * accepted later (`superseded`). A timestamp message never replaces another: `taken` when its sort
   * key (channel and ms) holds another message (another version) — the caller takes the next ms,
   * with a message id of its own. Its own row (same version) is written over: saving a message twice
   * stores it once. Its own tombstone is not: `cancelled`, nothing written (it was cancelled or acked).
   */
  readonly saveMessage: (uaid: string, table: string, message: Notification) => Effect.Effect<SaveOutcome, StorageError>
  /**
   * Store messages whose ids are already out (unacked at a disconnect, a month move), each at the key
   * its id names. Idempotent: a message whose row is there already (same version) is written over, so
   * a save retried from the start after a lost answer stores each message once. A timestamp message
   * whose sort key holds another message goes to the next ms free or holding its own row (its id
   * stays: two ids of one channel and ms, from two endpoint nodes); a topic message a newer one
   * superseded is left out, and so is a message whose key (or later ms) holds its own tombstone: it
   * was cancelled since an earlier save of it, which a retried save must not undo. The messages as stored.
   */
  readonly saveMessages: (
    uaid: string,
    table: string,
    messages: ReadonlyArray<Notification>
  ) => Effect.Effect<ReadonlyArray<Notification>, StorageError>
  /**
   * How many messages `channelId` has stored in `table` (unexpired, not tombstones), counted up to
   * `atMost`, leaving out the row of topic `replacing` (a message of that topic would replace it):
   * what bounds one subscription's stored messages when a push arrives. Reads the user's message rows.
   */
  readonly countChannelMessages: (
    uaid: string,
    table: string,
    channelId: string,
    atMost: number,
    replacing?: string | undefined
  ) => Effect.Effect<number, StorageError>
  /** Unexpired topic messages, at most `limit`. */
  readonly fetchTopicMessages: (
    uaid: string,
    table: string,
    limit: number
  ) => Effect.Effect<ReadonlyArray<Notification>, StorageError>
  /**
   * Unexpired messages from the user's first one on, one page of `limit` rows: topic messages, then
   * timestamp messages ascending — the order a drain sends them in, both kinds in one request.
   */
  readonly fetchMessages: (uaid: string, table: string, limit: number) => Effect.Effect<MessagePage, StorageError>
  /** Unexpired timestamp messages with sort key strictly after `after` (ms), ascending, one page of `limit` rows. */
  readonly fetchTimestampMessages: (
    uaid: string,
    table: string,
    after: number | undefined,
    limit: number
  ) => Effect.Effect<MessagePage, StorageError>
  /**
   * Delete one message; deleting a missing row is not an error.
   * With `version`, only if the row still holds that message (a move must not take the newer
   * message that replaced a topic meanwhile), and true when it did; a tombstone of that version is
   * left in place, false (the message was cancelled or acked: nobody takes it). Without, always true (a
   * tombstone goes too).
   */
  readonly deleteMessage: (
    uaid: string,
    table: string,
    key: MessageKey,
    version?: string
  ) => Effect.Effect<boolean, StorageError>
  /**
   * Cancel a message: the row at `key`, if it holds the message of `version` (not its tombstone
   * already), becomes its tombstone — same key, version and expiry, no data or headers — which no read
   * returns, no save of that version writes over, and which goes when the message would have
   * expired. True when it did (the message is never delivered from this table after it).
   */
  readonly cancelMessage: (uaid: string, table: string, key: MessageKey, version: string) => Effect.Effect<boolean, StorageError>
  /**
   * Acked messages: each row that still holds the message of its `version` becomes its tombstone,
   * as a cancel makes it (a save of that message retried after the ack, its first answer lost, then
   * writes nothing: an acked message is not delivered again). A row holding another message, a
   * tombstone already, or no row is left as it is.
   */
  readonly ackMessages: (uaid: string, table: string, rows: ReadonlyArray<AckedRow>) => Effect.Effect<void, StorageError>
  /**
   * A topic message delivered directly (not stored): the stored message of its topic, if accepted
   * before it, becomes its tombstone as an ack makes it, so no later read brings the older after the
   * newer. True when one did; a newer one, or none, is left as it is (also for a message without topic).
   */
  readonly replaceTopicMessage: (uaid: string, table: string, message: Notification) => Effect.Effect<boolean, StorageError>

  // ── push receipts (the `{router_table}_receipts` table; expiries in seconds, as message TTLs) ─
  /** Create a receipt subscription that lives until `expiry`. */
  readonly createReceiptSubscription: (id: string, expiry: number) => Effect.Effect<void, StorageError>
  /** Move an unexpired subscription's expiry on to `expiry`; false when it is unknown or expired. */
  readonly touchReceiptSubscription: (id: string, expiry: number) => Effect.Effect<boolean, StorageError>
  /**
   * Apply `update` to a message's status row, making the row if missing: the write that opens a
   * message's row (the endpoint's, as it accepts the message, before the message goes anywhere).
   * False when `update` carries an outcome and the row has one already (nothing is written then).
   */
  readonly openMessageStatus: (subscription: string, messageId: string, update: StatusUpdate) => Effect.Effect<boolean, StorageError>
  /**
   * Apply `update` to a message's status row, only if the row is there: a step that comes after
   * the row was removed (its receipt collected) must not make it again without an outcome, which
   * would have the message reported a second time. False when nothing was written: no row, or
   * `update` carries an outcome and the row has one already.
   */
  readonly updateMessageStatus: (subscription: string, messageId: string, update: StatusUpdate) => Effect.Effect<boolean, StorageError>
  readonly getMessageStatus: (subscription: string, messageId: string) => Effect.Effect<MessageStatus | undefined, StorageError>
  /** An unexpired subscription with its unexpired status rows; undefined when unknown or expired. */
  readonly readReceiptSubscription: (id: string) => Effect.Effect<ReceiptSubscription | undefined, StorageError>
  /** Delete status rows (receipts handed out); missing rows are not an error. */
  readonly deleteMessageStatuses: (subscription: string, messageIds: ReadonlyArray<string>) => Effect.Effect<void, StorageError>

  // ── maintenance ──────────────────────────────────────────────────────────────────────────────
  /**
   * Create the router table (with its `AccessIndex` on `last_connect`), the receipt table and the
   * given message tables when missing (TTL on `expiry` where the server has TTL); returns once they are ACTIVE.
   */
  readonly createTables: (messageTables: ReadonlyArray<string>) => Effect.Effect<void, StorageError>
  /** The router table, the receipt table and the active message tables: missing or not ACTIVE → `ok: false`; unreachable → error. */
  readonly checkTables: Effect.Effect<ReadonlyArray<TableStatus>, StorageError>
  /** Message tables that exist with our prefix, oldest first. */
  readonly listMessageTables: Effect.Effect<ReadonlyArray<string>, StorageError>
  /** Delete one of our message tables (anything else is refused) and wait until it is gone; a missing one is fine. */
  readonly dropMessageTable: (table: string) => Effect.Effect<void, StorageError>
  /**
   * Drop the users of `sweep`'s months, via the `last_connect` index, with their rows in their
   * current message table; one whose `last_connect` changed meanwhile is kept. How many were
   * dropped (with `dryRun`: would be, nothing is dropped).
   */
  readonly dropStaleUsers: (sweep: StaleUserSweep) => Effect.Effect<number, StorageError>
}

/** What a stale-user sweep drops (`dropStaleUsers`): users last connected `monthsAgo` … `monthsAgo + lookbackMonths` months ago, both included. */
export interface StaleUserSweep {
  readonly monthsAgo: number
  readonly lookbackMonths: number
  /** The running total of users dropped, after each small batch. */
  readonly onProgress?: (dropped: number) => Effect.Effect<void>
  /** Count the users that would be dropped; drop none. */
  readonly dryRun?: boolean
}

export class Storage extends Context.Service<Storage, StorageService>()("autopush/storage/Storage") {}

/** Create the router and receipt tables and the active message tables when missing (the table keeper, tests). */
export const createActiveTables: Effect.Effect<void, StorageError, Storage> = Storage.use((storage) =>
  Effect.flatMap(storage.activeMessageTables, storage.createTables)
)

/**
 * A `StorageService` whose operations (the methods, and, with `values`, the members that are effects
 * themselves) each go through what `wrap` makes for its name, once per operation: timing, deadlines,
 * test latency.
 */
export const mapStorageOperations = (
  inner: StorageService,
  wrap: (name: string) => <A, E>(operation: Effect.Effect<A, E>) => Effect.Effect<A, E>,
  options: { readonly values: boolean } = { values: true }
): StorageService => {
  const wrapped: Record<string, unknown> = {}
  for (const [name, member] of Object.entries(inner)) {
    if (typeof member === "function") {
      const through = wrap(name)
      const operation = member as (...args: Array<unknown>) => Effect.Effect<unknown, unknown>
      wrapped[name] = (...args: Array<unknown>) => through(operation(...args))
    } else {
      wrapped[name] = options.values && Effect.isEffect(member) ? wrap(name)(member as Effect.Effect<unknown, unknown>) : member
    }
  }
  return wrapped as unknown as StorageService
}
