/**
 * Health and Dockerflow routes of the endpoint node (as autopush serves them): `/health` and
 * `/__heartbeat__` (version and storage checks; 503 when a table is not OK or the store fails, named
 * as configured with the error; the storage status is
 * read at most once per `TABLE_STATUS_TTL_MS` per process, so a flood of them costs the store
 * nothing more), `/__lbheartbeat__`,
 * `/__version__`, `/status`, `/__error__` (the operators' log check: an error log line, 418/999),
 * and `/metrics` (Prometheus text) when metrics are on.
 */
import * as Effect from "effect/Effect"
import * as HttpServerResponse from "effect/http/HttpServerResponse"
import { Bridges } from "../bridges/Bridges.ts"
import { LogCheck } from "../domain/errors.ts"
import { storageHealthCause, UNNAMED_STORAGE } from "../observability/storageHealth.ts"
import { Storage, type TableStatus } from "../storage/Storage.ts"
import { cachedTableStatus } from "../storage/tableKeeper.ts"
import type { EndpointOptions } from "./options.ts"

type CheckStatus = { readonly status: "OK" } | { readonly status: "NOT OK"; readonly cause: string }

const checkStatus = (statuses: ReadonlyArray<TableStatus>): CheckStatus => {
  const failed = statuses.find((s) => !s.ok)
  if (statuses.length === 0) return { status: "NOT OK", cause: "not checked" }
  return failed === undefined ? { status: "OK" } : { status: "NOT OK", cause: `${failed.table}: ${failed.cause ?? "unavailable"}` }
}

export interface HealthDocument {
  readonly status: "OK" | "ERROR"
  readonly version: string
  readonly worker?: number
  readonly router_table: CheckStatus
  readonly message_table: CheckStatus
  readonly routers: Readonly<Record<string, boolean>>
}

export const makeHealthHandlers = Effect.fnUntraced(function*(options: EndpointOptions) {
  const storage = yield* Storage
  const { platforms } = yield* Bridges
  const tableStatus = cachedTableStatus(storage, options.tableStatusTtlMs)
  const routers = { webpush: true, fcm: platforms.includes("fcm"), apns: platforms.includes("apns"), adm: platforms.includes("adm") }

  /**
   * Router table: every checked table that is not a message table; message table: the active ones
   * (last, this and next month's), so a table missing before its month begins is reported then.
   */
  const document = Effect.gen(function*() {
    const [statuses, active] = yield* Effect.all([tableStatus, storage.activeMessageTables])
    return {
      router_table: checkStatus(statuses.filter((s) => !active.includes(s.table))),
      message_table: checkStatus(statuses.filter((s) => active.includes(s.table)))
    }
  }).pipe(
    Effect.catchTag("StorageError", (error) => {
      const down: CheckStatus = { status: "NOT OK", cause: storageHealthCause(options.storageName ?? UNNAMED_STORAGE, error) }
      return Effect.succeed({ router_table: down, message_table: down })
    }),
    Effect.map((tables): HealthDocument => ({
      status: tables.router_table.status === "OK" && tables.message_table.status === "OK" ? "OK" : "ERROR",
      version: options.version,
      ...(options.worker === undefined ? {} : { worker: options.worker }),
      ...tables,
      routers
    }))
  )

  const health = Effect.map(document, (doc) => HttpServerResponse.jsonUnsafe(doc, { status: doc.status === "OK" ? 200 : 503 }))

  const status = Effect.succeed(HttpServerResponse.jsonUnsafe({ status: "OK", version: options.version }))

  const lbHeartbeat = Effect.succeed(HttpServerResponse.empty({ status: 200 }))

  const version = Effect.succeed(HttpServerResponse.jsonUnsafe({
    build: options.build?.build ?? "unknown",
    commit: options.build?.commit ?? "unknown",
    source: options.build?.source ?? "unknown",
    version: options.version
  }))

  const logCheck = Effect.logError("Test Critical Message").pipe(Effect.andThen(Effect.fail(new LogCheck())))

  return { health, status, lbHeartbeat, version, logCheck } as const
})
