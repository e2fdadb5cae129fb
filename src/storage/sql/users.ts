/**
 * The SQL stores' users: the router table (`{router}`, one row per user: its router record), the
 * broadcast set (`{router}_broadcasts`, one row per broadcast id) and a user's channel rows in a
 * message table (`00:{chid}`, one per channel), on either store's driver (`sql/driver.ts`).
 *
 * Conditional writes are single statements with their condition in the WHERE clause (`INSERT …
 * ON CONFLICT … DO UPDATE … WHERE`, `UPDATE … WHERE`, `DELETE … WHERE … RETURNING`), atomic on
 * both stores as on DynamoDB. The one write that reads before it writes — a channel added under
 * the per-user limit — is a transaction holding the user's lock (`SqlDialect.lockUser`), so two
 * nodes adding channels at once cannot both pass the limit.
 */
import * as Effect from "effect/Effect"
import type { UserRecord } from "../../domain/user.ts"
import { CHANNEL_END, CHANNEL_PREFIX, channelSortKey, userFields } from "../model.ts"
import { jsonList } from "./dialect.ts"
import { assignments, changed, found, fromExcluded, nothing, placeholders, sql, type Sql, type SqlDriver } from "./driver.ts"
import { broadcastTableName, ident, USER_COLUMNS, userFromRow, userRow, userValue } from "./tables.ts"
import type { NodeSession, UserPatch } from "../Storage.ts"
import { isMessageTable, type StorageOptions } from "../tables.ts"

/** Delete every row a user has in one message table (none when the table is missing or not ours). */
export function* deleteUserRows(options: StorageOptions, uaid: string, table: string | null | undefined): Sql<void> {
  if (table === null || table === undefined || !isMessageTable(options, table)) return
  yield { ...sql(`DELETE FROM ${ident(table)} WHERE uaid = $1`, uaid), ifTableExists: true }
}

/** Records one `clearNodeIds` statement clears at most: its write lock is held a few ms. */
const CLEAR_BATCH = 500

export const makeSqlUsers = (driver: SqlDriver, options: StorageOptions) => ({
  ...makeSqlRouterRecords(driver, options),
  ...makeSqlBroadcasts(driver, options),
  ...makeSqlChannels(driver)
})

/** The router table: one row per user, its router record. */
const makeSqlRouterRecords = ({ dialect, one, run }: SqlDriver, options: StorageOptions) => {
  const router = ident(options.routerTable)

  const getUser = (uaid: string) =>
    one("getUser", sql(`SELECT * FROM ${router} WHERE uaid = $1`, uaid), ({ rows }) => rows[0] === undefined ? undefined : userFromRow(rows[0]))

  /** The whole record, unless one with a newer-or-equal `connected_at` is there. */
  const register = `INSERT INTO ${router} AS r (uaid, ${USER_COLUMNS.join(", ")}) VALUES (${placeholders(USER_COLUMNS.length + 1)})
    ON CONFLICT (uaid) DO UPDATE SET ${fromExcluded(USER_COLUMNS)} WHERE r.connected_at < excluded.connected_at`
  const registerUser = (user: UserRecord) => one("registerUser", sql(register, ...userRow(user)), changed)

  const n = USER_COLUMNS.length
  const resume = `UPDATE ${router} SET ${assignments(USER_COLUMNS)} WHERE uaid = $${n + 1} AND connected_at < $${n + 2}`
  const resumeUser = (user: UserRecord) => one("resumeUser", sql(resume, ...userRow(user).slice(1), user.uaid, user.connectedAt), changed)

  const updateUser = (uaid: string, patch: UserPatch) => {
    const fields = userFields.filter(([field]) => field in patch)
    if (fields.length === 0) return one("updateUser", sql(`SELECT 1 FROM ${router} WHERE uaid = $1`, uaid), found)
    return one(
      "updateUser",
      sql(
        `UPDATE ${router} SET ${assignments(fields.map(([, c]) => c))} WHERE uaid = $${fields.length + 1}`,
        ...fields.map(([field]) => userValue(field, patch[field])),
        uaid
      ),
      changed
    )
  }

  /** The record (with its condition), then the user's rows in its current table, in one transaction. */
  const dropUser = (uaid: string, drop?: { readonly ifConnectedAt?: number }) =>
    run("dropUser", function*() {
      const { rows } = yield sql(
        `DELETE FROM ${router} WHERE uaid = $1 AND (CAST($2 AS ${dialect.integer}) IS NULL OR connected_at = $2) RETURNING current_month`,
        uaid,
        drop?.ifConnectedAt ?? null
      )
      if (rows[0] === undefined) return false
      yield* deleteUserRows(options, uaid, rows[0]["current_month"] as string | null)
      return true
    }, true)

  const clearNodeId = (uaid: string, nodeId: string, connectedAt: number) =>
    one("clearNodeId", sql(`UPDATE ${router} SET node_id = NULL WHERE uaid = $1 AND node_id = $2 AND connected_at = $3`, uaid, nodeId, connectedAt), changed)
  /** One statement per `CLEAR_BATCH` sessions (records found by uaid, then matched on `connected_at`). */
  const clearBatch = `UPDATE ${router} SET node_id = NULL WHERE uaid ${dialect.inList(2)} AND node_id = $1
    AND (uaid, connected_at) IN (SELECT value->>0, CAST(value->>1 AS ${dialect.integer}) FROM ${dialect.tuples(3)})`
  const clearNodeIds = (nodeId: string, sessions: ReadonlyArray<NodeSession>) =>
    Effect.map(
      Effect.forEach(Array.from({ length: Math.ceil(sessions.length / CLEAR_BATCH) }, (_, i) => sessions.slice(i * CLEAR_BATCH, (i + 1) * CLEAR_BATCH)), (batch) =>
        one(
          "clearNodeIds",
          sql(clearBatch, nodeId, jsonList(batch.map((session) => session.uaid)), jsonList(batch.map((session) => [session.uaid, session.connectedAt]))),
          (result) => result.changes
        )),
      (counts) => counts.reduce((a, b) => a + b, 0)
    )

  return { getUser, registerUser, resumeUser, updateUser, dropUser, clearNodeId, clearNodeIds }
}

/** The broadcast set: `{router}_broadcasts`, one row per broadcast id. */
const makeSqlBroadcasts = ({ one }: SqlDriver, options: StorageOptions) => {
  const broadcasts = ident(broadcastTableName(options))

  const getBroadcasts = one(
    "getBroadcasts",
    sql(`SELECT id, version FROM ${broadcasts}`),
    ({ rows }) => new Map(rows.map((row) => [String(row["id"]), String(row["version"])])) as ReadonlyMap<string, string>
  )
  const putBroadcast = (id: string, version: string) =>
    one("putBroadcast", sql(`INSERT INTO ${broadcasts} (id, version) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET version = excluded.version`, id, version), nothing)
  const deleteBroadcast = (id: string) => one("deleteBroadcast", sql(`DELETE FROM ${broadcasts} WHERE id = $1`, id), changed)

  return { getBroadcasts, putBroadcast, deleteBroadcast }
}

/** A user's channel set in a message table: one row per channel, `00:{chid}`. */
const makeSqlChannels = ({ dialect, one, run }: SqlDriver) => {
  /**
   * Add the channel's row unless the user has `maxChannels` others: the look, the count (of the
   * user's channel rows by their key range: an index range) and the insert in one transaction.
   */
  const addChannel = (uaid: string, table: string, channelId: string, maxChannels?: number) =>
    run("addChannel", function*() {
      const t = ident(table)
      const key = channelSortKey(channelId)
      if (maxChannels !== undefined) {
        for (const lock of dialect.lockUser) yield sql(lock, `${table}\n${uaid}`)
        const { rows } = yield sql(
          `SELECT (SELECT COUNT(*) FROM ${t} WHERE uaid = $1 AND chidmessageid = $2) AS present,
                  (SELECT COUNT(*) FROM ${t} WHERE uaid = $1 AND chidmessageid >= $3 AND chidmessageid < $4) AS n`,
          uaid,
          key,
          CHANNEL_PREFIX,
          CHANNEL_END
        )
        if (Number(rows[0]?.["present"] ?? 0) > 0) return true
        if (Number(rows[0]?.["n"] ?? 0) >= maxChannels) return false
      }
      yield sql(`INSERT INTO ${t} (uaid, chidmessageid) VALUES ($1, $2) ON CONFLICT DO NOTHING`, uaid, key)
      return true
    }, maxChannels !== undefined)

  const addChannels = (uaid: string, table: string, channelIds: Iterable<string>) => {
    const keys = Array.from(new Set(channelIds), channelSortKey)
    if (keys.length === 0) return Effect.void
    // `WHERE true`: SQLite's parser needs it between an INSERT's SELECT and its ON CONFLICT.
    return one(
      "addChannels",
      sql(
        `INSERT INTO ${ident(table)} (uaid, chidmessageid) SELECT $1, value FROM ${dialect.scalars(2)} WHERE true ON CONFLICT DO NOTHING`,
        uaid,
        jsonList(keys)
      ),
      nothing
    )
  }

  const removeChannel = (uaid: string, table: string, channelId: string) =>
    one("removeChannel", sql(`DELETE FROM ${ident(table)} WHERE uaid = $1 AND chidmessageid = $2`, uaid, channelSortKey(channelId)), changed)

  const getChannels = (uaid: string, table: string) =>
    one(
      "getChannels",
      sql(`SELECT chidmessageid FROM ${ident(table)} WHERE uaid = $1 AND chidmessageid >= $2 AND chidmessageid < $3`, uaid, CHANNEL_PREFIX, CHANNEL_END),
      ({ rows }) => new Set(rows.map((row) => String(row["chidmessageid"]).slice(CHANNEL_PREFIX.length))) as ReadonlySet<string>
    )

  const hasChannel = (uaid: string, table: string, channelId: string) =>
    one("hasChannel", sql(`SELECT 1 FROM ${ident(table)} WHERE uaid = $1 AND chidmessageid = $2`, uaid, channelSortKey(channelId)), found)

  return { addChannel, addChannels, removeChannel, getChannels, hasChannel }
}
