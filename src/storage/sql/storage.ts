/**
 * The Storage service on an SQL database, whichever the store (`sqlite/layer.ts`, `postgres/layer.ts`): the
 * tables and rows of `sql/tables.ts`, the operations of `sql/users.ts` (router table, broadcasts,
 * channels), `sql/messages.ts`, `sql/receipts.ts` and `sql/maintenance.ts`, run by the store's
 * driver (`sql/driver.ts`); and the sweep of expired rows, every `SWEEP_INTERVAL` for as long as
 * the scope (`sql/sweep.ts`).
 */
import * as Effect from "effect/Effect"
import type * as Scope from "effect/Scope"
import type { SqlDriver } from "./driver.ts"
import { makeSqlMaintenance } from "./maintenance.ts"
import { makeSqlMessages } from "./messages.ts"
import { makeSqlReceipts } from "./receipts.ts"
import { sweepEvery } from "./sweep.ts"
import { makeSqlUsers } from "./users.ts"
import { Storage, type StorageService } from "../Storage.ts"
import { type StorageOptions, tablesByClock } from "../tables.ts"

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
