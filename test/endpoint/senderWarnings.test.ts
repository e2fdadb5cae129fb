/**
 * Sender diagnostics: a push another push service would refuse (Apple's answers 403 BadJwtToken to a
 * VAPID `sub` at localhost, a `.local` or `.invalid` domain, or without one; to a JWT valid for more
 * than 24 h; to the VAPID draft's scheme and to `aesgcm`) is accepted, and its answer says why in
 * `Autopush-Warning`; each is counted, and the console's status lists it per VAPID key.
 */
import { assert, describe, it, layer } from "@effect/vitest"
import { Effect } from "effect"
import { Metrics } from "../../src/observability/Metrics.ts"
import { SENDER_WARNING_TEXT, senderWarningHeader, senderWarnings, type VerifiedVapid } from "../../src/endpoint/vapid.ts"
import { endpointWith, FakeNodeClient, goodClaims, nowSeconds, options, push, request, subscribe, vapidKeys } from "./harness.ts"

const verified = (claims: Partial<VerifiedVapid["claims"]>, scheme: VerifiedVapid["scheme"] = "vapid"): VerifiedVapid => ({
  rawKey: Buffer.alloc(65, 4),
  claims: { exp: 2_000_000_000, aud: "https://push.test", ...claims },
  scheme
})

describe("senderWarnings", () => {
  it("a sub at localhost, a .local or an .invalid domain", () => {
    for (const sub of ["mailto:me@localhost", "mailto:ME@LOCALHOST", "mailto:me@box.localhost", "mailto:ops@printer.local", "mailto:ops@host.local.", "mailto:x@example.invalid", "mailto:nobody", "https://localhost:8443/contact", "https://app.local/"]) {
      assert.deepStrictEqual(senderWarnings(verified({ sub }), "aes128gcm"), ["vapid-sub-local"], sub)
    }
  })

  it("a sub that is a reachable contact is fine", () => {
    for (const sub of ["mailto:ops@example.com", "mailto:ops@localhost.example.com", "mailto:a@b.localized.org", "https://example.org/contact", "mailto:ops@example.com?subject=push"]) {
      assert.deepStrictEqual(senderWarnings(verified({ sub }), "aes128gcm"), [], sub)
    }
  })

  it("no sub, or one neither mailto: nor https:", () => {
    for (const sub of [undefined, null, 42, "", "ops@example.com", "http://example.org/"]) {
      assert.deepStrictEqual(senderWarnings(verified({ sub }), "aes128gcm"), ["vapid-sub-missing"], String(sub))
    }
  })

  it("a JWT valid for more than 24 h after its iat", () => {
    const exp = 2_000_000_000
    assert.deepStrictEqual(senderWarnings(verified({ sub: "mailto:a@example.com", exp, iat: exp - 86_401 }), "aes128gcm"), ["vapid-long-lived"])
    assert.deepStrictEqual(senderWarnings(verified({ sub: "mailto:a@example.com", exp, iat: exp - 86_400 }), "aes128gcm"), [])
    assert.deepStrictEqual(senderWarnings(verified({ sub: "mailto:a@example.com", exp, iat: "yesterday" }), "aes128gcm"), [], "an iat that is not a number is not read")
  })

  it("the VAPID draft's scheme and aesgcm, signed or not; several at once, in order", () => {
    assert.deepStrictEqual(senderWarnings(verified({ sub: "mailto:a@example.com" }, "webpush"), "aes128gcm"), ["vapid-draft-scheme"])
    assert.deepStrictEqual(senderWarnings(undefined, "aesgcm"), ["aesgcm"])
    assert.deepStrictEqual(senderWarnings(undefined, "aes128gcm"), [])
    assert.deepStrictEqual(senderWarnings(undefined, undefined), [])
    assert.deepStrictEqual(senderWarnings(verified({ sub: "mailto:me@localhost" }, "bearer"), "aesgcm"), ["vapid-sub-local", "vapid-draft-scheme", "aesgcm"])
  })

  it("the header: one quoted text per warning, none without warnings", () => {
    assert.isUndefined(senderWarningHeader([]))
    assert.strictEqual(senderWarningHeader(["aesgcm"]), `aesgcm "${SENDER_WARNING_TEXT.aesgcm}"`)
    for (const text of Object.values(SENDER_WARNING_TEXT)) assert.notMatch(text, /[",\r\n]/, "quotable, and no comma to split on")
    assert.match(senderWarningHeader(["vapid-sub-local", "aesgcm"])!, /^vapid-sub-local "[^"]+", aesgcm "[^"]+"$/)
  })
})

const consoleOptions = { websocketPort: 8080, endpointUrl: options.endpointUrl, maxDataBytes: 4096, version: "1.2.3-test", commit: "abc123" }

describe("Autopush-Warning on the wire", () => {
  layer(endpointWith(FakeNodeClient, { ...options, console: consoleOptions }), { excludeTestServices: true })((it) => {
    it.effect("a push signed with sub mailto:me@localhost is accepted (201) with the warning; counted; the console lists its key", () =>
      Effect.gen(function*() {
        const keys = yield* vapidKeys
        const sub = yield* subscribe({ key: keys.raw })
        const jwt = yield* Effect.promise(() => keys.sign({ ...goodClaims(), sub: "mailto:me@localhost" }))
        const reply = yield* push(sub, { authorization: `vapid t=${jwt}, k=${keys.publicKey}` })
        assert.strictEqual(reply.status, 201, reply.text)
        assert.strictEqual(reply.headers["autopush-warning"], `vapid-sub-local "${SENDER_WARNING_TEXT["vapid-sub-local"]}"`)
        const metrics = yield* Metrics
        const counted = metrics.snapshot().filter((s) => s.name === "notification.sender.warning" && s.tags["kind"] === "vapid-sub-local")
        assert.strictEqual(counted.reduce((n, s) => n + s.value, 0), 1)
        const status = (yield* request({ method: "GET", path: "/console/status.json" })).json()
        const listed = (status.senderWarnings as Array<{ vapidKey: string | null; warnings: Record<string, number> }>).find((s) => s.vapidKey === keys.publicKey)
        assert.deepStrictEqual(listed?.warnings, { "vapid-sub-local": 1 })
      }))

    it.effect("a push signed as the libraries do by default (a real contact, exp within 24 h) has no warning", () =>
      Effect.gen(function*() {
        const keys = yield* vapidKeys
        const sub = yield* subscribe({ key: keys.raw })
        const jwt = yield* Effect.promise(() => keys.sign({ ...goodClaims(), iat: nowSeconds() }))
        const reply = yield* push(sub, { authorization: `vapid t=${jwt}, k=${keys.publicKey}` })
        assert.strictEqual(reply.status, 201, reply.text)
        assert.isUndefined(reply.headers["autopush-warning"])
      }))

    it.effect("an unsigned aesgcm push is accepted with the aesgcm warning", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        const reply = yield* push(sub, { "crypto-key": "dh=BAAA", "content-encoding": "aesgcm", encryption: "salt=c2FsdA" }, "ciphertext")
        assert.strictEqual(reply.status, 201, reply.text)
        assert.match(String(reply.headers["autopush-warning"]), /^aesgcm "/)
      }))
  })
})
