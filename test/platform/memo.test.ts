import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { memoize, RecentMap } from "../../src/platform/memo.ts"

describe("memoize", () => {
  it.effect("computes a key once while it is among the last `size` kept, then again", () =>
    Effect.sync(() => {
      const calls: Array<string> = []
      const upper = memoize(2, (key) => {
        calls.push(key)
        return key.toUpperCase()
      })
      assert.deepStrictEqual([upper("a"), upper("a"), upper("b"), upper("a")], ["A", "A", "B", "A"])
      assert.deepStrictEqual(calls, ["a", "b"])
      upper("c") // pushes out "a", the oldest
      assert.strictEqual(upper("b"), "B")
      assert.strictEqual(upper("a"), "A")
      assert.deepStrictEqual(calls, ["a", "b", "c", "a"])
    }))

  it.effect("results `keep` refuses are computed every time and push nothing out", () =>
    Effect.sync(() => {
      let calls = 0
      const parse = memoize(1, (key) => {
        calls++
        return key === "good" ? 1 : undefined
      }, (value) => value !== undefined)
      parse("good")
      for (let i = 0; i < 3; i++) assert.isUndefined(parse(`junk${i}`))
      assert.strictEqual(parse("good"), 1)
      assert.strictEqual(calls, 4)
    }))
})

describe("RecentMap", () => {
  it("keeps the last `capacity` keys set; delete forgets one now; iteration and size see what is kept", () => {
    const map = new RecentMap<number>(3)
    for (const [i, key] of ["a", "b", "c", "d"].entries()) map.set(key, i)
    assert.deepStrictEqual([...map], [["b", 1], ["c", 2], ["d", 3]])
    map.set("c", 20) // a key set again keeps its place
    map.delete("b")
    assert.isUndefined(map.get("b"))
    assert.strictEqual(map.size, 2)
    map.set("e", 4) // takes b's slot (b is gone already): c, d, e
    map.set("f", 5) // pushes out c, the oldest
    assert.deepStrictEqual([...map].map(([key]) => key), ["d", "e", "f"])
  })
})
