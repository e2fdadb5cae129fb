/**
 * Client frames as the session gets them. The ack, checked by hand on the push path, decodes as its
 * Schema struct would: the same message (known keys only) for the same frame, the same refusal for
 * every other one.
 */
import { assert, describe, it } from "@effect/vitest"
import { Arbitrary, Effect, Exit, Schema } from "effect"
import { decodeClientFrame } from "../../src/protocol/messages.ts"

/** The ack as a Schema struct: what the hand-written check must agree with. */
const Ack = Schema.Struct({
  updates: Schema.Array(Schema.Struct({ channelID: Schema.String, version: Schema.String, code: Schema.optionalKey(Schema.Number) }))
})
const decodeAck = Schema.decodeUnknownExit(Ack)

const Scalar = Schema.Union([Schema.String, Schema.Finite, Schema.Null, Schema.Boolean])
const field = Schema.optionalKey(Scalar)
/** Updates right and wrong: fields missing or of another type, extra keys, not objects at all. */
const Update = Schema.Union([
  Schema.Struct({ channelID: field, version: field, code: field, extra: field }),
  Schema.Struct({ channelID: Schema.String, version: Schema.String, code: Schema.optionalKey(Schema.Finite) }),
  Scalar,
  Schema.Array(Scalar)
])
/** Updates nearly right: each a string channel id and version, its code a number, missing, or null. */
const Near = Schema.Struct({
  channelID: Schema.String,
  version: Schema.String,
  code: Schema.optionalKey(Schema.Union([Schema.Finite, Schema.Null])),
  extra: field
})
const Frame = Schema.Struct({ updates: Schema.optionalKey(Schema.Union([Schema.Array(Near), Schema.Array(Update), Update])), other: field })

describe("client frames", () => {
  it.effect.prop(
    "an ack decodes as its Schema struct decodes it: the same message, or the same refusal",
    [Arbitrary.schema(Frame)],
    ([frame]) =>
      Effect.sync(() => {
        const text = JSON.stringify({ messageType: "ack", ...frame })
        const expected = decodeAck(JSON.parse(text))
        assert.deepStrictEqual(
          decodeClientFrame(text),
          Exit.isSuccess(expected)
            ? { ...expected.value, messageType: "ack" }
            : { _tag: "FrameError", reason: "bad-fields", detail: "invalid ack message" }
        )
      }),
    { arbitrary: { runs: 500 } }
  )

  it("an ack keeps its updates' known keys only, a code when it has one", () => {
    assert.deepStrictEqual(
      decodeClientFrame(JSON.stringify({
        messageType: "ack",
        extra: 1,
        updates: [{ channelID: "c", version: "v", code: 102, more: true }, { channelID: "d", version: "w" }]
      })),
      { updates: [{ channelID: "c", version: "v", code: 102 }, { channelID: "d", version: "w" }], messageType: "ack" }
    )
  })
})
