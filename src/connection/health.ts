/**
 * What the health routes of both ports report: the store's tables (from the table keeper's cached
 * status), this worker's number, and the node's log lines for failed and rejected requests.
 */
import * as Effect from "effect/Effect"
import { storageHealthCause, UNNAMED_STORAGE } from "../observability/storageHealth.ts"
import type { StorageService } from "../storage/Storage.ts"
import { cachedTableStatus } from "../storage/tableKeeper.ts"
import type { NodeFibers } from "./fibers.ts"
import type { HealthSource } from "./http.ts"

export const healthSource = (
  storage: StorageService,
  fibers: NodeFibers,
  options: { readonly worker?: number | undefined; readonly storageName?: string | undefined }
): HealthSource => ({
  storageStatus: () =>
    fibers.runPromise(
      cachedTableStatus(storage).pipe(
        Effect.map((tables) => {
          const bad = tables.find((t) => !t.ok)
          return bad === undefined ? { ok: true } : { ok: false, cause: `${bad.table}: ${bad.cause ?? "unavailable"}` }
        }),
        Effect.catchTag("StorageError", (e) => Effect.succeed({ ok: false, cause: storageHealthCause(options.storageName ?? UNNAMED_STORAGE, e) }))
      )
    ),
  worker: options.worker,
  logError: (message, fields = {}) => void fibers.run(Effect.logError(message).pipe(Effect.annotateLogs(fields))),
  logRejected: (fields) => void fibers.run(Effect.logInfo("request rejected").pipe(Effect.annotateLogs(fields)))
})
