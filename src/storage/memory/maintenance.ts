/**
 * The in-memory store's tables themselves (`memory/rows.ts`): create, check, list and drop message
 * tables, and drop users whose `last_connect` month is stale, with their rows.
 */
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import { deleteUserRows, type MemoryStore, routerTable } from "./rows.ts"
import { dropInBatches, staleKeys } from "../staleUsers.ts"
import { type StaleUserSweep, tableFound } from "../Storage.ts"
import { activeTableNames, messageTablesOf, onlyMessageTable, receiptTableName } from "../tables.ts"

export const makeMemoryMaintenance = (store: MemoryStore) => {
  const { options, messageTables } = store

  const createTables = Effect.fnUntraced(function*(tables: ReadonlyArray<string>) {
    store.router ??= new Map()
    store.receipts ??= new Map()
    for (const table of tables) if (!messageTables.has(table)) messageTables.set(table, new Map())
  })

  const checkTables = Effect.gen(function*() {
    const active = activeTableNames(options, yield* Clock.currentTimeMillis)
    return [
      tableFound(options.routerTable, store.router !== undefined),
      tableFound(receiptTableName(options), store.receipts !== undefined),
      ...active.map((t) => tableFound(t, messageTables.has(t)))
    ]
  })

  const dropMessageTable = Effect.fnUntraced(function*(table: string) {
    yield* onlyMessageTable(options, table)
    messageTables.delete(table)
  })

  const dropStaleUsers = (sweep: StaleUserSweep) =>
    Effect.gen(function*() {
      const users = yield* routerTable(store, "dropStaleUsers")
      const keys = new Set(staleKeys(yield* Clock.currentTimeMillis, sweep))
      const stale = Array.from(users.values()).filter((u) => u.lastConnect !== undefined && keys.has(u.lastConnect))
      return yield* dropInBatches(stale, sweep, (batch) =>
        Effect.sync(() => {
          for (const user of batch) {
            deleteUserRows(store, user.uaid, user.currentMonth)
            users.delete(user.uaid)
          }
          return batch.length
        }))
    })

  return {
    createTables,
    checkTables,
    listMessageTables: Effect.sync(() => messageTablesOf(options, messageTables.keys())),
    dropMessageTable,
    dropStaleUsers
  }
}
