/**
 * The in-memory store's tables themselves (`memoryRows.ts`): create, check, list and drop message
 * tables, and drop users whose `last_connect` month is stale, with their rows.
 */
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import { deleteUserRows, type MemoryStore, routerTable } from "./memoryRows.ts"
import { StorageError } from "./Storage.ts"
import { activeTableNames, isMessageTable, lastConnectKeys, messageTablesOf, receiptTableName, staleMonths } from "./tables.ts"

/** Users a stale-user sweep drops between two progress reports. */
const STALE_BATCH = 25

export const makeMemoryMaintenance = (store: MemoryStore) => {
  const { options, messageTables } = store

  const createTables = Effect.fnUntraced(function*(tables: ReadonlyArray<string>) {
    store.router ??= new Map()
    store.receipts ??= new Map()
    for (const table of tables) if (!messageTables.has(table)) messageTables.set(table, new Map())
  })

  const checkTables = Effect.gen(function*() {
    const active = activeTableNames(options, yield* Clock.currentTimeMillis)
    const status = (table: string, ok: boolean) => (ok ? { table, ok } : { table, ok, cause: "table not found" })
    return [
      status(options.routerTable, store.router !== undefined),
      status(receiptTableName(options), store.receipts !== undefined),
      ...active.map((t) => status(t, messageTables.has(t)))
    ]
  })

  const dropMessageTable = Effect.fnUntraced(function*(table: string) {
    if (!isMessageTable(options, table)) {
      return yield* new StorageError({ operation: "dropMessageTable", cause: `not a message table: ${table}` })
    }
    messageTables.delete(table)
  })

  const dropStaleUsers = Effect.fnUntraced(function*(args: {
    readonly monthsAgo: number
    readonly lookbackMonths: number
    readonly onProgress?: (dropped: number) => Effect.Effect<void>
    readonly dryRun?: boolean
  }) {
    const users = yield* routerTable(store, "dropStaleUsers")
    const now = yield* Clock.currentTimeMillis
    const keys = new Set(staleMonths(now, args.monthsAgo, args.lookbackMonths).flatMap(lastConnectKeys))
    const stale = Array.from(users.values()).filter((u) => u.lastConnect !== undefined && keys.has(u.lastConnect))
    if (args.dryRun === true) return stale.length
    let dropped = 0
    for (let i = 0; i < stale.length; i += STALE_BATCH) {
      for (const user of stale.slice(i, i + STALE_BATCH)) {
        deleteUserRows(store, user.uaid, user.currentMonth)
        users.delete(user.uaid)
        dropped++
      }
      if (args.onProgress !== undefined) yield* args.onProgress(dropped)
    }
    return dropped
  })

  return {
    createTables,
    checkTables,
    listMessageTables: Effect.sync(() => messageTablesOf(options, messageTables.keys())),
    dropMessageTable,
    dropStaleUsers
  }
}
