/**
 * Storage on SQLite (`node:sqlite`): the embedded default, one database file under `data_dir`
 * shared by every process of the host that uses it (the workers of a node, separate nodes). Tables
 * and rows: `sqliteSchema.ts`; receipts `sqliteReceipts.ts`; tables, stale users and the sweep of
 * expired rows `sqliteMaintenance.ts`.
 *
 * Every operation is a few synchronous statements on this thread. Measured with
 * `npm run bench:sqlite` (2-core VM, WAL, synchronous=NORMAL, 3 KB rows): on the main thread
 * an insert takes ~48 µs and a 10-row read ~31 µs of CPU; through a worker thread owning the
 * database the same calls take ~106 / ~89 µs one at a time, ~56 µs each with 50 in flight, and
 * ~75 µs of CPU across both threads — the message passing costs more than the statement. So the
 * store runs where the caller runs. A write that finds another process writing does not wait on
 * the thread: it is tried again after a pause, the event loop free meanwhile, until
 * `storage_timeout` (then a `StorageError` whose cause is a `StorageTimeout`: `scopedSqlite`);
 * writes hold the lock for a few statements only.
 *
 * Conditional writes are single statements with their condition in the WHERE clause, or
 * `BEGIN IMMEDIATE` transactions (`immediate`): atomic across processes. Expiry is judged by the
 * Effect `Clock` on every read (`expiry > now`), as on the other layers.
 */
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { type MessageKey, type Notification, sortkeyMs } from "../domain/notification.ts"
import type { UserRecord } from "../domain/user.ts"
import { STORAGE_TIMEOUT_MS } from "./dynamoRequests.ts"
import {
  CHANNEL_END,
  CHANNEL_PREFIX,
  channelSortKey,
  messageSortKey,
  nextFreeMs,
  type SaveOutcome,
  sortKeyMsOf,
  sortKeyOf,
  TIMESTAMP_END,
  timestampLowerBound,
  TOPIC_END,
  TOPIC_PREFIX,
  userFields
} from "./model.ts"
import { makeSqliteMaintenance } from "./sqliteMaintenance.ts"
import { sweepEvery } from "./sqlSweep.ts"
import { makeSqliteReceipts } from "./sqliteReceipts.ts"
import { deleteUserRows, scopedSqlite } from "./sqliteSchema.ts"
import {
  broadcastTableName,
  ident,
  MESSAGE_COLUMNS,
  messageFromRow,
  type MessageRow,
  messageValues,
  USER_COLUMNS,
  userFromRow,
  userRow,
  userValue
} from "./sqlTables.ts"
import { type AckedRow, Storage, type StorageError, type UserPatch } from "./Storage.ts"
import { type StorageOptions, tablesByClock } from "./tables.ts"

export interface SqliteOptions extends StorageOptions {
  /** The database file (`:memory:` for one connection's private database). */
  readonly path: string
  /** How long an operation may be retried while another process writes (ms; default `STORAGE_TIMEOUT_MS`). */
  readonly timeoutMs?: number | undefined
}

export const layerSqlite = (options: SqliteOptions): Layer.Layer<Storage, StorageError> =>
  Layer.effect(
    Storage,
    Effect.gen(function*() {
      const timeoutMs = options.timeoutMs ?? STORAGE_TIMEOUT_MS
      const { connection, run } = yield* scopedSqlite(options.path, timeoutMs)
      const { statement, immediate } = connection
      /** An operation that judges expiry: `now` is the caller's Clock (ms). */
      const atNow = <A>(operation: string, body: (now: number) => A) =>
        Effect.flatMap(Clock.currentTimeMillis, (now) => run(operation, () => body(now)))
      const router = ident(options.routerTable)

      // ── router table ──────────────────────────────────────────────────────────────────────────

      const getUser = (uaid: string) =>
        run("getUser", () => {
          const row = statement(`SELECT * FROM ${router} WHERE uaid = ?`).get(uaid)
          return row === undefined ? undefined : userFromRow(row)
        })

      const placeholders = Array.from({ length: USER_COLUMNS.length + 1 }, () => "?").join(", ")

      /** The whole record, unless one with a newer-or-equal `connected_at` is there. */
      const registerUser = (user: UserRecord) =>
        run("registerUser", () =>
          statement(
            `INSERT INTO ${router} (uaid, ${USER_COLUMNS.join(", ")}) VALUES (${placeholders})
             ON CONFLICT (uaid) DO UPDATE SET ${USER_COLUMNS.map((c) => `${c} = excluded.${c}`).join(", ")}
             WHERE connected_at < excluded.connected_at`
          ).run(...userRow(user)).changes > 0)

      const resumeUser = (user: UserRecord) =>
        run("resumeUser", () =>
          statement(`UPDATE ${router} SET ${USER_COLUMNS.map((c) => `${c} = ?`).join(", ")} WHERE uaid = ? AND connected_at < ?`)
            .run(...userRow(user).slice(1), user.uaid, user.connectedAt).changes > 0)

      const updateUser = (uaid: string, patch: UserPatch) =>
        run("updateUser", () => {
          const changed = userFields.filter(([field]) => field in patch)
          if (changed.length === 0) return statement(`SELECT 1 FROM ${router} WHERE uaid = ?`).get(uaid) !== undefined
          return statement(`UPDATE ${router} SET ${changed.map(([, c]) => `${c} = ?`).join(", ")} WHERE uaid = ?`)
            .run(...changed.map(([field]) => userValue(field, patch[field])), uaid).changes > 0
        })

      const dropUser = (uaid: string, drop?: { readonly ifConnectedAt?: number }) =>
        run("dropUser", () =>
          immediate(() => {
            const row = statement(`SELECT current_month, connected_at FROM ${router} WHERE uaid = ?`).get(uaid)
            if (row === undefined) return false
            if (drop?.ifConnectedAt !== undefined && row["connected_at"] !== drop.ifConnectedAt) return false
            statement(`DELETE FROM ${router} WHERE uaid = ?`).run(uaid)
            deleteUserRows(connection, options, uaid, row["current_month"] as string | null)
            return true
          }))

      const clearNodeId = (uaid: string, nodeId: string, connectedAt: number) =>
        run("clearNodeId", () =>
          statement(`UPDATE ${router} SET node_id = NULL WHERE uaid = ? AND node_id = ? AND connected_at = ?`)
            .run(uaid, nodeId, connectedAt).changes > 0)

      // ── broadcasts ────────────────────────────────────────────────────────────────────────────

      const broadcasts = ident(broadcastTableName(options))
      const getBroadcasts = run("getBroadcasts", () =>
        new Map(statement(`SELECT id, version FROM ${broadcasts}`).all().map((row) => [String(row["id"]), String(row["version"])])) as ReadonlyMap<
          string,
          string
        >)
      const putBroadcast = (id: string, version: string) =>
        run("putBroadcast", () => {
          statement(`INSERT INTO ${broadcasts} (id, version) VALUES (?, ?) ON CONFLICT (id) DO UPDATE SET version = excluded.version`).run(id, version)
        })
      const deleteBroadcast = (id: string) => run("deleteBroadcast", () => statement(`DELETE FROM ${broadcasts} WHERE id = ?`).run(id).changes > 0)

      // ── channels: one row per channel, `00:{chid}` ────────────────────────────────────────────

      /**
       * Add the channel's row unless the user has `maxChannels` others: the look, the count and the
       * insert in one transaction. The count is of the user's channel rows by their key range (an
       * index range: microseconds at thousands of channels).
       */
      const addChannel = (uaid: string, table: string, channelId: string, maxChannels?: number) =>
        run("addChannel", () => {
          const t = ident(table)
          return immediate(() => {
            if (statement(`SELECT 1 FROM ${t} WHERE uaid = ? AND chidmessageid = ?`).get(uaid, channelSortKey(channelId)) !== undefined) return true
            if (maxChannels !== undefined) {
              const row = statement(`SELECT COUNT(*) AS n FROM ${t} WHERE uaid = ? AND chidmessageid >= ? AND chidmessageid < ?`)
                .get(uaid, CHANNEL_PREFIX, CHANNEL_END)
              if (Number(row?.["n"] ?? 0) >= maxChannels) return false
            }
            statement(`INSERT INTO ${t} (uaid, chidmessageid) VALUES (?, ?)`).run(uaid, channelSortKey(channelId))
            return true
          })
        })

      const addChannels = (uaid: string, table: string, channelIds: Iterable<string>) =>
        run("addChannels", () => {
          const chids = Array.from(new Set(channelIds))
          if (chids.length === 0) return
          const insert = statement(`INSERT INTO ${ident(table)} (uaid, chidmessageid) VALUES (?, ?) ON CONFLICT DO NOTHING`)
          immediate(() => {
            for (const chid of chids) insert.run(uaid, channelSortKey(chid))
          })
        })

      const removeChannel = (uaid: string, table: string, channelId: string) =>
        run("removeChannel", () =>
          statement(`DELETE FROM ${ident(table)} WHERE uaid = ? AND chidmessageid = ?`).run(uaid, channelSortKey(channelId)).changes > 0)

      const getChannels = (uaid: string, table: string) =>
        run("getChannels", () =>
          new Set(
            statement(`SELECT chidmessageid FROM ${ident(table)} WHERE uaid = ? AND chidmessageid >= ? AND chidmessageid < ?`)
              .all(uaid, CHANNEL_PREFIX, CHANNEL_END)
              .map((row) => String(row["chidmessageid"]).slice(CHANNEL_PREFIX.length))
          ) as ReadonlySet<string>)

      const hasChannel = (uaid: string, table: string, channelId: string) =>
        run("hasChannel", () =>
          statement(`SELECT 1 FROM ${ident(table)} WHERE uaid = ? AND chidmessageid = ?`).get(uaid, channelSortKey(channelId)) !== undefined)

      // ── messages ──────────────────────────────────────────────────────────────────────────────

      const valuesList = MESSAGE_COLUMNS.split(", ").map(() => "?").join(", ")

      const updateAll = MESSAGE_COLUMNS.split(", ").slice(2).map((c) => `${c} = excluded.${c}`).join(", ")

      /**
       * One message: a timestamp message into a free sort key or over its own row (the same
       * `updateid`: a save retried after a lost answer stores it once), never over another
       * message; a topic message replaces the row unless that one was accepted later (its sort
       * ms, or its `timestamp` seconds for rows without one); none over its own tombstone.
       */
      const putMessage = (uaid: string, table: string, message: Notification): SaveOutcome => {
        const t = ident(table)
        const written = message.topic === undefined
          ? statement(
            `INSERT INTO ${t} (${MESSAGE_COLUMNS}) VALUES (${valuesList})
             ON CONFLICT (uaid, chidmessageid) DO UPDATE SET ${updateAll} WHERE updateid = excluded.updateid AND cancelled IS NULL`
          ).run(...messageValues(uaid, message)).changes > 0
          : statement(
            `INSERT INTO ${t} (${MESSAGE_COLUMNS}) VALUES (${valuesList})
             ON CONFLICT (uaid, chidmessageid) DO UPDATE SET ${updateAll}
             WHERE coalesce(sortkey_timestamp, timestamp * 1000) <= ? AND (cancelled IS NULL OR updateid IS NOT excluded.updateid)`
          ).run(...messageValues(uaid, message), sortkeyMs(message)).changes > 0
        if (written) return "stored"
        const tombstone = statement(`SELECT 1 FROM ${t} WHERE uaid = ? AND chidmessageid = ? AND updateid = ? AND cancelled IS NOT NULL`)
          .get(uaid, messageSortKey(message), message.version)
        return tombstone !== undefined ? "cancelled" : message.topic === undefined ? "taken" : "superseded"
      }

      const saveMessage = (uaid: string, table: string, message: Notification) =>
        run("saveMessage", () => putMessage(uaid, table, message))

      const saveMessages = (uaid: string, table: string, messages: ReadonlyArray<Notification>) =>
        run("saveMessages", () =>
          messages.length === 0 ? [] : immediate(() => {
            const saved: Array<Notification> = []
            for (const message of messages) {
              let placed = message
              let outcome = putMessage(uaid, table, placed)
              while (outcome === "taken") outcome = putMessage(uaid, table, placed = nextFreeMs(placed))
              if (outcome === "stored") saved.push(placed)
            }
            return saved
          }))

      const fetchTopicMessages = (uaid: string, table: string, limit: number) =>
        atNow("fetchTopicMessages", (now) =>
          statement(
            `SELECT * FROM ${ident(table)} WHERE uaid = ? AND chidmessageid > ? AND chidmessageid < ?
             AND (expiry IS NULL OR expiry > ?) AND cancelled IS NULL ORDER BY chidmessageid LIMIT ?`
          ).all(uaid, TOPIC_PREFIX, TOPIC_END, Math.floor(now / 1000), limit)
            .flatMap((row) => messageFromRow(row as unknown as MessageRow) ?? []))

      /** One page of message rows after `lo` up to the last timestamp row, `limit` rows at most (expired ones count). */
      /**
       * One page: `limit` readable rows (expired rows and tombstones are not counted: a page of
       * them ending among topic rows would leave the topic rows after it unread).
       */
      const messagePage = (operation: string, uaid: string, table: string, lo: string, limit: number) =>
        atNow(operation, (now) => {
          const rows = statement(
            `SELECT * FROM ${ident(table)} WHERE uaid = ? AND chidmessageid > ? AND chidmessageid < ?
             AND (expiry IS NULL OR expiry > ?) AND cancelled IS NULL ORDER BY chidmessageid LIMIT ?`
          ).all(uaid, lo, TIMESTAMP_END, Math.floor(now / 1000), limit) as unknown as ReadonlyArray<MessageRow>
          const last = rows.at(-1)
          return {
            messages: rows.flatMap((row) => messageFromRow(row) ?? []),
            lastSortKey: last === undefined ? undefined : sortKeyMsOf(last.chidmessageid),
            more: rows.length === limit
          }
        })

      const fetchMessages = (uaid: string, table: string, limit: number) => messagePage("fetchMessages", uaid, table, TOPIC_PREFIX, limit)

      const fetchTimestampMessages = (uaid: string, table: string, after: number | undefined, limit: number) =>
        messagePage("fetchTimestampMessages", uaid, table, timestampLowerBound(after), limit)

      const deleteMessage = (uaid: string, table: string, key: MessageKey, version?: string) =>
        run("deleteMessage", () =>
          version === undefined
            ? (statement(`DELETE FROM ${ident(table)} WHERE uaid = ? AND chidmessageid = ?`).run(uaid, sortKeyOf(key)), true)
            : statement(`DELETE FROM ${ident(table)} WHERE uaid = ? AND chidmessageid = ? AND updateid = ? AND cancelled IS NULL`)
              .run(uaid, sortKeyOf(key), version).changes > 0)

      /** The row becomes its tombstone if it holds the message of `version` (key, version and expiry kept). */
      const bury = (table: string) =>
        statement(
          `UPDATE ${ident(table)} SET cancelled = 1, data = NULL, headers = NULL
           WHERE uaid = ? AND chidmessageid = ? AND updateid = ? AND cancelled IS NULL`
        )

      const cancelMessage = (uaid: string, table: string, key: MessageKey, version: string) =>
        run("cancelMessage", () => bury(table).run(uaid, sortKeyOf(key), version).changes > 0)

      const ackMessages = (uaid: string, table: string, rows: ReadonlyArray<AckedRow>) =>
        run("ackMessages", () => {
          if (rows.length === 0) return
          const update = bury(table)
          immediate(() => {
            for (const { key, version } of rows) update.run(uaid, sortKeyOf(key), version)
          })
        })

      const maintenance = makeSqliteMaintenance(connection, run, options)
      yield* sweepEvery(maintenance.sweepExpired)

      return Storage.of({
        getUser,
        registerUser,
        resumeUser,
        updateUser,
        dropUser,
        clearNodeId,
        getBroadcasts,
        putBroadcast,
        deleteBroadcast,
        ...tablesByClock(options),
        addChannel,
        addChannels,
        removeChannel,
        getChannels,
        hasChannel,
        saveMessage,
        saveMessages,
        fetchTopicMessages,
        fetchMessages,
        fetchTimestampMessages,
        deleteMessage,
        ackMessages,
        cancelMessage,
        ...makeSqliteReceipts(connection, run, atNow, options),
        createTables: maintenance.createTables,
        checkTables: maintenance.checkTables,
        listMessageTables: maintenance.listMessageTables,
        dropMessageTable: maintenance.dropMessageTable,
        dropStaleUsers: maintenance.dropStaleUsers
      })
    })
  )
