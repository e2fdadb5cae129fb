/**
 * The storage breaker (`storage/breaker.ts`) with its metrics: the gauge `storage.breaker.open`
 * (1 while open) and the counter `storage.breaker.opened`.
 *
 *     storageBreaker(options).pipe(Layer.provide(storageLayer(settings)))   // needs Metrics
 */
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { type BreakerOptions, withStorageBreaker } from "../storage/breaker.ts"
import { Storage } from "../storage/Storage.ts"
import { METRICS } from "./catalog.ts"
import { Metrics } from "./Metrics.ts"

/** `Storage` behind a breaker, over the `Storage` it is given. */
export const storageBreaker = (options: Omit<BreakerOptions, "onChange">): Layer.Layer<Storage, never, Storage | Metrics> =>
  Layer.effect(
    Storage,
    Effect.gen(function*() {
      const metrics = yield* Metrics
      const open = metrics.gauge(METRICS.storageBreakerOpen.name)
      const opened = metrics.counter(METRICS.storageBreakerOpened.name)
      open.set(0)
      const onChange = (isOpen: boolean) => {
        open.set(isOpen ? 1 : 0)
        if (isOpen) opened.inc()
      }
      return Storage.of(yield* withStorageBreaker(yield* Storage, { ...options, onChange }))
    })
  )
