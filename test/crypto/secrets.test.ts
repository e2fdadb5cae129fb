import { assert, describe, it } from "@effect/vitest"
import { Effect, Schema } from "effect"
import { constantTimeEqual, issueBridgeSecret, verifyBridgeSecret } from "../../src/crypto/secrets.ts"

const UAID = "deadbeef00000000decafbad00000000"
const HYPHENATED = "deadbeef-0000-0000-deca-fbad00000000"

describe("constantTimeEqual", () => {
  it.effect("compares strings and bytes by content, whatever the lengths", () =>
    Effect.sync(() => {
      assert.isTrue(constantTimeEqual("abc", "abc"))
      assert.isTrue(constantTimeEqual("", ""))
      assert.isTrue(constantTimeEqual(Buffer.from("abc"), "abc"))
      assert.isTrue(constantTimeEqual("é", Buffer.from([0xc3, 0xa9])))
      assert.isFalse(constantTimeEqual("abc", "abd"))
      assert.isFalse(constantTimeEqual("abc", "abcd"))
      assert.isFalse(constantTimeEqual("", "a"))
      assert.isFalse(constantTimeEqual(new Uint8Array([0]), new Uint8Array([0, 0])))
      // UTF-8 would map both lone surrogates to U+FFFD; two strings compare exactly.
      assert.isFalse(constantTimeEqual("\ud800", "\ud801"))
      assert.isFalse(constantTimeEqual("\ud800", "\ufffd"))
    }))

  it.effect.prop("agrees with ===", [Schema.String, Schema.String], ([a, b]) =>
    Effect.sync(() => {
      assert.strictEqual(constantTimeEqual(a, b), a === b)
      assert.isTrue(constantTimeEqual(a, a))
    }))
})

describe("bridge secrets", () => {
  it.effect("are hex HMAC-SHA256 keyed by the auth key's UTF-8 over the uaid in simple hex", () =>
    Effect.sync(() => {
      // Reference value from Python: hmac.new(b"INSERT_SECRET_KEY_HERE", uaid.encode(), sha256).hexdigest()
      const expected = "7ef23640b94326a12052f4792c3dec066ac13fdb4db042bfb552e048ef0beabb"
      assert.strictEqual(issueBridgeSecret(["INSERT_SECRET_KEY_HERE"], UAID), expected)
      assert.strictEqual(issueBridgeSecret(["INSERT_SECRET_KEY_HERE"], HYPHENATED), expected)
    }))

  it.effect("the first key issues, any key verifies", () =>
    Effect.sync(() => {
      const secret = issueBridgeSecret(["old"], UAID)
      assert.notStrictEqual(issueBridgeSecret(["new", "old"], UAID), secret)
      assert.strictEqual(issueBridgeSecret(["new", "old"], UAID), issueBridgeSecret(["new"], UAID))
      assert.isTrue(verifyBridgeSecret(["new", "old"], UAID, secret))
      assert.isTrue(verifyBridgeSecret(["new", "old"], HYPHENATED, secret))
      assert.isFalse(verifyBridgeSecret(["new"], UAID, secret))
      assert.isFalse(verifyBridgeSecret([], UAID, secret))
    }))

  it.effect("refuses another uaid's secret, a changed secret and a non-uuid uaid", () =>
    Effect.sync(() => {
      const secret = issueBridgeSecret(["k"], UAID)
      assert.isFalse(verifyBridgeSecret(["k"], "00000000000000000000000000000000", secret))
      assert.isFalse(verifyBridgeSecret(["k"], UAID, secret.toUpperCase()))
      assert.isFalse(verifyBridgeSecret(["k"], UAID, secret.slice(1)))
      assert.isFalse(verifyBridgeSecret(["k"], UAID, ""))
      assert.isFalse(verifyBridgeSecret(["k"], "not-a-uuid", secret))
      assert.throws(() => issueBridgeSecret(["k"], "not-a-uuid"))
    }))

  it.effect.prop(
    "issue then verify holds for random keys and uaids; a different key does not verify",
    [Schema.String.check(Schema.isMinLength(1)), Schema.String.check(Schema.isUUID())],
    ([key, uaid]) =>
      Effect.sync(() => {
        const secret = issueBridgeSecret([key], uaid)
        assert.match(secret, /^[0-9a-f]{64}$/)
        assert.isTrue(verifyBridgeSecret(["other", key], uaid, secret))
        assert.isFalse(verifyBridgeSecret([`${key}x`], uaid, secret))
      })
  )
})
