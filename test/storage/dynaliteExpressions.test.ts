/**
 * The embedded storage's memo of dynalite's expression parses: for the expressions the service
 * sends, with any values, a request validated through the memo carries the same parsed trees (and
 * the same refusal) as one parsed afresh by dynalite.
 */
import { createRequire } from "node:module"
import { assert, describe, it } from "@effect/vitest"
import { Schema } from "effect"
import { type Compare, memoizeExpressions, PARSED, type Validations } from "../../src/storage/dynalite/expressions.ts"

const fromDynalite = createRequire(createRequire(import.meta.url).resolve("dynalite"))
const dynalite = fromDynalite("./validations/index.js") as Validations
const { compare } = fromDynalite("./db/index.js") as { compare: Compare }

/** Each a request's expression fields, the values given as a function of the generated ones. */
const SHAPES: ReadonlyArray<(s: string, n: string) => Record<string, unknown>> = [
  () => ({ ConditionExpression: "attribute_not_exists(#chidmessageid)", ExpressionAttributeNames: { "#chidmessageid": "chidmessageid" } }),
  (_s, n) => ({
    ConditionExpression: "attribute_not_exists(#chidmessageid) OR #sortkey <= :ms OR (attribute_not_exists(#sortkey) AND #timestamp <= :seconds)",
    ExpressionAttributeNames: { "#chidmessageid": "chidmessageid", "#sortkey": "sortkey_timestamp", "#timestamp": "timestamp" },
    ExpressionAttributeValues: { ":ms": { N: n }, ":seconds": { N: n } }
  }),
  (s, n) => ({
    UpdateExpression: "SET #node_id = :node_id, #connected_at = :connected_at REMOVE #x",
    ConditionExpression: "attribute_exists(#uaid)",
    ExpressionAttributeNames: { "#uaid": "uaid", "#node_id": "node_id", "#connected_at": "connected_at", "#x": "x" },
    ExpressionAttributeValues: { ":node_id": { S: s }, ":connected_at": { N: n } }
  }),
  (s) => ({
    KeyConditionExpression: "#uaid = :uaid AND begins_with(#chidmessageid, :prefix)",
    ProjectionExpression: "#uaid, #chidmessageid",
    ExpressionAttributeNames: { "#uaid": "uaid", "#chidmessageid": "chidmessageid" },
    ExpressionAttributeValues: { ":uaid": { S: s }, ":prefix": { S: "01:" } }
  }),
  (s, n) => ({
    UpdateExpression: "ADD #count :one, #chids :chid",
    ConditionExpression: "attribute_not_exists(#count) OR #count < :max",
    ExpressionAttributeNames: { "#count": "count", "#chids": "chids" },
    ExpressionAttributeValues: { ":one": { N: "1" }, ":chid": { SS: [s] }, ":max": { N: n } }
  }),
  // BETWEEN's bounds are compared while parsing: either way round.
  (s) => ({
    KeyConditionExpression: "#uaid = :uaid AND #chidmessageid BETWEEN :lo AND :hi",
    ExpressionAttributeNames: { "#uaid": "uaid", "#chidmessageid": "chidmessageid" },
    ExpressionAttributeValues: { ":uaid": { S: "u" }, ":lo": { S: `02:${s}` }, ":hi": { S: "02:9" } }
  }),
  (_s, n) => ({
    ConditionExpression: "#a BETWEEN :low AND :high",
    ExpressionAttributeNames: { "#a": "a" },
    ExpressionAttributeValues: { ":low": { N: n }, ":high": { N: "5" } }
  }),
  // A type's name is read while parsing: never remembered.
  (s) => ({ ConditionExpression: "attribute_type(#a, :t)", ExpressionAttributeNames: { "#a": "a" }, ExpressionAttributeValues: { ":t": { S: s } } }),
  // Invalid: an unused value, a value that is no number.
  (s) => ({ ConditionExpression: "attribute_exists(#a)", ExpressionAttributeNames: { "#a": "a" }, ExpressionAttributeValues: { ":v": { S: s } } }),
  (_s, n) => ({ ConditionExpression: "#a < :v", ExpressionAttributeNames: { "#a": "a" }, ExpressionAttributeValues: { ":v": { N: n } } })
]

const parsedOf = (data: Record<string, unknown>) => Object.fromEntries(PARSED.map((field) => [field, JSON.stringify(data[field])]))

describe("dynalite's expression parses, remembered", () => {
  const memo: Validations = { validateExpressions: dynalite.validateExpressions, validateAttributeValue: dynalite.validateAttributeValue }
  memoizeExpressions(memo, compare)

  it.prop(
    "the same trees, with this request's values, as a fresh parse; the same refusals",
    // A number, or any string (often no number: refused).
    [Schema.String, Schema.Int, Schema.Boolean, Schema.String],
    ([s, int, numeric, text]) => {
      const n = numeric ? String(int) : text
      for (const shape of SHAPES) {
        // Twice: the first may fill the memo, the second is answered from it.
        for (let i = 0; i < 2; i++) {
          const fresh = shape(s, n)
          const remembered = shape(s, n)
          assert.strictEqual(memo.validateExpressions(remembered), dynalite.validateExpressions(fresh))
          assert.deepStrictEqual(parsedOf(remembered), parsedOf(fresh))
        }
      }
    },
    { arbitrary: { runs: 200 } }
  )

  it("holds this request's value objects, not an earlier one's", () => {
    const first = SHAPES[3]!("a", "1")
    const second = SHAPES[3]!("b", "1")
    assert.isUndefined(memo.validateExpressions(first))
    assert.isUndefined(memo.validateExpressions(second))
    const values = second["ExpressionAttributeValues"] as Record<string, unknown>
    assert.include(JSON.stringify(second["_keyCondition"]), '"S":"b"')
    assert.notInclude(JSON.stringify(second["_keyCondition"]), '"S":"a"')
    assert.isTrue(JSON.stringify(second["_keyCondition"]).includes(JSON.stringify(values[":uaid"])))
  })
})
