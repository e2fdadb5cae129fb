/**
 * A node's sessions have at most SESSION_STORAGE_CONCURRENCY storage operations in flight; the rest
 * wait in the node and start, each with its own deadline, as earlier ones finish. Saves asked for in
 * one turn of the event loop go to the store together, each save counting as one in flight.
 */
import { assert, describe, it } from "@effect/vitest"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import { SESSION_STORAGE_CONCURRENCY, sessionStorage } from "../../src/connection/sessions.ts"
import { Invalid, StorageError, Timeout } from "../../src/storage/failures.ts"
import { mapStorageOperations, Storage } from "../../src/storage/Storage.ts"
import { layerMemory } from "../../src/storage/memory/layer.ts"

const memory = layerMemory({ routerTable: "router", messageTablePrefix: "message", noTableRotation: false })

/** The store, with its current message table made. */
const storeWithTable = Effect.gen(function*() {
  const store = yield* Storage
  const table = yield* store.currentMessageTable
  yield* store.createTables([table])
  return { store, table }
})

const message = (i: number) => ({ channelId: "c", version: `v${i}`, ttl: 60, timestamp: 1, sortkeyTimestamp: 1_000 + i })

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
    }).pipe(Effect.provide(memory)))

  it.effect("saves of one turn: one saveManyMessages of at most SESSION_STORAGE_CONCURRENCY (the saves in flight); a save alone, one saveMessages", () =>
    Effect.gen(function*() {
      const { store, table } = yield* storeWithTable
      const calls: Array<string> = []
      const counted = mapStorageOperations(store, (name) => (operation) => Effect.andThen(Effect.sync(() => calls.push(name)), operation), { values: false })
      const storage = yield* sessionStorage(counted)
      const storm = SESSION_STORAGE_CONCURRENCY + 10
      const saved = yield* Effect.forEach(
        Array.from({ length: storm }, (_, i) => i),
        (i) => storage.saveMessages(`uaid${i}`, table, [message(i)]),
        { concurrency: "unbounded" }
      )
      assert.deepStrictEqual(saved.map((one) => one.map((n) => n.version)), Array.from({ length: storm }, (_, i) => [`v${i}`]))
      assert.deepStrictEqual(calls, ["saveManyMessages", "saveManyMessages"])
      assert.deepStrictEqual((yield* store.fetchMessages(`uaid${storm - 1}`, table, 10)).messages.map((n) => n.version), [`v${storm - 1}`])
      calls.length = 0
      assert.deepStrictEqual((yield* storage.saveMessages("alone", table, [message(0)])).map((n) => n.version), ["v0"])
      assert.deepStrictEqual(calls, ["saveMessages"])
    }).pipe(Effect.provide(memory)))

  it.effect("a failed batch: each save made alone, so one that fails fails only itself", () =>
    Effect.gen(function*() {
      const { store, table } = yield* storeWithTable
      // The batch fails whenever it holds the bad user's save; that save alone fails too.
      const bad = "uaid-bad"
      const failing = mapStorageOperations(store, (name) => (operation) =>
        Effect.suspend(() => {
          const badSave = name === "saveManyMessages" || (name === "saveMessages" && calledFor.at(-1) === bad)
          return badSave ? Effect.fail(new StorageError({ operation: name, reason: new Invalid() })) as unknown as typeof operation : operation
        }), { values: false })
      const calledFor: Array<string> = []
      const storage = yield* sessionStorage({ ...failing, saveMessages: (uaid, t, messages) => Effect.suspend(() => (calledFor.push(uaid), failing.saveMessages(uaid, t, messages))) })
      const users = ["uaid0", bad, "uaid2"]
      const outcomes = yield* Effect.forEach(users, (uaid, i) => Effect.exit(storage.saveMessages(uaid, table, [message(i)])), { concurrency: "unbounded" })
      assert.deepStrictEqual(outcomes.map((exit) => exit._tag), ["Success", "Failure", "Success"])
      assert.deepStrictEqual((yield* store.fetchMessages("uaid2", table, 10)).messages.map((n) => n.version), ["v2"])
    }).pipe(Effect.provide(memory)))

  it.live("a storm of saves: at most SESSION_STORAGE_CONCURRENCY saves at the store at once, however they are gathered", () =>
    Effect.gen(function*() {
      const { store, table } = yield* storeWithTable
      let inFlight = 0
      let most = 0
      // A store that takes a while over each batch, counting the saves it holds.
      const counting = {
        ...store,
        saveManyMessages: (saves: Parameters<typeof store.saveManyMessages>[0]) =>
          Effect.suspend(() => {
            inFlight += saves.length
            most = Math.max(most, inFlight)
            return store.saveManyMessages(saves).pipe(Effect.delay("2 millis"), Effect.ensuring(Effect.sync(() => void (inFlight -= saves.length))))
          })
      }
      const storage = yield* sessionStorage(counting)
      const storm = 3 * SESSION_STORAGE_CONCURRENCY
      const saved = yield* Effect.forEach(
        Array.from({ length: storm }, (_, i) => i),
        (i) => storage.saveMessages(`uaid${i}`, table, [message(i)]),
        { concurrency: "unbounded" }
      )
      assert.strictEqual(saved.filter((one) => one.length === 1).length, storm)
      assert.isAtMost(most, SESSION_STORAGE_CONCURRENCY, "saves at the store at once")
    }).pipe(Effect.provide(memory)))

  it.effect("a batch the store did not answer in time: each of its saves fails with that, none is made alone", () =>
    Effect.gen(function*() {
      const { store, table } = yield* storeWithTable
      const alone: Array<string> = []
      const storage = yield* sessionStorage({
        ...store,
        saveManyMessages: () => Effect.fail(new StorageError({ operation: "saveManyMessages", reason: new Timeout({ timeoutMs: 5_000 }) })),
        saveMessages: (uaid, t, messages) => Effect.suspend(() => (alone.push(uaid), store.saveMessages(uaid, t, messages)))
      })
      const outcomes = yield* Effect.forEach([0, 1, 2], (i) => Effect.flip(storage.saveMessages(`uaid${i}`, table, [message(i)])), { concurrency: "unbounded" })
      assert.deepStrictEqual(outcomes.map((error) => error.reason._tag), ["Timeout", "Timeout", "Timeout"])
      assert.deepStrictEqual(alone, [])
    }).pipe(Effect.provide(memory)))
})
