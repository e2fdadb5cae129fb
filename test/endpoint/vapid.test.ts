/**
 * VAPID that must be accepted, with real keys: tokens signed by `jose` in every scheme and key
 * spelling the endpoint takes, and complete requests made by the `web-push` library
 * (`getVapidHeaders`, `generateRequestDetails` with aes128gcm and aesgcm payloads) to v1 and v2
 * endpoints. The node is a fake answering 200, so what reached it is checked too.
 */
import { createECDH, randomBytes } from "node:crypto"
import { assert, describe, layer } from "@effect/vitest"
import { Effect } from "effect"
import webpush, { type RequestDetails } from "web-push"
import { TEST_ENDPOINT_URL } from "../../src/crypto/endpoint.ts"
import {
  endpointWith,
  fakeNode,
  FakeNodeClient,
  goodClaims,
  nodeCalls,
  nowSeconds,
  options,
  push,
  request,
  subscribe,
  type Subscription,
  TestEndpoint,
  vapidKeys
} from "./harness.ts"

const ORIGIN = new URL(TEST_ENDPOINT_URL).origin

/** A browser-side subscription: the receiver's ECDH key and auth secret. */
const browserKeys = () => {
  const ecdh = createECDH("prime256v1")
  ecdh.generateKeys()
  return { p256dh: ecdh.getPublicKey().toString("base64url"), auth: randomBytes(16).toString("base64url") }
}

/** Send what `web-push` built for this subscription to the server under test. */
const sendDetails = (details: RequestDetails) =>
  request({
    method: details.method,
    path: new URL(details.endpoint).pathname,
    headers: Object.fromEntries(Object.entries(details.headers).map(([k, v]) => [k.toLowerCase(), String(v)])),
    ...(details.body !== null ? { body: details.body } : {})
  })

/** The raw key `web-push` generated (base64url), as the browser would pass it to `subscribe()`. */
const rawKey = (publicKey: string) => Buffer.from(publicKey, "base64url")

describe("VAPID accepted", () => {
  layer(TestEndpoint, { excludeTestServices: true })((it) => {
    it.effect("jose: `vapid t=,k=` on v1 and on the v2 endpoint bound to the key", () =>
      Effect.gen(function*() {
        const keys = yield* vapidKeys
        const authorization = `vapid t=${yield* Effect.promise(() => keys.sign(goodClaims()))}, k=${keys.publicKey}`
        const v1 = yield* subscribe()
        const v2 = yield* subscribe({ key: keys.raw })
        assert.include(v2.path, "/wpush/v2/")
        assert.strictEqual((yield* push(v1, { authorization })).status, 201)
        assert.strictEqual((yield* push(v2, { authorization })).status, 201)
      }))

    it.effect("jose: draft-01 `WebPush` and `Bearer` with `Crypto-Key: p256ecdsa=`", () =>
      Effect.gen(function*() {
        const keys = yield* vapidKeys
        const jwt = yield* Effect.promise(() => keys.sign(goodClaims()))
        const sub = yield* subscribe({ key: keys.raw })
        for (const scheme of ["WebPush", "Bearer", "webpush"]) {
          const reply = yield* push(sub, { authorization: `${scheme} ${jwt}`, "crypto-key": `p256ecdsa=${keys.publicKey}` })
          assert.strictEqual(reply.status, 201, `${scheme}: ${reply.text}`)
        }
        // aesgcm with a body: dh and p256ecdsa share the Crypto-Key header.
        const withBody = yield* push(sub, {
          authorization: `WebPush ${jwt}`,
          "crypto-key": `dh=BAAA;p256ecdsa=${keys.publicKey}`,
          "content-encoding": "aesgcm",
          encryption: "salt=c2FsdA"
        }, "ciphertext")
        assert.strictEqual(withBody.status, 201, withBody.text)
      }))

    it.effect("jose: key in standard base64 with padding, quoted, spaces around the parameters", () =>
      Effect.gen(function*() {
        const keys = yield* vapidKeys
        const jwt = yield* Effect.promise(() => keys.sign(goodClaims()))
        const sub = yield* subscribe({ key: keys.raw })
        const standard = keys.raw.toString("base64")
        assert.strictEqual((yield* push(sub, { authorization: `vapid t=${jwt}, k=${standard}` })).status, 201)
        assert.strictEqual((yield* push(sub, { authorization: `vapid k = ${keys.publicKey}== , t = ${jwt}` })).status, 201)
        const quoted = yield* push(sub, { authorization: `WebPush ${jwt}`, "crypto-key": `p256ecdsa="${keys.publicKey}"` })
        assert.strictEqual(quoted.status, 201)
      }))

    it.effect("jose: claim edges that pass (exp within the 60 s leeway, 24 h ahead, no sub)", () =>
      Effect.gen(function*() {
        const keys = yield* vapidKeys
        const sub = yield* subscribe({ key: keys.raw })
        for (
          const claims of [
            { ...goodClaims(), exp: nowSeconds() - 30 },
            { ...goodClaims(), exp: nowSeconds() + 86_400 - 5 },
            { aud: ORIGIN, exp: nowSeconds() + 60 }
          ]
        ) {
          const jwt = yield* Effect.promise(() => keys.sign(claims))
          const reply = yield* push(sub, { authorization: `vapid t=${jwt}, k=${keys.publicKey}` })
          assert.strictEqual(reply.status, 201, `${JSON.stringify(claims)}: ${reply.text}`)
        }
      }))

    it.effect("aud must be the origin exactly: a path, a trailing slash, another case or port → 401/109", () =>
      Effect.gen(function*() {
        const keys = yield* vapidKeys
        const sub = yield* subscribe({ key: keys.raw })
        const url = new URL(ORIGIN)
        for (
          const aud of [
            `${ORIGIN}/`,
            `${ORIGIN}/wpush`,
            ORIGIN.toUpperCase(),
            `${url.protocol.toUpperCase()}//${url.host}`,
            `${url.protocol}//${url.hostname}:1`,
            `${ORIGIN} `
          ]
        ) {
          const jwt = yield* Effect.promise(() => keys.sign({ ...goodClaims(), aud }))
          const reply = yield* push(sub, { authorization: `vapid t=${jwt}, k=${keys.publicKey}` })
          assert.strictEqual(reply.status, 401, aud)
          assert.strictEqual(reply.json().errno, 109)
          assert.strictEqual(reply.json().message, "Invalid VAPID audience")
        }
      }))

    it.effect("web-push getVapidHeaders: aes128gcm (`vapid` scheme) and aesgcm (`WebPush` + Crypto-Key)", () =>
      Effect.gen(function*() {
        const { publicKey, privateKey } = webpush.generateVAPIDKeys()
        const sub = yield* subscribe({ key: rawKey(publicKey) })
        const modern = webpush.getVapidHeaders(ORIGIN, "mailto:ops@example.com", publicKey, privateKey, "aes128gcm")
        assert.match(modern.Authorization, /^vapid t=/)
        assert.strictEqual((yield* push(sub, { authorization: modern.Authorization })).status, 201)

        const legacy = webpush.getVapidHeaders(ORIGIN, "https://example.com/contact", publicKey, privateKey, "aesgcm")
        assert.match(legacy.Authorization, /^WebPush /)
        const reply = yield* push(sub, { authorization: legacy.Authorization, "crypto-key": legacy["Crypto-Key"] ?? "" })
        assert.strictEqual(reply.status, 201, reply.text)
      }))

    it.effect("web-push getVapidHeaders signed by a key the v2 endpoint is not bound to → 401", () =>
      Effect.gen(function*() {
        const bound = webpush.generateVAPIDKeys()
        const other = webpush.generateVAPIDKeys()
        const sub = yield* subscribe({ key: rawKey(bound.publicKey) })
        const headers = webpush.getVapidHeaders(ORIGIN, "mailto:ops@example.com", other.publicKey, other.privateKey, "aes128gcm")
        const reply = yield* push(sub, { authorization: headers.Authorization })
        assert.strictEqual(reply.status, 401)
        assert.strictEqual(reply.json().message, "VAPID public key mismatch")
      }))

    const fullRequest = (
      contentEncoding: "aes128gcm" | "aesgcm",
      withVapid: boolean
    ) =>
      Effect.gen(function*() {
        const vapid = webpush.generateVAPIDKeys()
        const nodeId = yield* fakeNode(200)
        const sub: Subscription = yield* subscribe({ nodeId, ...(withVapid ? { key: rawKey(vapid.publicKey) } : {}) })
        const details = webpush.generateRequestDetails(
          { endpoint: sub.endpoint, keys: browserKeys() },
          "hello from web-push",
          {
            TTL: 300,
            contentEncoding,
            topic: "greeting",
            ...(withVapid ? { vapidDetails: { subject: "mailto:ops@example.com", ...vapid } } : {})
          }
        )
        const reply = yield* sendDetails(details)
        assert.strictEqual(reply.status, 201, reply.text)
        assert.strictEqual(reply.headers["ttl"], "300")
        assert.match(String(reply.headers["location"]), new RegExp(`^${TEST_ENDPOINT_URL}/m/`))
        const [call] = yield* nodeCalls(sub.uaid)
        const n = call?.notification
        assert.strictEqual(n?.data, Buffer.from(details.body ?? []).toString("base64url"))
        assert.strictEqual(n?.topic, "greeting")
        assert.strictEqual(n?.ttl, 300)
        return { n, details }
      })

    it.effect("web-push generateRequestDetails: aes128gcm with VAPID to v2, without to v1", () =>
      Effect.gen(function*() {
        for (const withVapid of [true, false]) {
          const { n } = yield* fullRequest("aes128gcm", withVapid)
          assert.deepStrictEqual(n?.headers, { encoding: "aes128gcm" })
        }
      }))

    it.effect("web-push generateRequestDetails: aesgcm with VAPID to v2, without to v1", () =>
      Effect.gen(function*() {
        for (const withVapid of [true, false]) {
          const { n, details } = yield* fullRequest("aesgcm", withVapid)
          const strip = (v: unknown) => String(v).replace(/=+(;|,|$)/g, "$1")
          assert.deepStrictEqual(n?.headers, {
            encoding: "aesgcm",
            encryption: strip(details.headers["Encryption"]),
            crypto_key: String(details.headers["Crypto-Key"]).split(";").map(strip).join(";")
          })
          assert.include(n?.headers?.["crypto_key"] ?? "", "dh=")
          if (withVapid) assert.include(n?.headers?.["crypto_key"] ?? "", "p256ecdsa=")
        }
      }))
  })
})

describe("require_vapid", () => {
  layer(endpointWith(FakeNodeClient, { ...options, requireVapid: true }), { excludeTestServices: true })((it) => {
    it.effect("an unsigned push is refused 401/109 on a v1 endpoint too; a signed one is taken", () =>
      Effect.gen(function*() {
        const keys = yield* vapidKeys
        const v1 = yield* subscribe()
        const unsigned = yield* push(v1)
        assert.strictEqual(unsigned.status, 401)
        assert.deepInclude(unsigned.json(), { errno: 109, message: "This server accepts only VAPID-signed pushes" })
        const authorization = `vapid t=${yield* Effect.promise(() => keys.sign(goodClaims()))}, k=${keys.publicKey}`
        assert.strictEqual((yield* push(v1, { authorization })).status, 201)
      }))
  })
})
