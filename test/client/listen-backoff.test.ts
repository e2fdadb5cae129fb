/** `push listen`'s reconnect pauses: doubling from 1 s to a 60 s cap, the second half of each random. */
import { assert, describe, it } from "vitest"
import { reconnectDelayMs } from "../../src/client/listen.ts"

describe("push listen: reconnect backoff", () => {
  it("doubles from 1 s up to 60 s: the lowest and highest pause of each attempt", () => {
    const lowest = Array.from({ length: 10 }, (_, failures) => reconnectDelayMs(failures, 0))
    const highest = Array.from({ length: 10 }, (_, failures) => reconnectDelayMs(failures, 0.999_999))
    assert.deepStrictEqual(lowest, [500, 1_000, 2_000, 4_000, 8_000, 16_000, 30_000, 30_000, 30_000, 30_000])
    assert.deepStrictEqual(highest, [1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 60_000, 60_000, 60_000, 60_000])
  })

  it("stays capped however long the server is away", () => {
    for (const failures of [20, 100, 10_000]) assert.isAtMost(reconnectDelayMs(failures, 0.999_999), 60_000)
  })

  it("is spread by its random part", () => {
    const pauses = new Set(Array.from({ length: 50 }, () => reconnectDelayMs(3, Math.random())))
    assert.isAbove(pauses.size, 10)
    for (const pause of pauses) {
      assert.isAtLeast(pause, 4_000)
      assert.isAtMost(pause, 8_000)
    }
  })
})
