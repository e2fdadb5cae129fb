/**
 * A node's sessions have at most SESSION_STORAGE_CONCURRENCY storage operations in flight; the rest
 * wait in the node and start, each with its own deadline, as earlier ones finish.
 */
import { assert, describe, it } from "@effect/vitest"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import { SESSION_STORAGE_CONCURRENCY, sessionStorage } from "../../src/connection/sessions.ts"
import { mapStorageOperations, Storage } from "../../src/storage/Storage.ts"
import { layerMemory } from "../../src/storage/memory/layer.ts"

describe("sessionStorage", () => {
  it.effect("a storm of reads: at most SESSION_STORAGE_CONCURRENCY reach the store at once, and all are answered", () =>
    Effect.gen(function*() {
      const store = yield* Storage
      yield* store.createTables([])
      const release = yield* Deferred.make<void>()
      let inFlight = 0
      let most = 0
      // A store that holds every operation until released, counting those it holds.
      const held = mapStorageOperations(store, () => (operation) =>
        Effect.suspend(() => {
          inFlight++
          most = Math.max(most, inFlight)
          return Deferred.await(release).pipe(Effect.andThen(operation), Effect.ensuring(Effect.sync(() => inFlight--)))
        }), { values: false })
      const storage = yield* sessionStorage(held)
      const storm = SESSION_STORAGE_CONCURRENCY + 72
      const reads = yield* Effect.forkChild(
        Effect.forEach(Array.from({ length: storm }, (_, i) => `uaid${i}`), (uaid) => storage.getUser(uaid), { concurrency: "unbounded" })
      )
      yield* Effect.yieldNow
      while (inFlight < SESSION_STORAGE_CONCURRENCY) yield* Effect.yieldNow
      yield* Effect.yieldNow
      assert.strictEqual(inFlight, SESSION_STORAGE_CONCURRENCY, "the rest wait in the node")
      yield* Deferred.succeed(release, undefined)
      const users = yield* Fiber.join(reads)
      assert.strictEqual(users.length, storm)
      assert.strictEqual(most, SESSION_STORAGE_CONCURRENCY)
    }).pipe(Effect.provide(layerMemory({ routerTable: "router", messageTablePrefix: "message", noTableRotation: false }))))
})
