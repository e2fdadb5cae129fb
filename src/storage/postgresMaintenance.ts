/**
 * The PostgreSQL store's tables themselves: create (idempotent, in one transaction holding an
 * advisory lock, so that nodes starting together do not race to make the same table), check,
 * list and drop message tables, drop users whose `last_connect` month is stale, and the sweep that
 * deletes expired rows — as on SQLite (`sqliteMaintenance.ts`, whose batch sizes, grace and
 * interval it shares): reads leave expired rows out whatever their age; the sweep only reclaims
 * their space, a day past their expiry, in small batches (each statement its own transaction).
 */
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import { type PostgresConnection, type Query, sqlState, UNDEFINED_TABLE } from "./postgresPool.ts"
import { STALE_BATCH, SWEEP_BATCH, SWEEP_GRACE_SECONDS } from "./sqlSweep.ts"
import { broadcastTableName, cancelledColumnSql, fixedTablesSql, ident, messageTableSql, POSTGRES } from "./sqlTables.ts"
import { StorageError, type TableStatus } from "./Storage.ts"
import {
  activeTableNames,
  isMessageTable,
  lastConnectKeys,
  messageTablesOf,
  receiptTableName,
  type StorageOptions,
  staleMonths
} from "./tables.ts"

/** The advisory lock every node takes to create tables (any number, the same on every node). */
const CREATE_TABLES_LOCK = 0x6175746f70757368n // "autopush"

/** Delete every row a user has in one message table (none when the table is missing or not ours). */
export const deleteUserRows = async (query: Query, options: StorageOptions, uaid: string, table: string | null | undefined): Promise<void> => {
  if (table === null || table === undefined || !isMessageTable(options, table)) return
  try {
    await query(`DELETE FROM ${ident(table)} WHERE uaid = $1`, [uaid])
  } catch (error) {
    if (sqlState(error) !== UNDEFINED_TABLE) throw error
  }
}

export const makePostgresMaintenance = ({ run, transaction }: PostgresConnection, options: StorageOptions) => {
  const router = ident(options.routerTable)

  const tableNames = async (query: Query): Promise<ReadonlySet<string>> =>
    new Set((await query("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")).rows.map((row) => String(row["tablename"])))

  const createTables = (messageTables: ReadonlyArray<string>) =>
    run("createTables", (query) =>
      transaction(query, async () => {
        await query("SELECT pg_advisory_xact_lock($1)", [CREATE_TABLES_LOCK.toString()])
        for (const sql of [...fixedTablesSql(options, POSTGRES), ...messageTables.flatMap((table) => messageTableSql(table, POSTGRES))]) await query(sql)
        // Message tables made before tombstones existed get their column.
        for (const table of messageTables) await query(cancelledColumnSql(table, POSTGRES))
      }))

  const checkTables = Effect.flatMap(Clock.currentTimeMillis, (now) =>
    run("checkTables", async (query) => {
      const names = await tableNames(query)
      const status = (table: string, ok: boolean): TableStatus => (ok ? { table, ok } : { table, ok, cause: "table not found" })
      return [
        status(options.routerTable, names.has(options.routerTable) && names.has(broadcastTableName(options))),
        status(receiptTableName(options), names.has(receiptTableName(options))),
        ...activeTableNames(options, now).map((table) => status(table, names.has(table)))
      ]
    }))

  const listMessageTables = run("listMessageTables", async (query) => messageTablesOf(options, await tableNames(query)))

  const dropMessageTable = (table: string) =>
    isMessageTable(options, table)
      ? run("dropMessageTable", async (query) => {
        await query(`DROP TABLE IF EXISTS ${ident(table)}`)
      })
      : Effect.fail(new StorageError({ operation: "dropMessageTable", cause: `not a message table: ${table}` }))

  /**
   * Drop users whose `last_connect` is one of the month range's index keys, a batch per
   * operation; a user is dropped only if its `last_connect` is still the value read.
   */
  const dropStaleUsers = Effect.fnUntraced(function*(args: {
    readonly monthsAgo: number
    readonly lookbackMonths: number
    readonly onProgress?: (dropped: number) => Effect.Effect<void>
    readonly dryRun?: boolean
  }) {
    const now = yield* Clock.currentTimeMillis
    const keys = staleMonths(now, args.monthsAgo, args.lookbackMonths).flatMap(lastConnectKeys)
    const stale = yield* run("dropStaleUsers", async (query) =>
      (await query(`SELECT uaid, last_connect FROM ${router} WHERE last_connect = ANY($1::bigint[])`, [keys])).rows)
    if (args.dryRun === true) return stale.length
    let dropped = 0
    for (let i = 0; i < stale.length; i += STALE_BATCH) {
      dropped += yield* run("dropStaleUsers", async (query) => {
        let n = 0
        for (const user of stale.slice(i, i + STALE_BATCH)) {
          const gone = (await query(`DELETE FROM ${router} WHERE uaid = $1 AND last_connect = $2 RETURNING current_month`, [
            user["uaid"],
            user["last_connect"]
          ])).rows[0]
          if (gone === undefined) continue
          await deleteUserRows(query, options, String(user["uaid"]), gone["current_month"] as string | null)
          n++
        }
        return n
      })
      if (args.onProgress !== undefined) yield* args.onProgress(dropped)
    }
    return dropped
  })

  /** Delete rows expired a day or more before `nowMs` from the message tables and the receipts; how many. */
  const sweepExpired = (nowMs: number) =>
    run("sweepExpired", async (query) => {
      const before = Math.floor(nowMs / 1000) - SWEEP_GRACE_SECONDS
      const names = await tableNames(query)
      const tables = [...messageTablesOf(options, names), ...(names.has(receiptTableName(options)) ? [receiptTableName(options)] : [])]
      let deleted = 0
      for (const table of tables) {
        for (let n = SWEEP_BATCH; n === SWEEP_BATCH;) {
          n = (await query(
            `DELETE FROM ${ident(table)} WHERE ctid IN (SELECT ctid FROM ${ident(table)} WHERE expiry <= $1 LIMIT ${SWEEP_BATCH})`,
            [before]
          )).rowCount
          deleted += n
        }
      }
      return deleted
    })

  return { createTables, checkTables, listMessageTables, dropMessageTable, dropStaleUsers, sweepExpired }
}
