/**
 * The SQLite store's tables themselves: create (idempotent, in one transaction), check, list and
 * drop message tables (the file shrinks by what a dropped table held), drop users whose
 * `last_connect` month is stale, and the sweep that deletes expired rows.
 *
 * Reads leave expired rows out whatever their age; the sweep only reclaims their space. It runs
 * every `SWEEP_INTERVAL` (`sqlSweep.ts`) on the live clock, as DynamoDB's TTL deletes by real time, and deletes
 * rows a day past their expiry (as DynamoDB's TTL, not at the second), in small batches, each its
 * own short transaction: another process's writes wait at most one batch.
 */
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import { deleteUserRows, type RunSql, type SqliteConnection } from "./sqliteSchema.ts"
import { CANCELLED } from "./model.ts"
import { broadcastTableName, cancelledColumnSql, fixedTablesSql, ident, messageTableSql } from "./sqlTables.ts"
import { STALE_BATCH, SWEEP_BATCH, SWEEP_GRACE_SECONDS } from "./sqlSweep.ts"
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

export const makeSqliteMaintenance = (connection: SqliteConnection, run: RunSql, options: StorageOptions) => {
  const { db, statement, immediate } = connection
  const router = ident(options.routerTable)

  const tableNames = (): ReadonlySet<string> =>
    new Set(statement("SELECT name FROM sqlite_schema WHERE type = 'table'").all().map((row) => String(row["name"])))

  const createTables = (messageTables: ReadonlyArray<string>) =>
    run("createTables", () =>
      immediate(() => {
        for (const sql of [...fixedTablesSql(options), ...messageTables.flatMap((table) => messageTableSql(table))]) db.exec(sql)
        // Message tables made before tombstones existed get their column.
        for (const table of messageTables) {
          const columns = db.prepare(`PRAGMA table_info(${ident(table)})`).all()
          if (!columns.some((column) => column["name"] === CANCELLED)) db.exec(cancelledColumnSql(table))
        }
      }))

  const checkTables = Effect.flatMap(Clock.currentTimeMillis, (now) =>
    run("checkTables", () => {
      const names = tableNames()
      const status = (table: string, ok: boolean): TableStatus => (ok ? { table, ok } : { table, ok, cause: "table not found" })
      return [
        status(options.routerTable, names.has(options.routerTable) && names.has(broadcastTableName(options))),
        status(receiptTableName(options), names.has(receiptTableName(options))),
        ...activeTableNames(options, now).map((table) => status(table, names.has(table)))
      ]
    }))

  const listMessageTables = run("listMessageTables", () => messageTablesOf(options, tableNames()))

  const dropMessageTable = (table: string) =>
    isMessageTable(options, table)
      ? run("dropMessageTable", () => {
        db.exec(`DROP TABLE IF EXISTS ${ident(table)}`)
        db.exec("PRAGMA incremental_vacuum")
      })
      : Effect.fail(new StorageError({ operation: "dropMessageTable", cause: `not a message table: ${table}` }))

  /**
   * Drop users whose `last_connect` is one of the month range's index keys, a batch per
   * transaction; a user is dropped only if its `last_connect` is still the value read.
   */
  const dropStaleUsers = Effect.fnUntraced(function*(args: {
    readonly monthsAgo: number
    readonly lookbackMonths: number
    readonly onProgress?: (dropped: number) => Effect.Effect<void>
    readonly dryRun?: boolean
  }) {
    const now = yield* Clock.currentTimeMillis
    const keys = JSON.stringify(staleMonths(now, args.monthsAgo, args.lookbackMonths).flatMap(lastConnectKeys))
    const stale = yield* run("dropStaleUsers", () =>
      statement(`SELECT uaid, last_connect FROM ${router} WHERE last_connect IN (SELECT value FROM json_each(?))`).all(keys))
    if (args.dryRun === true) return stale.length
    let dropped = 0
    for (let i = 0; i < stale.length; i += STALE_BATCH) {
      dropped += yield* run("dropStaleUsers", () =>
        immediate(() => {
          let n = 0
          for (const user of stale.slice(i, i + STALE_BATCH)) {
            const gone = statement(`DELETE FROM ${router} WHERE uaid = ? AND last_connect = ? RETURNING current_month`)
              .get(user["uaid"] as string, user["last_connect"] as number)
            if (gone === undefined) continue
            deleteUserRows(connection, options, String(user["uaid"]), gone["current_month"] as string | null)
            n++
          }
          return n
        }))
      if (args.onProgress !== undefined) yield* args.onProgress(dropped)
    }
    return dropped
  })

  /** Delete rows expired a day or more before `nowMs` from the message tables and the receipts; how many. */
  const sweepExpired = (nowMs: number) =>
    run("sweepExpired", () => {
      const before = Math.floor(nowMs / 1000) - SWEEP_GRACE_SECONDS
      const names = tableNames()
      const tables = [...messageTablesOf(options, names), ...(names.has(receiptTableName(options)) ? [receiptTableName(options)] : [])]
      let deleted = 0
      for (const table of tables) {
        const sweep = statement(
          `DELETE FROM ${ident(table)} WHERE rowid IN (SELECT rowid FROM ${ident(table)} WHERE expiry <= ? LIMIT ${SWEEP_BATCH})`
        )
        for (let n = SWEEP_BATCH; n === SWEEP_BATCH;) {
          n = Number(sweep.run(before).changes)
          deleted += n
        }
      }
      return deleted
    })

  return { createTables, checkTables, listMessageTables, dropMessageTable, dropStaleUsers, sweepExpired }
}
