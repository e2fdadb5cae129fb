/**
 * The storage breaker's states, on the test clock, over an in-memory store that can be made
 * unreachable (every operation refused as a dead server refuses a connection) and that counts the
 * operations that reached it: closed → open after `threshold` unreachable failures in a row →
 * one probe after the back-off → closed when it is answered, open again for twice as long when not.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Fiber } from "effect"
import { TestClock } from "effect/testing"
import { unreachable, withStorageBreaker } from "../../src/storage/breaker.ts"
import { BreakerOpen, Conflict, Denied, DiskFull, MissingTable, StorageError, storageUnavailable, Throttled, Timeout, Unavailable } from "../../src/storage/failures.ts"
import { layerMemory } from "../../src/storage/memory/layer.ts"
import { createActiveTables, mapStorageOperations, Storage, type StorageService } from "../../src/storage/Storage.ts"

const refused = (operation: string) =>
  new StorageError({ operation, reason: new Unavailable(), cause: Object.assign(new Error("connect ECONNREFUSED 127.0.0.1:5432"), { code: "ECONNREFUSED" }) })

/** A store that can be taken down and brought back, with the number of operations that reached it. */
const flakyStore = Effect.gen(function*() {
  const inner = yield* Storage
  yield* createActiveTables
  const store = { down: false, reached: 0, delayMs: 0, failWith: refused }
  const storage: StorageService = mapStorageOperations(inner, (name) => (operation) =>
    Effect.suspend(() => {
      store.reached++
      const answer = store.down ? Effect.fail(store.failWith(name)) as unknown as typeof operation : operation
      return store.delayMs > 0 ? Effect.delay(answer, store.delayMs) : answer
    }))
  return { store, storage }
}).pipe(Effect.provide(layerMemory({ routerTable: "router", messageTablePrefix: "message", noTableRotation: false })))

const THRESHOLD = 3

const setup = Effect.gen(function*() {
  const { store, storage } = yield* flakyStore
  const changes: Array<boolean> = []
  const breaker = yield* withStorageBreaker(storage, { threshold: THRESHOLD, maxBackoffMs: 4_000, onChange: (open) => void changes.push(open) })
  return { store, breaker, changes }
})

const errorOf = <A>(exit: Exit.Exit<A, StorageError>): StorageError | undefined =>
  Exit.isFailure(exit) ? (exit.cause.reasons.find((r) => r._tag === "Fail") as { readonly error: StorageError } | undefined)?.error : undefined
const causeOf = <A>(exit: Exit.Exit<A, StorageError>): unknown => errorOf(exit)?.cause
const reasonOf = <A>(exit: Exit.Exit<A, StorageError>): unknown => errorOf(exit)?.reason

describe("storage breaker", () => {
  it.effect("opens after threshold unreachable failures in a row, then refuses without a request", () =>
    Effect.gen(function*() {
      const { store, breaker, changes } = yield* setup
      store.down = true
      for (let i = 0; i < THRESHOLD; i++) {
        const exit = yield* Effect.exit(breaker.getUser("u"))
        assert.strictEqual((causeOf(exit) as { code?: string }).code, "ECONNREFUSED")
      }
      assert.deepStrictEqual(changes, [true])
      const reached = store.reached
      for (let i = 0; i < 100; i++) assert.instanceOf(reasonOf(yield* Effect.exit(breaker.getUser("u"))), BreakerOpen)
      assert.strictEqual(store.reached, reached, "no request while open")
      // Answered from the clock: never refused.
      store.down = false
      assert.isAbove((yield* breaker.activeMessageTables).length, 0)
    }))

  it.effect("an answer of the store (an error of the operation too) resets the count", () =>
    Effect.gen(function*() {
      const { store, breaker, changes } = yield* setup
      const answeredError = (operation: string) => new StorageError({ operation, reason: new MissingTable({}) })
      for (let round = 0; round < 3; round++) {
        store.down = true
        store.failWith = refused
        for (let i = 0; i < THRESHOLD - 1; i++) yield* Effect.exit(breaker.getUser("u"))
        store.failWith = answeredError
        yield* Effect.exit(breaker.getUser("u"))
      }
      assert.deepStrictEqual(changes, [])
    }))

  it.effect("one probe after the back-off: answered, the breaker closes", () =>
    Effect.gen(function*() {
      const { store, breaker, changes } = yield* setup
      store.down = true
      for (let i = 0; i < THRESHOLD; i++) yield* Effect.exit(breaker.getUser("u"))
      store.down = false
      // The first back-off is 1 s, jittered down to no less than half of it.
      yield* TestClock.adjust(499)
      assert.instanceOf(reasonOf(yield* Effect.exit(breaker.getUser("u"))), BreakerOpen)
      yield* TestClock.adjust(501)
      const reached = store.reached
      assert.isTrue(Exit.isSuccess(yield* Effect.exit(breaker.getUser("u"))))
      assert.strictEqual(store.reached, reached + 1)
      assert.deepStrictEqual(changes, [true, false])
      assert.isTrue(Exit.isSuccess(yield* Effect.exit(breaker.getUser("u"))))
    }))

  it.effect("while the probe is out, the other operations are refused", () =>
    Effect.gen(function*() {
      const { store, breaker, changes } = yield* setup
      store.down = true
      for (let i = 0; i < THRESHOLD; i++) yield* Effect.exit(breaker.getUser("u"))
      store.down = false
      store.delayMs = 100
      yield* TestClock.adjust(1_000)
      const probe = yield* Effect.forkChild(Effect.exit(breaker.getUser("u")))
      yield* Effect.yieldNow
      const reached = store.reached
      const other = reasonOf(yield* Effect.exit(breaker.getUser("u")))
      assert.instanceOf(other, BreakerOpen)
      assert.strictEqual((other as BreakerOpen).retryAfterMs, 0)
      assert.strictEqual(store.reached, reached)
      yield* TestClock.adjust(100)
      assert.isTrue(Exit.isSuccess(yield* Fiber.join(probe)))
      assert.deepStrictEqual(changes, [true, false])
    }))

  it.effect("a failed probe opens it again for twice as long, up to the maximum", () =>
    Effect.gen(function*() {
      const { store, breaker, changes } = yield* setup
      store.down = true
      for (let i = 0; i < THRESHOLD; i++) yield* Effect.exit(breaker.getUser("u"))
      yield* TestClock.adjust(1_000)
      // Back-offs of 2, 4, 4 s (the maximum) after each failed probe, each jittered to half of it at least.
      for (const backoff of [2_000, 4_000, 4_000]) {
        const before = store.reached
        assert.strictEqual((causeOf(yield* Effect.exit(breaker.getUser("u"))) as { code?: string }).code, "ECONNREFUSED")
        assert.strictEqual(store.reached, before + 1)
        yield* TestClock.adjust(backoff / 2 - 1)
        assert.instanceOf(reasonOf(yield* Effect.exit(breaker.getUser("u"))), BreakerOpen, `refused within half of ${backoff} ms`)
        assert.strictEqual(store.reached, before + 1)
        yield* TestClock.adjust(backoff / 2 + 1)
      }
      store.down = false
      assert.isTrue(Exit.isSuccess(yield* Effect.exit(breaker.getUser("u"))))
      assert.deepStrictEqual(changes, [true, false])
    }))

  it.effect("refused operations answer 503 with Retry-After the seconds to the next probe, logged by no one", () =>
    Effect.gen(function*() {
      const error = yield* Effect.flip(storageUnavailable(new StorageError({ operation: "getUser", reason: new BreakerOpen({ retryAfterMs: 2_500, opened: "connect ECONNREFUSED" }) })))
      assert.strictEqual(error.retryAfter, 3)
      const probing = yield* Effect.flip(storageUnavailable(new StorageError({ operation: "getUser", reason: new BreakerOpen({ retryAfterMs: 0, opened: "connect ECONNREFUSED" }) })))
      assert.strictEqual(probing.retryAfter, 1)
    }))

  it.effect("threshold 0: no breaker", () =>
    Effect.gen(function*() {
      const { storage } = yield* flakyStore
      assert.strictEqual(yield* withStorageBreaker(storage, { threshold: 0, maxBackoffMs: 1_000 }), storage)
    }))

  it("counts what says the store cannot be reached, not what it answered", () => {
    const counted = (reason: StorageError["reason"]) => unreachable(new StorageError({ operation: "getUser", reason }))
    assert.isTrue(counted(new Timeout({ timeoutMs: 5_000 })))
    assert.isTrue(counted(new Unavailable()))
    for (const answered of [new MissingTable({}), new Conflict(), new Throttled(), new Denied(), new DiskFull({ database: "db" })]) {
      assert.isFalse(counted(answered), answered._tag)
    }
  })
})

