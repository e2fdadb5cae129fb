/**
 * The Storage service on an SQL database, whichever the store (`sqlite.ts`, `postgres.ts`): the
 * tables and rows of `sqlTables.ts`, the operations of `sqlUsers.ts` (router table, broadcasts,
 * channels), `sqlMessages.ts`, `sqlReceipts.ts` and `sqlMaintenance.ts`, run by the store's
 * driver (`sqlDriver.ts`); and the sweep of expired rows, every `SWEEP_INTERVAL` for as long as
 * the scope (`sqlSweep.ts`).
 */
import * as Effect from "effect/Effect"
import type * as Scope from "effect/Scope"
import type { SqlDriver } from "./sqlDriver.ts"
import { makeSqlMaintenance } from "./sqlMaintenance.ts"
import { makeSqlMessages } from "./sqlMessages.ts"
import { makeSqlReceipts } from "./sqlReceipts.ts"
import { sweepEvery } from "./sqlSweep.ts"
import { makeSqlUsers } from "./sqlUsers.ts"
import { Storage, type StorageService } from "./Storage.ts"
import { type StorageOptions, tablesByClock } from "./tables.ts"

export const makeSqlStorage = (driver: SqlDriver, options: StorageOptions): Effect.Effect<StorageService, never, Scope.Scope> =>
  Effect.gen(function*() {
    const { sweepExpired, ...maintenance } = makeSqlMaintenance(driver, options)
    yield* sweepEvery(sweepExpired)
    return Storage.of({
      ...makeSqlUsers(driver, options),
      ...tablesByClock(options),
      ...makeSqlMessages(driver),
      ...makeSqlReceipts(driver, options),
      ...maintenance
    })
  })
