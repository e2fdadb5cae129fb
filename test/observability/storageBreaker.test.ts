/**
 * The storage breaker's metrics: `storage.breaker.open` 0, then 1 once unreachable failures opened
 * it, 0 again when a probe reached the store; `storage.breaker.opened` counts the openings.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { TestClock } from "effect/testing"
import { Metrics } from "../../src/observability/Metrics.ts"
import { storageBreaker } from "../../src/observability/storageBreaker.ts"
import { layerMemory } from "../../src/storage/memory/layer.ts"
import { StorageError, Unavailable } from "../../src/storage/failures.ts"
import { createActiveTables, mapStorageOperations, Storage } from "../../src/storage/Storage.ts"

/** In-memory storage that refuses every operation, as a dead server refuses connections, while `store.down`. */
const store = { down: false }
const refusing = Layer.effect(
  Storage,
  Storage.use((inner) => Effect.succeed(
    Storage.of(mapStorageOperations(inner, (operation) => (effect) =>
      Effect.suspend(() =>
        store.down
          ? Effect.fail(new StorageError({ operation, reason: new Unavailable(), cause: Object.assign(new Error("connect ECONNREFUSED"), { code: "ECONNREFUSED" }) })) as unknown as typeof effect
          : effect
      )))))
).pipe(Layer.provide(layerMemory({ routerTable: "router", messageTablePrefix: "message", noTableRotation: false })))

describe("storage breaker metrics", () => {
  it.effect("the gauge says when it is open, the counter how often it opened", () =>
    Effect.gen(function*() {
      const metrics = yield* Metrics
      const storage = yield* Storage
      yield* createActiveTables
      assert.strictEqual(metrics.value("storage.breaker.open"), 0)
      store.down = true
      for (let i = 0; i < 2; i++) yield* Effect.exit(storage.getUser("u"))
      assert.strictEqual(metrics.value("storage.breaker.open"), 1)
      assert.strictEqual(metrics.value("storage.breaker.opened"), 1)
      store.down = false
      yield* TestClock.adjust(1_000)
      yield* storage.getUser("u")
      assert.strictEqual(metrics.value("storage.breaker.open"), 0)
      assert.strictEqual(metrics.value("storage.breaker.opened"), 1)
    }).pipe(Effect.provide(storageBreaker({ threshold: 2, maxBackoffMs: 4_000 }).pipe(Layer.provideMerge(refusing), Layer.provideMerge(Metrics.layerMemory)))))
})
