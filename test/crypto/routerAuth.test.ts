/**
 * The router port's signatures: an HMAC-SHA256 under a key derived from the crypto key (never the
 * key itself), over the method, path, connected-at and body, the same whichever of its two
 * implementations (plain code for small requests, OpenSSL for large ones) computes it, and on
 * either side (a body signed as text is verified as bytes).
 */
import { assert, describe, it } from "@effect/vitest"
import { createHmac, hkdfSync, randomBytes } from "node:crypto"
import { Redacted } from "effect"
import { TEST_CRYPTO_KEY } from "../../src/crypto/endpoint.ts"
import { makeRouterAuth, routerKeyOf } from "../../src/crypto/routerAuth.ts"

const auth = makeRouterAuth({ keys: Redacted.make([TEST_CRYPTO_KEY]), acceptUnsigned: false })
const NOW = 1_764_000_000_000

describe("router port signatures", () => {
  it("the key is HKDF-SHA256 of the crypto key with its own label: not the crypto key, not its halves", () => {
    const raw = Buffer.from(TEST_CRYPTO_KEY, "base64url")
    const key = routerKeyOf(TEST_CRYPTO_KEY)
    assert.strictEqual(key.length, 32)
    assert.isTrue(key.equals(Buffer.from(hkdfSync("sha256", raw, Buffer.alloc(0), "autopush-ts router port v1", 32))))
    assert.isFalse(key.equals(raw))
    assert.notInclude(key.toString("hex"), raw.subarray(0, 16).toString("hex"))
    assert.notInclude(key.toString("hex"), raw.subarray(16).toString("hex"))
  })

  it("is the HMAC-SHA256 of v1, time, method, path, connected-at and body, at every size, text or bytes", () => {
    const key = routerKeyOf(TEST_CRYPTO_KEY)
    // Sizes on both sides of where the plain code hands over to OpenSSL, and unicode (bytes ≠ characters).
    for (const size of [0, 1, 63, 64, 200, 2_900, 3_000, 3_100, 5_000, 64 * 1024]) {
      for (const text of [randomBytes(size).toString("base64url").slice(0, size), "é".repeat(Math.floor(size / 2))]) {
        const header = auth.sign(NOW, "PUT", "/push/x", "17", text)
        const mac = /v1=(.+)$/.exec(header)?.[1]
        const expected = createHmac("sha256", key).update(`v1\n${NOW}\nPUT\n/push/x\n17\n`).update(text).digest("base64url")
        assert.strictEqual(mac, expected, `size ${size}`)
        assert.isUndefined(auth.verify(NOW, header, "PUT", "/push/x", "17", Buffer.from(text)), `size ${size}`)
      }
    }
  })

  it("refuses what is missing, malformed, outside ±60 s, or signed under another key; accepts unsigned only when told to", () => {
    const header = auth.sign(NOW, "PUT", "/notif/x", undefined, undefined)
    assert.isUndefined(auth.verify(NOW, header, "PUT", "/notif/x", undefined, undefined))
    assert.isUndefined(auth.verify(NOW + 60_000, header, "PUT", "/notif/x", undefined, undefined), "60 s late: still in the window")
    assert.strictEqual(auth.verify(NOW + 60_001, header, "PUT", "/notif/x", undefined, undefined), "stale")
    assert.strictEqual(auth.verify(NOW - 60_001, header, "PUT", "/notif/x", undefined, undefined), "stale")
    assert.strictEqual(auth.verify(NOW, undefined, "PUT", "/notif/x", undefined, undefined), "unsigned")
    assert.strictEqual(auth.precheck(NOW, undefined), "unsigned")
    for (const bad of ["", "t=,v1=", `${header},x`, header.replace("t=", "T="), header.slice(0, -1), `t=${"9".repeat(17)},v1=${"A".repeat(43)}`]) {
      assert.strictEqual(auth.verify(NOW, bad, "PUT", "/notif/x", undefined, undefined), "malformed", bad)
    }
    // One character of the MAC changed (the first: all six of its bits count).
    const forged = header.replace(/v1=(.)/, (_, c: string) => `v1=${c === "A" ? "B" : "A"}`)
    assert.strictEqual(auth.verify(NOW, forged, "PUT", "/notif/x", undefined, undefined), "bad_signature")
    const rollout = makeRouterAuth({ keys: Redacted.make([TEST_CRYPTO_KEY]), acceptUnsigned: true })
    assert.isUndefined(rollout.verify(NOW, undefined, "PUT", "/notif/x", undefined, undefined))
    assert.strictEqual(rollout.verify(NOW, header, "DELETE", "/notif/x", undefined, undefined), "bad_signature")
  })
})
