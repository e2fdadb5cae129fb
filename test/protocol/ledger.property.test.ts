/**
 * The ledger (what a session tracks per message) is a value: whatever versions are updated or read,
 * in whatever order, each reads as the Map it was made as — with its size, its count and its order of
 * first insertion — and updating the newest one does not grow with what it holds.
 */
import { assert, describe, it } from "@effect/vitest"
import { Arbitrary, Effect, Schema } from "effect"
import { Ledger } from "../../src/protocol/ledger.ts"

const KEYS = ["a", "b", "c", "d", "e"]

const Op = Schema.Struct({
  /** Which version to start from: an index into the versions made so far (taken modulo their number). */
  from: Schema.Int.check(Schema.isBetween({ minimum: 0, maximum: 1_000 })),
  op: Schema.Literals(["set", "delete", "read"]),
  key: Schema.Int.check(Schema.isBetween({ minimum: 0, maximum: KEYS.length - 1 })),
  value: Schema.Int.check(Schema.isBetween({ minimum: 0, maximum: 9 }))
})

const odd = (value: number): boolean => value % 2 === 1

/** The model: an immutable copy per version. */
const check = (ledger: Ledger<number>, model: ReadonlyMap<string, number>) => {
  assert.deepStrictEqual(ledger.values(), [...model.values()])
  assert.strictEqual(ledger.size, model.size)
  assert.strictEqual(ledger.counted, [...model.values()].filter(odd).length)
  for (const key of KEYS) {
    assert.strictEqual(ledger.get(key), model.get(key))
    assert.strictEqual(ledger.has(key), model.has(key))
  }
}

describe("Ledger", () => {
  it.effect.prop(
    "any version, updated or read in any order, reads as the Map it was made as",
    [Arbitrary.array(Arbitrary.schema(Op), { maxLength: 80 })],
    ([ops]) =>
      Effect.sync(() => {
        const versions: Array<[Ledger<number>, ReadonlyMap<string, number>]> = [[Ledger.empty(odd), new Map()]]
        for (const { from, op, key, value } of ops) {
          const [ledger, model] = versions[from % versions.length]!
          const k = KEYS[key]!
          if (op === "read") check(ledger, model)
          else if (op === "set") versions.push([ledger.set(k, value), new Map(model).set(k, value)])
          else {
            const without = new Map(model)
            without.delete(k)
            versions.push([ledger.delete(k), without])
          }
        }
        for (const [ledger, model] of versions) check(ledger, model)
        for (const [ledger, model] of versions.reverse()) check(ledger, model)
      }),
    { arbitrary: { runs: 500 } }
  )

  it("two owners starting from one empty ledger do not share their Map", () => {
    const empty = Ledger.empty<number>()
    const a = empty.set("a", 1)
    const b = empty.set("b", 2)
    assert.deepStrictEqual([a.values(), b.values(), empty.values()], [[1], [2], []])
  })

  it("updating the newest ledger costs the same with 100,000 entries as with 10", () => {
    const timeOf = (held: number) => {
      let ledger = Ledger.empty<number>()
      for (let i = 0; i < held; i++) ledger = ledger.set(`k${i}`, i)
      const started = performance.now()
      for (let i = 0; i < 10_000; i++) ledger = ledger.set(`n${i}`, i).delete(`n${i}`)
      return performance.now() - started
    }
    const small = timeOf(10)
    const large = timeOf(100_000)
    // Copying a Map of 100,000 entries 20,000 times would take minutes; O(1) updates take milliseconds either way.
    assert.isBelow(large, Math.max(500, small * 20), `${small.toFixed(1)} ms with 10 held, ${large.toFixed(1)} ms with 100,000`)
  })
})
