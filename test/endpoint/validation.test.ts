/**
 * The POST validation table (the rules #1–#16 and #2b of `src/endpoint/acceptPush.ts`), one row per rule: every request is a
 * valid one (v1 endpoint, TTL 60, no body unless the rule needs one) changed in exactly one way,
 * sent to the real server; status, errno and message are asserted, plus the headers error answers add.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Effect, Redacted } from "effect"
import { SignJWT } from "jose"
import { EndpointCrypto, TEST_ENDPOINT_URL } from "../../src/crypto/endpoint.ts"
import { generateFernetKey } from "../../src/crypto/fernet.ts"
import { MORE_INFO } from "../../src/domain/errors.ts"
import { CLAIMS_MESSAGE } from "../../src/endpoint/vapid.ts"
import { Storage } from "../../src/storage/Storage.ts"
import {
  goodClaims,
  nowSeconds,
  push,
  type Reply,
  request,
  subscribe,
  type SubscribeOptions,
  type Subscription,
  TestEndpoint,
  type VapidKeys,
  vapidKeys
} from "./harness.ts"

type Env = Effect.Services<ReturnType<typeof subscribe>> | Effect.Services<ReturnType<typeof request>>

interface Row {
  readonly rule: string
  readonly status: number
  readonly errno: number | null
  readonly message: string
  readonly send: Effect.Effect<{ readonly reply: Reply; readonly sub: Subscription }, unknown, Env>
  /** Extra checks once the reply is in. */
  readonly then?: (sub: Subscription) => Effect.Effect<void, unknown, Env>
}

const ORIGIN = new URL(TEST_ENDPOINT_URL).origin
const BODY = "not really ciphertext"

/** POST to a fresh subscription (`opts`), its path changed by `path`. */
const post = (
  headers: Readonly<Record<string, string | number>>,
  opts: SubscribeOptions & { readonly body?: string; readonly path?: (path: string) => string } = {}
) =>
  Effect.gen(function*() {
    const sub = yield* subscribe(opts)
    const reply = yield* push({ path: opts.path?.(sub.path) ?? sub.path }, headers, opts.body)
    return { reply, sub }
  })

/** POST with VAPID credentials made from fresh keys. */
const withKeys = (f: (keys: VapidKeys, other: VapidKeys) => Promise<Record<string, string>>, opts: SubscribeOptions = {}) =>
  Effect.gen(function*() {
    const keys = yield* vapidKeys
    const other = yield* vapidKeys
    const headers = yield* Effect.promise(() => f(keys, other))
    return yield* post(headers, opts)
  })

const vapid = async (keys: VapidKeys, claims: Record<string, unknown> = goodClaims()) => ({
  authorization: `vapid t=${await keys.sign(claims)}, k=${keys.publicKey}`
})
const vapidWithKey = async (keys: VapidKeys, k: string) => ({ authorization: `vapid t=${await keys.sign(goodClaims())}, k=${k}` })

const userGone = (sub: Subscription) =>
  Effect.gen(function*() {
    const storage = yield* Storage
    assert.isUndefined(yield* storage.getUser(sub.uaid), "user dropped")
  })

const aesgcm = (headers: Record<string, string>) => post({ "content-encoding": "aesgcm", ...headers }, { body: BODY })
const aes128gcm = (headers: Record<string, string>) => post({ "content-encoding": "aes128gcm", ...headers }, { body: BODY })

const rows: ReadonlyArray<Row> = [
  // ── rule #1–#2: path and token ───────────────────────────────────────────────────────────────
  {
    rule: "#1 API version other than v1/v2",
    status: 404,
    errno: 102,
    message: "Invalid API version",
    send: post({}, { path: (p) => p.replace("/wpush/v1/", "/wpush/v3/") })
  },
  {
    rule: "#2 token that is not Fernet",
    status: 404,
    errno: 102,
    message: "Invalid token",
    send: post({}, { path: () => "/wpush/v1/gAAAAABnot-a-token" })
  },
  {
    rule: "#2 token (without version segment) that is not Fernet",
    status: 404,
    errno: 102,
    message: "Invalid token",
    send: post({}, { path: () => "/wpush/not-a-token" })
  },
  {
    rule: "#2 token made under a key we do not have",
    status: 404,
    errno: 102,
    message: "Invalid token",
    send: Effect.gen(function*() {
      const sub = yield* subscribe()
      const foreign = EndpointCrypto.make({ keys: Redacted.make([generateFernetKey()]), endpointUrl: TEST_ENDPOINT_URL })
      assert.isTrue(foreign._tag === "Success")
      const endpoint = yield* (foreign as { readonly success: EndpointCrypto["Service"] }).success.makeEndpoint(sub.uaid, sub.channelId)
      return { reply: yield* push({ path: new URL(endpoint).pathname }), sub }
    })
  },
  // ── rule #2b: the stored headers' lengths (body or not) ─────────────────────────────────────
  {
    rule: "#2b Encryption longer than 512 bytes",
    status: 400,
    errno: 120,
    message: "The Encryption header must be at most 512 bytes",
    send: post({ "content-encoding": "aes128gcm", encryption: `rs=${"4".repeat(510)}` }, { body: BODY })
  },
  {
    rule: "#2b Crypto-Key longer than 512 bytes, without a body",
    status: 400,
    errno: 120,
    message: "The Crypto-Key header must be at most 512 bytes",
    send: post({ "crypto-key": `dh=${"a".repeat(510)}` })
  },
  {
    rule: "#2b Encryption-Key longer than 512 bytes",
    status: 400,
    errno: 120,
    message: "The Encryption-Key header must be at most 512 bytes",
    send: post({ "content-encoding": "aes128gcm", "encryption-key": `dh=${"a".repeat(510)}` }, { body: BODY })
  },
  // ── rule #3: the Authorization header ─────────────────────────────────────────────────
  {
    rule: "#3 unknown auth scheme",
    status: 401,
    errno: 109,
    message: "Unknown auth scheme",
    send: post({ authorization: "Basic dXNlcjpwYXNz" })
  },
  {
    rule: "#3 scheme without credentials",
    status: 401,
    errno: 109,
    message: "Missing VAPID token",
    send: post({ authorization: "vapid" })
  },
  {
    rule: "#3 vapid without k=",
    status: 401,
    errno: 109,
    message: "Missing VAPID public key",
    send: withKeys(async (keys) => ({ authorization: `vapid t=${await keys.sign(goodClaims())}` }))
  },
  {
    rule: "#3 vapid without t=",
    status: 401,
    errno: 109,
    message: "Missing VAPID token",
    send: withKeys(async (keys) => ({ authorization: `vapid k=${keys.publicKey}` }))
  },
  {
    rule: "#3 WebPush scheme without Crypto-Key",
    status: 400,
    errno: 110,
    message: "Missing Crypto-Key header",
    send: withKeys(async (keys) => ({ authorization: `WebPush ${await keys.sign(goodClaims())}` }))
  },
  {
    rule: "#3 Bearer scheme with an unparsable Crypto-Key",
    status: 400,
    errno: 110,
    message: "Invalid Crypto-Key header",
    send: withKeys(async (keys) => ({
      authorization: `Bearer ${await keys.sign(goodClaims())}`,
      "crypto-key": `p256ecdsa=${keys.publicKey};junk`
    }))
  },
  {
    rule: "#3 WebPush scheme with a Crypto-Key lacking p256ecdsa",
    status: 400,
    errno: 110,
    message: "Missing p256ecdsa in Crypto-Key header",
    send: withKeys(async (keys) => ({ authorization: `WebPush ${await keys.sign(goodClaims())}`, "crypto-key": "dh=abc" }))
  },
  // ── rule #4: the key and the JWT ──────────────────────────────────────────────────────
  {
    rule: "#4 key that is not base64",
    status: 401,
    errno: 109,
    message: "Invalid VAPID public key",
    send: withKeys((keys) => vapidWithKey(keys, "not*base64"))
  },
  {
    rule: "#4 key that is not 65 bytes",
    status: 401,
    errno: 109,
    message: "Invalid VAPID public key",
    send: withKeys((keys) => vapidWithKey(keys, keys.raw.subarray(0, 33).toString("base64url")))
  },
  {
    rule: "#4 key that is not a P-256 point",
    status: 401,
    errno: 109,
    message: "Invalid VAPID public key",
    send: withKeys((keys) => vapidWithKey(keys, Buffer.concat([Buffer.from([4]), Buffer.alloc(64, 1)]).toString("base64url")))
  },
  {
    rule: "#4 token that is not a JWS",
    status: 401,
    errno: 109,
    message: "Invalid VAPID token",
    send: withKeys(async (keys) => ({ authorization: `vapid t=not.a.jwt, k=${keys.publicKey}` }))
  },
  {
    rule: "#4 JWT not signed with ES256 (HS256)",
    status: 401,
    errno: 109,
    message: "Invalid VAPID token: the algorithm must be ES256",
    send: withKeys(async (keys) => ({
      authorization: `vapid t=${await new SignJWT(goodClaims()).setProtectedHeader({ alg: "HS256" }).sign(new Uint8Array(32))}, k=${keys.publicKey}`
    }))
  },
  {
    rule: "#4 JWT signed by another key",
    status: 401,
    errno: 109,
    message: "Invalid VAPID token: bad signature",
    send: withKeys(async (keys, other) => ({ authorization: `vapid t=${await other.sign(goodClaims())}, k=${keys.publicKey}` }))
  },
  {
    rule: "#4 exp given as a string",
    status: 401,
    errno: 109,
    message: CLAIMS_MESSAGE,
    send: withKeys((keys) => vapid(keys, { ...goodClaims(), exp: String(nowSeconds() + 3600) }))
  },
  {
    rule: "#4 exp missing",
    status: 401,
    errno: 109,
    message: CLAIMS_MESSAGE,
    send: withKeys((keys) => vapid(keys, { aud: ORIGIN, sub: "mailto:ops@example.com" }))
  },
  {
    rule: "#4 aud missing",
    status: 401,
    errno: 109,
    message: CLAIMS_MESSAGE,
    send: withKeys((keys) => vapid(keys, { exp: nowSeconds() + 3600, sub: "mailto:ops@example.com" }))
  },
  {
    rule: "#4 exp in the past (beyond the 60 s leeway)",
    status: 401,
    errno: 109,
    message: "The VAPID token has expired",
    send: withKeys((keys) => vapid(keys, { ...goodClaims(), exp: nowSeconds() - 120 }))
  },
  {
    rule: "#4 exp more than 24 h ahead",
    status: 401,
    errno: 109,
    message: "The VAPID token expiration is too long",
    send: withKeys((keys) => vapid(keys, { ...goodClaims(), exp: nowSeconds() + 86_400 + 120 }))
  },
  {
    rule: "#4 aud of another origin",
    status: 401,
    errno: 109,
    message: "Invalid VAPID audience",
    send: withKeys((keys) => vapid(keys, { ...goodClaims(), aud: "https://push.example.net" }))
  },
  {
    rule: "#4 aud with a path",
    status: 401,
    errno: 109,
    message: "Invalid VAPID audience",
    send: withKeys((keys) => vapid(keys, { ...goodClaims(), aud: `${ORIGIN}/wpush` }))
  },
  // ── rule #5–#6: token length and the bound key ───────────────────────────────────────────────
  {
    rule: "#5 v1 path with a v2 token",
    status: 404,
    errno: 102,
    message: "Invalid token",
    send: Effect.flatMap(vapidKeys, (keys) => post({}, { key: keys.raw, path: (p) => p.replace("/wpush/v2/", "/wpush/v1/") }))
  },
  {
    rule: "#5 v2 path with a v1 token",
    status: 404,
    errno: 102,
    message: "Invalid token",
    send: post({}, { path: (p) => p.replace("/wpush/v1/", "/wpush/v2/") })
  },
  {
    rule: "#6 v2 endpoint without VAPID",
    status: 401,
    errno: 109,
    message: "Missing VAPID public key",
    send: Effect.flatMap(vapidKeys, (keys) => post({}, { key: keys.raw }))
  },
  {
    rule: "#6 v2 endpoint signed with another (valid) key",
    status: 401,
    errno: 109,
    message: "VAPID public key mismatch",
    send: Effect.gen(function*() {
      const bound = yield* vapidKeys
      return yield* withKeys((keys) => vapid(keys), { key: bound.raw })
    })
  },
  // ── rule #7–#9: user, router type, channel ───────────────────────────────────────────────────
  {
    rule: "#7 unknown user",
    status: 410,
    errno: 106,
    message: "No such subscription",
    send: post({}, { register: false })
  },
  {
    rule: "#8 unknown router type (user dropped)",
    status: 410,
    errno: 106,
    message: "No such subscription",
    send: post({}, { routerType: "carrier-pigeon" }),
    then: userGone
  },
  {
    rule: "#8 gcm user (dropped)",
    status: 410,
    errno: 106,
    message: "Bridge reports user was not found",
    send: post({}, { routerType: "gcm" }),
    then: userGone
  },
  {
    rule: "#8 bridge user without a configured bridge (kept)",
    status: 502,
    errno: 900,
    message: "No fcm router is configured",
    send: post({}, { routerType: "fcm" }),
    then: (sub) =>
      Effect.gen(function*() {
        assert.isDefined(yield* (yield* Storage).getUser(sub.uaid))
      })
  },
  {
    rule: "#8 user without current_month (dropped)",
    status: 410,
    errno: 106,
    message: "No such subscription",
    send: post({}, { currentMonth: null }),
    then: userGone
  },
  {
    rule: "#8 user whose current_month is no longer active (dropped)",
    status: 410,
    errno: 106,
    message: "No such subscription",
    send: post({}, { currentMonth: "message_2001_01" }),
    then: userGone
  },
  {
    rule: "#9 unknown channel",
    status: 410,
    errno: 106,
    message: "No such subscription",
    send: Effect.gen(function*() {
      const sub = yield* subscribe()
      yield* (yield* Storage).removeChannel(sub.uaid, sub.table, sub.channelId)
      return { reply: yield* push(sub), sub }
    })
  },
  // ── rule #10: body size ──────────────────────────────────────────────────────────────────────
  {
    rule: "#10 body over max_data_bytes",
    status: 413,
    errno: 104,
    message: "Data payload must be smaller than 4096 bytes",
    send: post({ "content-encoding": "aes128gcm" }, { body: "x".repeat(4097) })
  },
  {
    rule: "#10 chunked body over max_data_bytes",
    status: 413,
    errno: 104,
    message: "Data payload must be smaller than 4096 bytes",
    send: Effect.gen(function*() {
      const sub = yield* subscribe()
      const reply = yield* request({
        path: sub.path,
        headers: { ttl: 60, "content-encoding": "aes128gcm" },
        body: "x".repeat(5000),
        chunked: true
      })
      return { reply, sub }
    })
  },
  // ── rule #11–#14: TTL and Topic ──────────────────────────────────────────────────────────────
  {
    rule: "#11 TTL missing",
    status: 400,
    errno: 111,
    message: "Missing TTL value",
    send: Effect.gen(function*() {
      const sub = yield* subscribe()
      return { reply: yield* request({ path: sub.path }), sub }
    })
  },
  { rule: "#11 TTL not a number", status: 400, errno: 111, message: "Missing TTL value", send: post({ ttl: "soon" }) },
  { rule: "#11 TTL not an integer", status: 400, errno: 111, message: "Missing TTL value", send: post({ ttl: "1.5" }) },
  {
    rule: "#11 TTL beyond 64 bits",
    status: 400,
    errno: 111,
    message: "Missing TTL value",
    send: post({ ttl: "9223372036854775808" })
  },
  { rule: "#12 TTL negative", status: 400, errno: 114, message: "TTL must be greater than 0", send: post({ ttl: -1 }) },
  {
    rule: "#14 Topic longer than 32 characters",
    status: 400,
    errno: 113,
    message: "Topic must be no greater than 32 characters",
    send: post({ topic: "a".repeat(33) })
  },
  {
    rule: "#14 Topic outside the URL-safe base64 alphabet",
    status: 400,
    errno: 113,
    message: "Topic must be URL and Filename safe Base64 alphabet",
    send: post({ topic: "no/slashes" })
  },
  // ── rule #15: encryption headers (with a body) ───────────────────────────────────────────────
  {
    rule: "#15 body without Content-Encoding",
    status: 400,
    errno: 110,
    message: "Missing Content-Encoding header",
    send: post({}, { body: BODY })
  },
  {
    rule: "#15 Content-Encoding aesgcm128 (draft-01)",
    status: 400,
    errno: 110,
    message: "Unknown Content-Encoding header",
    send: post({ "content-encoding": "aesgcm128", encryption: "salt=abc", "encryption-key": "dh=abc" }, { body: BODY })
  },
  {
    rule: "#15 Content-Encoding compared case-sensitively",
    status: 400,
    errno: 110,
    message: "Unknown Content-Encoding header",
    send: post({ "content-encoding": "AES128GCM" }, { body: BODY })
  },
  { rule: "#15 aesgcm without Encryption", status: 400, errno: 110, message: "Missing Encryption header", send: aesgcm({}) },
  {
    rule: "#15 aesgcm with an unparsable Encryption",
    status: 400,
    errno: 110,
    message: "Invalid Encryption header",
    send: aesgcm({ encryption: "salt" })
  },
  {
    rule: "#15 aesgcm Encryption without salt",
    status: 400,
    errno: 110,
    message: "Missing salt value in Encryption header",
    send: aesgcm({ encryption: "rs=4096" })
  },
  {
    rule: "#15 aesgcm salt not URL-safe base64",
    status: 400,
    errno: 110,
    message: "Invalid salt value in Encryption header",
    send: aesgcm({ encryption: "salt=a+b/c" })
  },
  {
    rule: "#15 aesgcm with Encryption-Key",
    status: 400,
    errno: 110,
    message: "Encryption-Key header is not valid for webpush draft 02 or later",
    send: aesgcm({ encryption: "salt=abc", "encryption-key": "dh=abc" })
  },
  {
    rule: "#15 aesgcm Crypto-Key without dh",
    status: 400,
    errno: 110,
    message: "Missing dh value in Crypto-Key header",
    send: aesgcm({ encryption: "salt=abc", "crypto-key": "p256ecdsa=abc" })
  },
  {
    rule: "#15 aesgcm with an unparsable Crypto-Key",
    status: 400,
    errno: 110,
    message: "Invalid Crypto-Key header",
    send: aesgcm({ encryption: "salt=abc", "crypto-key": "dh" })
  },
  {
    rule: "#15 aesgcm dh not URL-safe base64",
    status: 400,
    errno: 110,
    message: "Invalid dh value in Crypto-Key header",
    send: aesgcm({ encryption: "salt=abc", "crypto-key": "dh=a+b" })
  },
  {
    rule: "#15 aes128gcm with salt in Encryption",
    status: 400,
    errno: 110,
    message: "Do not include 'salt' header in aes128gcm Encryption header",
    send: aes128gcm({ encryption: "salt=abc" })
  },
  {
    rule: "#15 aes128gcm with dh in Crypto-Key",
    status: 400,
    errno: 110,
    message: "Do not include 'dh' header in aes128gcm Crypto-Key header",
    send: aes128gcm({ "crypto-key": "dh=abc" })
  },
  {
    rule: "#15 aes128gcm with an unparsable Encryption",
    status: 400,
    errno: 110,
    message: "Invalid aes128gcm Encryption header",
    send: aes128gcm({ encryption: "junk" })
  }
]

const REASONS: Readonly<Record<number, string>> = {
  400: "Bad Request",
  401: "Unauthorized",
  404: "Not Found",
  410: "Gone",
  413: "Payload Too Large",
  502: "Bad Gateway"
}

describe("POST /wpush validation table", () => {
  layer(TestEndpoint, { excludeTestServices: true })((it) => {
    it.effect.each(rows)("$rule → $status/$errno", (row) =>
      Effect.gen(function*() {
        const { reply, sub } = yield* row.send
        assert.strictEqual(reply.status, row.status, reply.text)
        assert.deepStrictEqual(reply.json(), {
          code: row.status,
          errno: row.errno,
          error: REASONS[row.status],
          message: row.message,
          more_info: MORE_INFO
        })
        assert.match(String(reply.headers["content-type"]), /^application\/json/)
        assert.strictEqual(reply.headers["cache-control"], row.status === 410 ? "max-age=86400" : undefined)
        assert.isUndefined(reply.headers["location"])
        if (row.then !== undefined) yield* row.then(sub)
      }))

    it.effect("the baseline request of the table is accepted", () =>
      Effect.gen(function*() {
        const { reply } = yield* post({})
        assert.strictEqual(reply.status, 201)
        const withBody = yield* aesgcm({ encryption: "salt=abc", "crypto-key": "dh=abc" })
        assert.strictEqual(withBody.reply.status, 201)
        const modern = yield* aes128gcm({})
        assert.strictEqual(modern.reply.status, 201)
        const longest = yield* aesgcm({ encryption: `salt=${"a".repeat(507)}`, "crypto-key": `dh=${"a".repeat(509)}` })
        assert.strictEqual(longest.reply.status, 201, "headers of exactly 512 bytes")
      }))

    it.effect("rules are checked in order: the first broken rule answers", () =>
      Effect.gen(function*() {
        // Broken: api version (#1), auth scheme (#3), TTL (#11) → #1 answers.
        const first = yield* post({ ttl: "x", authorization: "Basic x" }, { path: (p) => p.replace("/v1/", "/v9/") })
        assert.strictEqual(first.reply.json().errno, 102)
        // Broken: token (#2), Encryption's length (#2b) → #2 answers.
        const long = { encryption: "a".repeat(600) }
        const token = yield* post(long, { path: () => "/wpush/v1/not-a-token" })
        assert.strictEqual(token.reply.json().errno, 102)
        // Broken: Encryption's length (#2b), auth (#3), unknown user (#7), body size (#10) → #2b answers.
        const length = yield* post({ ...long, authorization: "Basic x" }, { register: false, body: "x".repeat(5000) })
        assert.strictEqual(length.reply.json().errno, 120)
        // Broken: auth (#3), unknown user (#7), TTL (#11) → #3 answers.
        const second = yield* post({ ttl: "x", authorization: "Basic x" }, { register: false })
        assert.strictEqual(second.reply.json().errno, 109)
        // Broken: unknown user (#7), body size (#10), topic (#14) → #7 answers.
        const third = yield* post({ topic: "a".repeat(40) }, { register: false, body: "x".repeat(5000) })
        assert.strictEqual(third.reply.json().errno, 106)
        // Broken: body size (#10), TTL (#11) → #10 answers.
        const fourth = yield* post({ ttl: "x" }, { body: "x".repeat(5000) })
        assert.strictEqual(fourth.reply.json().errno, 104)
        // Broken: TTL negative (#12), topic (#14), encryption (#15) → #12 answers.
        const fifth = yield* post({ ttl: -5, topic: "!" }, { body: BODY })
        assert.strictEqual(fifth.reply.json().errno, 114)
        // Broken: topic (#14), encryption (#15) → #14 answers.
        const sixth = yield* post({ topic: "!" }, { body: BODY })
        assert.strictEqual(sixth.reply.json().errno, 113)
      }))
  })
})
