/**
 * The access-token cache the bridges share: fetched once, kept until `renewBefore` its expiry (by
 * the Clock), fetched again after that or once invalidated, one fetch for concurrent callers, and
 * a failed fetch not cached.
 */
import { assert, describe, it } from "@effect/vitest"
import { Clock, Effect, Fiber } from "effect"
import { TestClock } from "effect/testing"
import { makeTokenCache } from "../../src/bridges/token.ts"

const HOUR = 3_600_000

const counting = (options: { readonly failFirst?: boolean; readonly delayMs?: number } = {}) => {
  let fetches = 0
  const fetch = Effect.gen(function*() {
    fetches++
    if (options.delayMs !== undefined) yield* Effect.sleep(options.delayMs)
    if (options.failFirst === true && fetches === 1) return yield* Effect.fail("token endpoint down" as const)
    return { value: `token-${fetches}`, expiresAt: (yield* Clock.currentTimeMillis) + HOUR }
  })
  return { fetch, fetches: () => fetches }
}

describe("token cache", () => {
  it.effect("kept until 10 minutes before expiry (APNs: renewed at 50 minutes), then fetched again", () =>
    Effect.gen(function*() {
      const source = counting()
      const cache = makeTokenCache(source.fetch, 600_000)
      assert.strictEqual(yield* cache.get, "token-1")
      yield* TestClock.adjust("49 minutes")
      assert.strictEqual(yield* cache.get, "token-1")
      yield* TestClock.adjust("1 minute")
      assert.strictEqual(yield* cache.get, "token-2")
      assert.strictEqual(source.fetches(), 2)
    }))

  it.effect("invalidate drops only the token it names", () =>
    Effect.gen(function*() {
      const source = counting()
      const cache = makeTokenCache(source.fetch, 60_000)
      const first = yield* cache.get
      cache.invalidate("some-older-token")
      assert.strictEqual(yield* cache.get, first)
      cache.invalidate(first)
      assert.strictEqual(yield* cache.get, "token-2")
    }))

  it.effect("concurrent callers share one fetch; a failure is not kept", () =>
    Effect.gen(function*() {
      const slow = counting({ delayMs: 1000 })
      const cache = makeTokenCache(slow.fetch, 60_000)
      const fibers = yield* Effect.forEach([1, 2, 3], () => Effect.forkChild(cache.get))
      yield* TestClock.adjust("1 second")
      assert.deepStrictEqual(yield* Effect.forEach(fibers, Fiber.join), ["token-1", "token-1", "token-1"])
      assert.strictEqual(slow.fetches(), 1)

      const flaky = counting({ failFirst: true })
      const retrying = makeTokenCache(flaky.fetch, 60_000)
      assert.strictEqual(yield* Effect.flip(retrying.get), "token endpoint down")
      assert.strictEqual(yield* retrying.get, "token-2")
    }))
})
