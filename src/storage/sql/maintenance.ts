/**
 * The SQL stores' tables themselves, on either store's driver (`sql/driver.ts`): create
 * (idempotent, in one transaction, under the dialect's lock so that nodes starting together do not
 * race to make the same table), check, list and drop message tables, drop users whose
 * `last_connect` month is stale, and the sweep that deletes expired rows.
 *
 * Reads leave expired rows out whatever their age; the sweep deletes message rows once expired
 * (tombstones included: their expiry is their marker's end) so that their pages are reused within
 * minutes, and receipt rows a day past their expiry (as DynamoDB's TTL), in small batches, each
 * statement its own transaction and followed by a turn of the event loop: another process's writes
 * and this process's clients wait at most one batch (`sql/sweep.ts`: sizes, grace and interval).
 */
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import { CANCELLED } from "../model.ts"
import { jsonList } from "./dialect.ts"
import { sql, type Sql, type SqlDriver } from "./driver.ts"
import { SWEEP_BATCH, SWEEP_GRACE_SECONDS } from "./sweep.ts"
import { broadcastTableName, cancelledColumnSql, fixedTablesSql, ident, liveIndexSql, messageTableSql } from "./tables.ts"
import { deleteUserRows } from "./users.ts"
import { dropInBatches, staleKeys } from "../staleUsers.ts"
import { type StaleUserSweep, type StorageError, tableFound } from "../Storage.ts"
import { activeTableNames, messageTablesOf, onlyMessageTable, receiptTableName, type StorageOptions } from "../tables.ts"

/** A turn of the event loop: what waits for it (sockets, timers) runs first. */
const nextTurn = Effect.callback<void>((resume) => {
  const turn = setImmediate(() => resume(Effect.void))
  return Effect.sync(() => clearImmediate(turn))
})

export const makeSqlMaintenance = ({ dialect, one, run }: SqlDriver, options: StorageOptions) => {
  const router = ident(options.routerTable)

  function* tableNames(): Sql<ReadonlySet<string>> {
    return new Set((yield sql(dialect.tableNames)).rows.map((row) => String(row["name"])))
  }

  const createTables = (messageTables: ReadonlyArray<string>) =>
    run("createTables", function*() {
      for (const lock of dialect.lockTables) yield sql(lock)
      for (const statement of [...fixedTablesSql(options, dialect), ...messageTables.flatMap((table) => messageTableSql(table, dialect))]) {
        yield sql(statement)
      }
      // Message tables made before tombstones existed get their column, then every one its index of live rows.
      for (const table of messageTables) {
        const { rows } = yield sql(dialect.columnNames, table)
        if (!rows.some((row) => row["name"] === CANCELLED)) yield sql(cancelledColumnSql(table, dialect))
        for (const statement of liveIndexSql(table)) yield sql(statement)
      }
    }, true)

  const checkTables = Effect.flatMap(Clock.currentTimeMillis, (now) =>
    run("checkTables", function*() {
      const names = yield* tableNames()
      return [
        tableFound(options.routerTable, names.has(options.routerTable) && names.has(broadcastTableName(options))),
        tableFound(receiptTableName(options), names.has(receiptTableName(options))),
        ...activeTableNames(options, now).map((table) => tableFound(table, names.has(table)))
      ]
    }))

  const listMessageTables = run("listMessageTables", function*() {
    return messageTablesOf(options, yield* tableNames())
  })

  const dropMessageTable = (table: string) =>
    Effect.andThen(
      onlyMessageTable(options, table),
      run("dropMessageTable", function*() {
        yield sql(`DROP TABLE IF EXISTS ${ident(table)}`)
        for (const statement of dialect.afterDropTable) yield sql(statement)
      })
    )

  /**
   * Drop users whose `last_connect` is one of the month range's index keys, a batch per
   * transaction; a user is dropped only if its `last_connect` is still the value read.
   */
  const dropStaleUsers = (sweep: StaleUserSweep) =>
    Effect.flatMap(Clock.currentTimeMillis, (now) =>
      one(
        "dropStaleUsers",
        sql(`SELECT uaid, last_connect FROM ${router} WHERE last_connect ${dialect.inList(1, dialect.integer)}`, jsonList(staleKeys(now, sweep))),
        ({ rows }) => rows
      )).pipe(Effect.flatMap((stale) =>
        dropInBatches(stale, sweep, (batch) =>
          run("dropStaleUsers", function*() {
            let n = 0
            for (const user of batch) {
              const uaid = String(user["uaid"])
              const { rows } = yield sql(
                `DELETE FROM ${router} WHERE uaid = $1 AND last_connect = $2 RETURNING current_month`,
                uaid,
                Number(user["last_connect"])
              )
              if (rows[0] === undefined) continue
              yield* deleteUserRows(options, uaid, rows[0]["current_month"] as string | null)
              n++
            }
            return n
          }, true))
      ))

  /** Delete up to `SWEEP_BATCH` rows of `table` expired at `before` (seconds); how many. */
  const sweepBatch = (table: string, before: number) => {
    const t = ident(table)
    return one(
      "sweepExpired",
      sql(`DELETE FROM ${t} WHERE ${dialect.rowId} IN (SELECT ${dialect.rowId} FROM ${t} WHERE expiry <= $1 LIMIT ${SWEEP_BATCH})`, before),
      (result) => result.changes
    )
  }

  /** `table`'s expired rows, a batch per operation and a turn of the event loop between two (SQLite's statements run on its thread). */
  const sweepTable = (table: string, before: number, deleted = 0): Effect.Effect<number, StorageError> =>
    Effect.flatMap(sweepBatch(table, before), (n) => n < SWEEP_BATCH ? Effect.succeed(deleted + n) : Effect.andThen(nextTurn, sweepTable(table, before, deleted + n)))

  /** Delete message rows expired at `nowMs` and receipt rows expired a day or more before it; how many. */
  const sweepExpired = (nowMs: number) =>
    Effect.flatMap(run("sweepExpired", tableNames), (names) => {
      const now = Math.floor(nowMs / 1000)
      const tables: ReadonlyArray<readonly [string, number]> = [
        ...messageTablesOf(options, names).map((table) => [table, now] as const),
        ...(names.has(receiptTableName(options)) ? [[receiptTableName(options), now - SWEEP_GRACE_SECONDS] as const] : [])
      ]
      return Effect.map(Effect.forEach(tables, ([table, before]) => sweepTable(table, before)), (counts) => counts.reduce((sum, n) => sum + n, 0))
    })

  return { createTables, checkTables, listMessageTables, dropMessageTable, dropStaleUsers, sweepExpired }
}
