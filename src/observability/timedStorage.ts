/**
 * Storage time: a `Storage` that times every operation of the one it wraps, as the timer
 * `storage.time{operation, outcome}` (ok | error). Operations that are plain values rather than
 * functions (`currentMessageTable`, `checkTables`, ...) are passed through untimed: most are answered
 * from memory. An interrupted operation counts as an error.
 *
 *     timedStorage.pipe(Layer.provide(storageLayer(settings)))   // needs Metrics
 */
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { mapStorageOperations, Storage, type StorageService } from "../storage/Storage.ts"
import { METRICS } from "./catalog.ts"
import { Metrics, type MetricsService } from "./Metrics.ts"

const timeStorage = (inner: StorageService, metrics: MetricsService): StorageService =>
  mapStorageOperations(inner, (name) => {
    const ok = metrics.timer(METRICS.storageTime.name, { operation: name, outcome: "ok" })
    const error = metrics.timer(METRICS.storageTime.name, { operation: name, outcome: "error" })
    return (operation) =>
      Effect.suspend(() => {
        const start = performance.now()
        return Effect.onExit(operation, (exit) =>
          Effect.sync(() => {
            if (exit._tag === "Success") ok.record(performance.now() - start)
            else error.record(performance.now() - start)
          }))
      })
  }, { values: false })

/** `Storage` timed, over the `Storage` it is given: `timedStorage.pipe(Layer.provide(storageLayer))`. */
export const timedStorage: Layer.Layer<Storage, never, Storage | Metrics> = Layer.effect(
  Storage,
  Effect.gen(function*() {
    return Storage.of(timeStorage(yield* Storage, yield* Metrics))
  })
)
