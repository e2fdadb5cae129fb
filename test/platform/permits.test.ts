import { assert, describe, it } from "@effect/vitest"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import { Permits } from "../../src/platform/permits.ts"

describe("Permits", () => {
  it.effect("runs at most its permits at once, the rest in order of arrival", () =>
    Effect.gen(function*() {
      const permits = new Permits(3)
      let running = 0
      let most = 0
      const started: Array<number> = []
      yield* Effect.forEach(Array.from({ length: 50 }, (_, i) => i), (i) =>
        permits.withPermit(Effect.gen(function*() {
          started.push(i)
          most = Math.max(most, ++running)
          yield* Effect.yieldNow
          yield* Effect.yieldNow
          running--
        })), { concurrency: "unbounded", discard: true })
      assert.strictEqual(most, 3)
      assert.deepStrictEqual(started, Array.from({ length: 50 }, (_, i) => i))
      assert.strictEqual(permits.waiting, 0)
    }))

  it.effect("gives the permit back when the effect fails", () =>
    Effect.gen(function*() {
      const permits = new Permits(1)
      const failed = yield* Effect.flip(permits.withPermit(Effect.fail("no")))
      assert.strictEqual(failed, "no")
      assert.strictEqual(yield* permits.withPermit(Effect.succeed(1)), 1)
    }))

  it.effect("100,000 waiters whose work is synchronous all run, none deeper in the stack than the first", () =>
    Effect.gen(function*() {
      const permits = new Permits(2)
      let done = 0
      yield* Effect.forEach(Array.from({ length: 100_000 }), () => permits.withPermit(Effect.sync(() => void done++)), {
        concurrency: "unbounded",
        discard: true
      })
      assert.strictEqual(done, 100_000)
    }))

  /** One permit, held until `release` (a gate); `b` and `c` wait for it in that order, each noting in `ran` that it ran. */
  const lineOfTwo = Effect.gen(function*() {
    const permits = new Permits(1)
    const ran: Array<string> = []
    const gate = yield* Deferred.make<void>()
    const holder = yield* Effect.forkChild(permits.withPermit(Deferred.await(gate)), { startImmediately: true })
    const b = yield* Effect.forkChild(permits.withPermit(Effect.sync(() => void ran.push("b"))), { startImmediately: true })
    const c = yield* Effect.forkChild(permits.withPermit(Effect.sync(() => void ran.push("c"))), { startImmediately: true })
    assert.strictEqual(permits.waiting, 2)
    const release = Deferred.succeed(gate, undefined)
    const ended = Effect.andThen(Fiber.join(holder), Fiber.join(c))
    return { permits, ran, b, release, ended }
  })

  it.effect("a waiter interrupted before its turn is skipped: the permit goes to the next", () =>
    Effect.gen(function*() {
      const { permits, ran, b, release, ended } = yield* lineOfTwo
      yield* Fiber.interrupt(b)
      yield* release
      yield* ended
      assert.deepStrictEqual(ran, ["c"])
      assert.strictEqual(permits.waiting, 0)
    }))

  // However the interrupt falls (before the permit is handed over, or after it was and before the
  // waiter ran), the waiter does not run after the next one and the permit is not lost.
  for (const turns of [0, 1, 2, 3, 5]) {
    it.effect(`an interrupted waiter leaves the line and loses no permit (interrupted ${turns} turns after the release)`, () =>
      Effect.gen(function*() {
        const { permits, ran, b, release, ended } = yield* lineOfTwo
        yield* release
        for (let i = 0; i < turns; i++) yield* Effect.yieldNow
        yield* Fiber.interrupt(b)
        yield* ended
        assert.isTrue(ran.includes("c"))
        assert.isTrue(ran.length === 1 || ran[0] === "b", `b ran after c: ${ran.join(",")}`)
        // The one permit is free again: taken and given back without waiting on anything.
        assert.strictEqual(yield* permits.withPermit(Effect.succeed("free")), "free")
        assert.strictEqual(permits.waiting, 0)
      }))
  }
})
