/** The supervisor's restart backoff: a worker dying young waits 1 s, 2 s, 4 s … up to 30 s; one that lived a minute starts over. */
import { assert, describe, it } from "vitest"
import { restartDelayMs, restartsAfter } from "../../src/workers/supervisor.ts"

describe("worker restart backoff", () => {
  it("grows while a worker keeps dying young, capped at 30 s", () => {
    let restarts = 0
    const delays: Array<number> = []
    for (let i = 0; i < 8; i++) {
      restarts = restartsAfter(restarts, 500)
      delays.push(restartDelayMs(restarts))
    }
    assert.deepStrictEqual(delays, [1_000, 2_000, 4_000, 8_000, 16_000, 30_000, 30_000, 30_000])
  })

  it("starts over after a worker that lived a minute", () => {
    assert.strictEqual(restartsAfter(5, 60_000), 0)
    assert.strictEqual(restartDelayMs(restartsAfter(5, 60_000)), 1_000)
    assert.strictEqual(restartsAfter(5, 59_999), 6)
  })
})
