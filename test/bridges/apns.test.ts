/**
 * The APNs bridge against a local HTTP/2 TLS provider API (fake-apns.ts): token auth (provider JWT
 * verified, renewed when APNs calls it expired) and certificate auth, the request APNs receives
 * (path, topic, priority, expiration, payload with the default or registered `aps`), one session
 * reused and a new one after GOAWAY or connection loss, and every error mapping.
 */
import { assert, describe, it, layer } from "@effect/vitest"
import { Effect, Layer, Redacted } from "effect"
import { APNS_PRODUCTION, APNS_SANDBOX, apnsHost, DEFAULT_APS } from "../../src/bridges/apns.ts"
import { Storage } from "../../src/storage/Storage.ts"
import { push } from "../endpoint/harness.ts"
import { FakeApns, KEY_ID, TEAM_ID } from "./fake-apns.ts"
import { bridgedEndpoint, call, errnoOf, pathOf, register } from "./harness.ts"

const BODY = Buffer.from("pretend-aes128gcm-ciphertext")

const TestApns = Layer.unwrap(
  Effect.map(Effect.service(FakeApns), (fake) =>
    bridgedEndpoint({
      apns: {
        channels: {
          firefox: { topic: "com.mozilla.org.firefox", sandbox: false, auth: { kind: "token", key: Redacted.make(fake.signingKey), keyId: KEY_ID, teamId: TEAM_ID } },
          certapp: { topic: "org.example.app", sandbox: true, auth: { kind: "certificate", cert: fake.clientCert, key: Redacted.make(fake.clientKey) } }
        },
        baseUrl: fake.url,
        ca: fake.ca,
        timeoutMs: 500
      }
    }))
).pipe(Layer.provideMerge(FakeApns.layer))

describe("APNs bridge", () => {
  layer(TestApns, { excludeTestServices: true })((it) => {
    it.effect("token auth: path, topic, priority, expiration and payload (default aps, data map, ver)", () =>
      Effect.gen(function*() {
        const fake = yield* FakeApns
        const reg = yield* register("apns", "firefox", { token: "device-token-1" })
        const reply = yield* push({ path: pathOf(reg.endpoint) }, { ttl: 120, "content-encoding": "aes128gcm" }, BODY)
        assert.strictEqual(reply.status, 201)
        const seen = fake.requests.at(-1)
        assert.strictEqual(seen?.auth, "token")
        assert.strictEqual(seen?.path, "/3/device/device-token-1")
        assert.strictEqual(seen?.headers["apns-topic"], "com.mozilla.org.firefox")
        assert.strictEqual(seen?.headers["apns-priority"], "10")
        assert.approximately(Number(seen?.headers["apns-expiration"]), Date.now() / 1000 + 120, 5)
        const version = (reply.headers["location"] ?? "").split("/m/")[1]
        assert.deepStrictEqual(seen?.body, {
          aps: DEFAULT_APS,
          chid: reg.channelID,
          body: BODY.toString("base64url"),
          con: "aes128gcm",
          ver: version
        })
        // Low urgency: power-saving priority 5.
        assert.strictEqual((yield* push({ path: pathOf(reg.endpoint) }, { urgency: "very-low" })).status, 201)
        assert.strictEqual(fake.requests.at(-1)?.headers["apns-priority"], "5")
      }))

    it.effect("certificate auth and a registered aps override; aps refusals", () =>
      Effect.gen(function*() {
        const fake = yield* FakeApns
        const aps = { alert: "Hello", "mutable-content": 1 }
        const reg = yield* register("apns", "certapp", { token: "device-token-2", aps: JSON.stringify(aps) })
        assert.strictEqual((yield* push({ path: pathOf(reg.endpoint) })).status, 201)
        const seen = fake.requests.at(-1)
        assert.strictEqual(seen?.auth, "certificate")
        assert.strictEqual(seen?.headers["apns-topic"], "org.example.app")
        assert.deepStrictEqual(seen?.body.aps, aps)

        assert.deepStrictEqual(errnoOf(yield* call("POST", "/v1/apns/certapp/registration", { token: "device-token-2", aps: "[1]" })), [400, null])
        assert.deepStrictEqual(errnoOf(yield* call("POST", "/v1/apns/certapp/registration", { token: "device-token-2", aps: { alert: "x".repeat(2000) } })), [400, null])
        assert.deepStrictEqual(errnoOf(yield* call("POST", "/v1/apns/nope/registration", { token: "device-token-2" })), [400, 106])
      }))

    it.effect("one session is reused; after GOAWAY or a dropped connection the next message opens another", () =>
      Effect.gen(function*() {
        const fake = yield* FakeApns
        const reg = yield* register("apns", "firefox", { token: "device-token-3" })
        assert.strictEqual((yield* push({ path: pathOf(reg.endpoint) })).status, 201)
        const sessions = fake.sessions()
        assert.strictEqual((yield* push({ path: pathOf(reg.endpoint) })).status, 201)
        assert.strictEqual(fake.sessions(), sessions, "reused")

        const goaway = yield* register("apns", "firefox", { token: "goaway-device" })
        assert.strictEqual((yield* push({ path: pathOf(goaway.endpoint) })).status, 201)
        yield* Effect.sleep("50 millis")
        assert.strictEqual((yield* push({ path: pathOf(reg.endpoint) })).status, 201)
        assert.strictEqual(fake.sessions(), sessions + 1, "new session after GOAWAY")

        fake.dropSessions()
        yield* Effect.sleep("50 millis")
        assert.strictEqual((yield* push({ path: pathOf(reg.endpoint) })).status, 201)
        assert.strictEqual(fake.sessions(), sessions + 2, "new session after connection loss")
      }))

    it.effect("ExpiredProviderToken → a new JWT, sent again (201)", () =>
      Effect.gen(function*() {
        const fake = yield* FakeApns
        const reg = yield* register("apns", "firefox", { token: "device-token-4" })
        fake.expireNextToken = true
        const before = fake.requests.length
        assert.strictEqual((yield* push({ path: pathOf(reg.endpoint) })).status, 201)
        assert.strictEqual(fake.requests.length, before + 1)
      }))

    it.effect("410 → user dropped, 410/106; 400 BadDeviceToken → 502; hang → 502/903", () =>
      Effect.gen(function*() {
        const gone = yield* register("apns", "firefox", { token: "gone-device" })
        const reply = yield* push({ path: pathOf(gone.endpoint) })
        assert.deepStrictEqual(errnoOf(reply), [410, 106])
        assert.strictEqual(reply.json().message, "APNS recipient no longer available")
        assert.isUndefined(yield* (yield* Storage).getUser(gone.uaid.replaceAll("-", "")))

        const bad = yield* register("apns", "firefox", { token: "bad-device" })
        const badReply = yield* push({ path: pathOf(bad.endpoint) })
        assert.deepStrictEqual(errnoOf(badReply), [502, null])
        assert.match(badReply.json().message, /BadDeviceToken/)

        const hang = yield* register("apns", "firefox", { token: "hang-device" })
        assert.deepStrictEqual(errnoOf(yield* push({ path: pathOf(hang.endpoint) })), [502, 903])
      }))

    it.effect("a payload that does not fit APNs' 4 KiB → 413/104", () =>
      Effect.gen(function*() {
        const reg = yield* register("apns", "firefox", { token: "device-token-5" })
        const reply = yield* push({ path: pathOf(reg.endpoint) }, { "content-encoding": "aes128gcm" }, Buffer.alloc(2900, 1))
        assert.deepStrictEqual(errnoOf(reply), [413, 104])
      }))
  })
})

describe("APNs hosts", () => {
  it("sandbox channels go to Apple's development host, others to production; base_url overrides both", () => {
    const channel = { topic: "t", auth: { kind: "certificate", cert: "", key: Redacted.make("") } } as const
    assert.strictEqual(apnsHost({ ...channel, sandbox: true }, undefined), APNS_SANDBOX)
    assert.strictEqual(apnsHost({ ...channel, sandbox: false }, undefined), APNS_PRODUCTION)
    assert.strictEqual(apnsHost({ ...channel, sandbox: true }, "https://proxy.example"), "https://proxy.example")
  })
})

describe("APNs bridge, unreachable", () => {
  layer(
    Layer.unwrap(Effect.map(Effect.service(FakeApns), (fake) =>
      bridgedEndpoint({
        apns: {
          channels: { firefox: { topic: "t", sandbox: false, auth: { kind: "certificate", cert: fake.clientCert, key: Redacted.make(fake.clientKey) } } },
          baseUrl: "https://127.0.0.1:9",
          timeoutMs: 500
        }
      }))).pipe(Layer.provideMerge(FakeApns.layer)),
    { excludeTestServices: true }
  )((it) => {
    it.effect("connection refused → 502/902", () =>
      Effect.gen(function*() {
        const reg = yield* register("apns", "firefox", { token: "device-token-6" })
        assert.deepStrictEqual(errnoOf(yield* push({ path: pathOf(reg.endpoint) })), [502, 902])
      }))
  })
})
