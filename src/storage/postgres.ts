/**
 * Storage on PostgreSQL (`db_dsn`): the store of fleets without AWS, shared by every node. The
 * tables and rows of every SQL store (`sqlTables.ts`: one message table per month, as on SQLite
 * and DynamoDB); the pool, deadlines and errors `postgresPool.ts`; receipts
 * `postgresReceipts.ts`; tables, stale users and the sweep of expired rows
 * `postgresMaintenance.ts`.
 *
 * Conditional writes are single statements with their condition in the WHERE clause (`INSERT …
 * ON CONFLICT … DO UPDATE … WHERE`, `UPDATE … WHERE`, `DELETE … WHERE … RETURNING`), atomic
 * under PostgreSQL's default isolation as on SQLite and DynamoDB. The one write that reads before
 * it writes — a channel added under the per-user limit — holds a transaction-scoped advisory lock
 * on the user, so two nodes adding channels at once cannot both pass the limit. Expiry is judged
 * by the Effect `Clock` on every read (`expiry > now`), as on the other layers.
 */
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { type MessageKey, type Notification, sortkeyMs } from "../domain/notification.ts"
import type { UserRecord } from "../domain/user.ts"
import { STORAGE_TIMEOUT_MS, withOperationDeadlines } from "./dynamoRequests.ts"
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
import { deleteUserRows, makePostgresMaintenance } from "./postgresMaintenance.ts"
import { placeholders, POSTGRES_POOL_SIZE, type Query, scopedPostgres } from "./postgresPool.ts"
import { makePostgresReceipts } from "./postgresReceipts.ts"
import { sweepEvery } from "./sqlSweep.ts"
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

export interface PostgresOptions extends StorageOptions {
  /** `postgres://user:password@host:port/database` (libpq's URL form, with its query parameters: `sslmode`, …). */
  readonly dsn: string
  /** Connections of this process at most (default `POSTGRES_POOL_SIZE`). */
  readonly poolSize?: number | undefined
  /** Deadline of one operation, waiting for a connection included (ms; default `STORAGE_TIMEOUT_MS`). */
  readonly timeoutMs?: number | undefined
}

export const layerPostgres = (options: PostgresOptions): Layer.Layer<Storage, StorageError> =>
  Layer.effect(
    Storage,
    Effect.gen(function*() {
      const timeoutMs = options.timeoutMs ?? STORAGE_TIMEOUT_MS
      const connection = yield* scopedPostgres(options.dsn, { poolSize: options.poolSize ?? POSTGRES_POOL_SIZE, timeoutMs })
      const { run, transaction } = connection
      /** An operation that judges expiry: `now` is the caller's Clock (ms). */
      const atNow = <A>(operation: string, body: (query: Query, now: number) => Promise<A>) =>
        Effect.flatMap(Clock.currentTimeMillis, (now) => run(operation, (query) => body(query, now)))
      const router = ident(options.routerTable)

      // ── router table ──────────────────────────────────────────────────────────────────────────

      const getUser = (uaid: string) =>
        run("getUser", async (query) => {
          const { rows } = await query(`SELECT * FROM ${router} WHERE uaid = $1`, [uaid])
          return rows[0] === undefined ? undefined : userFromRow(rows[0])
        })

      /** The whole record, unless one with a newer-or-equal `connected_at` is there. */
      const registerUser = (user: UserRecord) =>
        run("registerUser", async (query) =>
          (await query(
            `INSERT INTO ${router} AS r (uaid, ${USER_COLUMNS.join(", ")}) VALUES (${placeholders(USER_COLUMNS.length + 1)})
             ON CONFLICT (uaid) DO UPDATE SET ${USER_COLUMNS.map((c) => `${c} = excluded.${c}`).join(", ")}
             WHERE r.connected_at < excluded.connected_at`,
            userRow(user)
          )).rowCount > 0)

      const resumeUser = (user: UserRecord) =>
        run("resumeUser", async (query) => {
          const n = USER_COLUMNS.length
          return (await query(
            `UPDATE ${router} SET ${USER_COLUMNS.map((c, i) => `${c} = $${i + 1}`).join(", ")} WHERE uaid = $${n + 1} AND connected_at < $${n + 2}`,
            [...userRow(user).slice(1), user.uaid, user.connectedAt]
          )).rowCount > 0
        })

      const updateUser = (uaid: string, patch: UserPatch) =>
        run("updateUser", async (query) => {
          const changed = userFields.filter(([field]) => field in patch)
          if (changed.length === 0) return (await query(`SELECT 1 FROM ${router} WHERE uaid = $1`, [uaid])).rows.length > 0
          return (await query(
            `UPDATE ${router} SET ${changed.map(([, c], i) => `${c} = $${i + 1}`).join(", ")} WHERE uaid = $${changed.length + 1}`,
            [...changed.map(([field]) => userValue(field, patch[field])), uaid]
          )).rowCount > 0
        })

      /** The record first (atomically, with its condition), then the user's rows in its current table. */
      const dropUser = (uaid: string, drop?: { readonly ifConnectedAt?: number }) =>
        run("dropUser", async (query) => {
          const { rows } = await query(
            `DELETE FROM ${router} WHERE uaid = $1 AND ($2::bigint IS NULL OR connected_at = $2) RETURNING current_month`,
            [uaid, drop?.ifConnectedAt ?? null]
          )
          if (rows[0] === undefined) return false
          await deleteUserRows(query, options, uaid, rows[0]["current_month"] as string | null)
          return true
        })

      const clearNodeId = (uaid: string, nodeId: string, connectedAt: number) =>
        run("clearNodeId", async (query) =>
          (await query(`UPDATE ${router} SET node_id = NULL WHERE uaid = $1 AND node_id = $2 AND connected_at = $3`, [uaid, nodeId, connectedAt]))
            .rowCount > 0)

      // ── broadcasts ────────────────────────────────────────────────────────────────────────────

      const broadcasts = ident(broadcastTableName(options))
      const getBroadcasts = run("getBroadcasts", async (query) =>
        new Map((await query(`SELECT id, version FROM ${broadcasts}`)).rows.map((row) => [String(row["id"]), String(row["version"])])) as ReadonlyMap<
          string,
          string
        >)
      const putBroadcast = (id: string, version: string) =>
        run("putBroadcast", async (query) => {
          await query(`INSERT INTO ${broadcasts} (id, version) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET version = excluded.version`, [id, version])
        })
      const deleteBroadcast = (id: string) =>
        run("deleteBroadcast", async (query) => (await query(`DELETE FROM ${broadcasts} WHERE id = $1`, [id])).rowCount > 0)

      // ── channels: one row per channel, `00:{chid}` ────────────────────────────────────────────

      /**
       * Add the channel's row unless the user has `maxChannels` others: the look, the count and the
       * insert in one transaction holding the user's advisory lock (the count is of the user's
       * channel rows by their key range: an index range).
       */
      const addChannel = (uaid: string, table: string, channelId: string, maxChannels?: number) =>
        run("addChannel", async (query) => {
          const t = ident(table)
          const key = channelSortKey(channelId)
          if (maxChannels === undefined) {
            await query(`INSERT INTO ${t} (uaid, chidmessageid) VALUES ($1, $2) ON CONFLICT DO NOTHING`, [uaid, key])
            return true
          }
          return transaction(query, async () => {
            await query(`SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, [`${table}\n${uaid}`])
            const { rows } = await query(
              `SELECT EXISTS (SELECT 1 FROM ${t} WHERE uaid = $1 AND chidmessageid = $2) AS present,
                      (SELECT COUNT(*) FROM ${t} WHERE uaid = $1 AND chidmessageid >= $3 AND chidmessageid < $4) AS n`,
              [uaid, key, CHANNEL_PREFIX, CHANNEL_END]
            )
            if (rows[0]?.["present"] === true) return true
            if (Number(rows[0]?.["n"] ?? 0) >= maxChannels) return false
            await query(`INSERT INTO ${t} (uaid, chidmessageid) VALUES ($1, $2) ON CONFLICT DO NOTHING`, [uaid, key])
            return true
          })
        })

      const addChannels = (uaid: string, table: string, channelIds: Iterable<string>) =>
        run("addChannels", async (query) => {
          const keys = Array.from(new Set(channelIds), channelSortKey)
          if (keys.length === 0) return
          await query(
            `INSERT INTO ${ident(table)} (uaid, chidmessageid) SELECT $1, key FROM unnest($2::text[]) AS key ON CONFLICT DO NOTHING`,
            [uaid, keys]
          )
        })

      const removeChannel = (uaid: string, table: string, channelId: string) =>
        run("removeChannel", async (query) =>
          (await query(`DELETE FROM ${ident(table)} WHERE uaid = $1 AND chidmessageid = $2`, [uaid, channelSortKey(channelId)])).rowCount > 0)

      const getChannels = (uaid: string, table: string) =>
        run("getChannels", async (query) =>
          new Set(
            (await query(`SELECT chidmessageid FROM ${ident(table)} WHERE uaid = $1 AND chidmessageid >= $2 AND chidmessageid < $3`, [
              uaid,
              CHANNEL_PREFIX,
              CHANNEL_END
            ])).rows.map((row) => String(row["chidmessageid"]).slice(CHANNEL_PREFIX.length))
          ) as ReadonlySet<string>)

      const hasChannel = (uaid: string, table: string, channelId: string) =>
        run("hasChannel", async (query) =>
          (await query(`SELECT 1 FROM ${ident(table)} WHERE uaid = $1 AND chidmessageid = $2`, [uaid, channelSortKey(channelId)])).rows.length > 0)

      // ── messages ──────────────────────────────────────────────────────────────────────────────

      const columns = MESSAGE_COLUMNS.split(", ")
      const updateAll = columns.slice(2).map((c) => `${c} = excluded.${c}`).join(", ")

      /**
       * One message: a timestamp message into a free sort key or over its own row (the same
       * `updateid`: a save retried after a lost answer stores it once), never over another
       * message; a topic message replaces the row unless that one was accepted later (its sort
       * ms, or its `timestamp` seconds for rows without one); none over its own tombstone.
       */
      const putMessage = async (query: Query, uaid: string, table: string, message: Notification): Promise<SaveOutcome> => {
        const insert = `INSERT INTO ${ident(table)} AS m (${MESSAGE_COLUMNS}) VALUES (${placeholders(columns.length)})
          ON CONFLICT (uaid, chidmessageid) DO UPDATE SET ${updateAll}`
        const written = message.topic === undefined
          ? (await query(`${insert} WHERE m.updateid = excluded.updateid AND m.cancelled IS NULL`, messageValues(uaid, message))).rowCount > 0
          : (await query(
            `${insert} WHERE coalesce(m.sortkey_timestamp, m.timestamp * 1000) <= $${columns.length + 1}
             AND (m.cancelled IS NULL OR m.updateid IS DISTINCT FROM excluded.updateid)`,
            [...messageValues(uaid, message), sortkeyMs(message)]
          )).rowCount > 0
        if (written) return "stored"
        const tombstone = await query(
          `SELECT 1 FROM ${ident(table)} WHERE uaid = $1 AND chidmessageid = $2 AND updateid = $3 AND cancelled IS NOT NULL`,
          [uaid, messageSortKey(message), message.version]
        )
        return tombstone.rows.length > 0 ? "cancelled" : message.topic === undefined ? "taken" : "superseded"
      }

      const saveMessage = (uaid: string, table: string, message: Notification) =>
        run("saveMessage", (query) => putMessage(query, uaid, table, message))

      const saveMessages = (uaid: string, table: string, messages: ReadonlyArray<Notification>) =>
        run("saveMessages", async (query) => {
          if (messages.length === 0) return []
          return transaction(query, async () => {
            const saved: Array<Notification> = []
            for (const message of messages) {
              let placed = message
              let outcome = await putMessage(query, uaid, table, placed)
              while (outcome === "taken") outcome = await putMessage(query, uaid, table, placed = nextFreeMs(placed))
              if (outcome === "stored") saved.push(placed)
            }
            return saved
          })
        })

      const fetchTopicMessages = (uaid: string, table: string, limit: number) =>
        atNow("fetchTopicMessages", async (query, now) =>
          (await query(
            `SELECT * FROM ${ident(table)} WHERE uaid = $1 AND chidmessageid > $2 AND chidmessageid < $3
             AND (expiry IS NULL OR expiry > $4) AND cancelled IS NULL ORDER BY chidmessageid LIMIT $5`,
            [uaid, TOPIC_PREFIX, TOPIC_END, Math.floor(now / 1000), limit]
          )).rows.flatMap((row) => messageFromRow(row as unknown as MessageRow) ?? []))

      /** One page of message rows after `lo` up to the last timestamp row, `limit` rows at most (expired ones count). */
      /**
       * One page: `limit` readable rows (expired rows and tombstones are not counted: a page of
       * them ending among topic rows would leave the topic rows after it unread).
       */
      const messagePage = (operation: string, uaid: string, table: string, lo: string, limit: number) =>
        atNow(operation, async (query, now) => {
          const rows = (await query(
            `SELECT * FROM ${ident(table)} WHERE uaid = $1 AND chidmessageid > $2 AND chidmessageid < $3
             AND (expiry IS NULL OR expiry > $4) AND cancelled IS NULL ORDER BY chidmessageid LIMIT $5`,
            [uaid, lo, TIMESTAMP_END, Math.floor(now / 1000), limit]
          )).rows as unknown as ReadonlyArray<MessageRow>
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
        run("deleteMessage", async (query) => {
          if (version === undefined) {
            await query(`DELETE FROM ${ident(table)} WHERE uaid = $1 AND chidmessageid = $2`, [uaid, sortKeyOf(key)])
            return true
          }
          return (await query(
            `DELETE FROM ${ident(table)} WHERE uaid = $1 AND chidmessageid = $2 AND updateid = $3 AND cancelled IS NULL`,
            [uaid, sortKeyOf(key), version]
          )).rowCount > 0
        })

      const cancelMessage = (uaid: string, table: string, key: MessageKey, version: string) =>
        run("cancelMessage", async (query) =>
          (await query(
            `UPDATE ${ident(table)} SET cancelled = 1, data = NULL, headers = NULL
             WHERE uaid = $1 AND chidmessageid = $2 AND updateid = $3 AND cancelled IS NULL`,
            [uaid, sortKeyOf(key), version]
          )).rowCount > 0)

      /** One statement: each row still holding its acked version becomes its tombstone. */
      const ackMessages = (uaid: string, table: string, rows: ReadonlyArray<AckedRow>) =>
        run("ackMessages", async (query) => {
          if (rows.length === 0) return
          await query(
            `UPDATE ${ident(table)} AS m SET cancelled = 1, data = NULL, headers = NULL
             FROM unnest($2::text[], $3::text[]) AS acked(chidmessageid, updateid)
             WHERE m.uaid = $1 AND m.chidmessageid = acked.chidmessageid AND m.updateid = acked.updateid AND m.cancelled IS NULL`,
            [uaid, rows.map((row) => sortKeyOf(row.key)), rows.map((row) => row.version)]
          )
        })

      const maintenance = makePostgresMaintenance(connection, options)
      yield* sweepEvery(maintenance.sweepExpired)

      return withOperationDeadlines(
        Storage.of({
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
          ...makePostgresReceipts(connection, atNow, options),
          createTables: maintenance.createTables,
          checkTables: maintenance.checkTables,
          listMessageTables: maintenance.listMessageTables,
          dropMessageTable: maintenance.dropMessageTable,
          dropStaleUsers: maintenance.dropStaleUsers
        }),
        timeoutMs
      )
    })
  )
