/**
 * HTTP/2 on the endpoint port: h2c with prior knowledge beside HTTP/1.1 on the plain port, and h2
 * chosen by ALPN on a TLS port; the same routes, checks, errors and limits on both; many pushes
 * multiplexed on one connection; a refused body does not take the connection's other streams.
 */
import { assert, describe, it, layer } from "@effect/vitest"
import * as http2 from "node:http2"
import * as https from "node:https"
import { Effect } from "effect"
import { boundPort } from "../../src/endpoint/server.ts"
import { endpointTlsOf } from "../../src/endpoint/tls.ts"
import { selfSigned } from "../bridges/fake-apns.ts"
import { endpointWith, FakeNodeClient, messagesOf, options, push, request, subscribe, TestEndpoint } from "./harness.ts"

interface H2Reply {
  readonly status: number
  readonly headers: http2.IncomingHttpHeaders
  readonly text: string
}

/** One request on an open HTTP/2 session. */
const h2Request = (session: http2.ClientHttp2Session, headers: http2.OutgoingHttpHeaders, body?: string | Buffer) =>
  Effect.callback<H2Reply>((resume) => {
    const stream = session.request(headers)
    let response: http2.IncomingHttpHeaders = {}
    const chunks: Array<Buffer> = []
    stream.on("response", (h) => void (response = h))
    stream.on("data", (chunk: Buffer) => void chunks.push(chunk))
    stream.on("end", () => resume(Effect.succeed({ status: Number(response[":status"]), headers: response, text: Buffer.concat(chunks).toString() })))
    stream.on("error", (error) => resume(Effect.die(error)))
    stream.end(body)
  })

const connect = (authority: string, ca?: string) =>
  Effect.acquireRelease(
    Effect.callback<http2.ClientHttp2Session>((resume) => {
      const session = http2.connect(authority, ca === undefined ? {} : { ca })
      session.once("connect", () => resume(Effect.succeed(session)))
      session.once("error", (error) => resume(Effect.die(error)))
    }),
    (session) => Effect.sync(() => session.close())
  )

describe("HTTP/2 on the endpoint port", () => {
  layer(TestEndpoint, { excludeTestServices: true })((it) => {
    it.effect("h2c with prior knowledge and HTTP/1.1 on one port: the same answers, errors as JSON, pushes multiplexed", () =>
      Effect.gen(function*() {
        const port = yield* boundPort
        const session = yield* connect(`http://127.0.0.1:${port}`)
        const health = yield* h2Request(session, { ":path": "/__lbheartbeat__" })
        assert.strictEqual(health.status, 200)
        assert.strictEqual((yield* request({ method: "GET", path: "/__lbheartbeat__" })).status, 200, "HTTP/1.1 on the same port")

        const bad = yield* h2Request(session, { ":method": "POST", ":path": "/wpush/v1/not-a-token", ttl: "60" })
        assert.strictEqual(bad.status, 404)
        assert.strictEqual(JSON.parse(bad.text).errno, 102)

        const subs = yield* Effect.forEach(Array.from({ length: 20 }), () => subscribe())
        const replies = yield* Effect.forEach(subs, (sub) =>
          h2Request(session, { ":method": "POST", ":path": sub.path, ttl: "60", "content-encoding": "aes128gcm" }, "x"), { concurrency: "unbounded" })
        assert.deepStrictEqual(replies.map((r) => r.status), subs.map(() => 201))
        for (const reply of replies) {
          assert.match(String(reply.headers["location"]), /\/m\//)
          assert.match(String(reply.headers["link"]), /rel="urn:ietf:params:push:receipt"/)
        }
      }))

    it.effect("a body over the limit is refused 413 on its stream; the connection's other streams go on", () =>
      Effect.gen(function*() {
        const port = yield* boundPort
        const session = yield* connect(`http://127.0.0.1:${port}`)
        const sub = yield* subscribe()
        const [large, small] = yield* Effect.all([
          h2Request(session, { ":method": "POST", ":path": sub.path, ttl: "60", "content-encoding": "aes128gcm" }, Buffer.alloc(options.maxDataBytes + 1000)),
          h2Request(session, { ":method": "POST", ":path": sub.path, ttl: "60", "content-encoding": "aes128gcm" }, "ok")
        ], { concurrency: "unbounded" })
        assert.strictEqual(large.status, 413)
        assert.strictEqual(JSON.parse(large.text).errno, 104)
        assert.strictEqual(small.status, 201)
        assert.strictEqual((yield* h2Request(session, { ":path": "/__lbheartbeat__" })).status, 200)
      }))
  })

  describe("a push with a 30 KB Encryption header is refused, and nothing stored", () => {
    const encryption = `salt=${"a".repeat(30_000)}`
    layer(TestEndpoint, { excludeTestServices: true })((it) => {
      it.effect("over HTTP/2: 400/120, the header list being within HTTP/2's 64 KiB", () =>
        Effect.gen(function*() {
          const session = yield* connect(`http://127.0.0.1:${yield* boundPort}`)
          const sub = yield* subscribe()
          const headers = { ":method": "POST", ":path": sub.path, ttl: "60", "content-encoding": "aesgcm", encryption }
          const reply = yield* h2Request(session, headers, "ciphertext")
          assert.strictEqual(reply.status, 400)
          assert.deepStrictEqual([JSON.parse(reply.text).errno, JSON.parse(reply.text).message], [120, "The Encryption header must be at most 512 bytes"])
          assert.deepStrictEqual(yield* messagesOf(sub), [])
        }))

      it.effect("over HTTP/1.1: 400, the headers being over HTTP/1.1's 16 KiB", () =>
        Effect.gen(function*() {
          const sub = yield* subscribe()
          const reply = yield* push(sub, { "content-encoding": "aesgcm", encryption }, "ciphertext")
          assert.strictEqual(reply.status, 400)
          assert.strictEqual(reply.json().message, "The request headers are too large")
          assert.deepStrictEqual(yield* messagesOf(sub), [])
        }))
    })
  })

  // Over h2c the socket Node hands to a request is not the connection's: its address is still the client's.
  const limited = { ...options, rateLimits: { perAddress: { perSecond: 1, burst: 1 }, perVapidKey: { perSecond: 0, burst: 1 }, perSubscription: { perSecond: 0, burst: 1 }, trustedProxies: ["127.0.0.1"] } }
  layer(endpointWith(FakeNodeClient, limited), { excludeTestServices: true })((it) => {
    it.effect("h2c: the per-address limit counts the client the trusted proxy names, as over HTTP/1.1", () =>
      Effect.gen(function*() {
        const session = yield* connect(`http://127.0.0.1:${yield* boundPort}`)
        const sub = yield* subscribe()
        const from = (address: string) =>
          Effect.map(h2Request(session, { ":method": "POST", ":path": sub.path, ttl: "60", "x-forwarded-for": address }), (r) => r.status)
        assert.deepStrictEqual([yield* from("203.0.113.5"), yield* from("203.0.113.5"), yield* from("203.0.113.6")], [201, 429, 201])
      }))

    it.effect("making receipt subscriptions counts against the same per-address limit", () =>
      Effect.gen(function*() {
        const subscribeFrom = (address: string) =>
          Effect.map(request({ method: "POST", path: "/receipts", headers: { "x-forwarded-for": address } }), (r) => r.status)
        assert.deepStrictEqual([yield* subscribeFrom("203.0.113.7"), yield* subscribeFrom("203.0.113.7")], [201, 429])
      }))

    it.effect("reading a message's status counts against it too (a status from the trace reads its whole window)", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        const pushed = yield* request({ method: "POST", path: sub.path, headers: { ttl: "60", "x-forwarded-for": "203.0.113.8" } })
        const path = new URL(String(pushed.headers["location"])).pathname
        const statusFrom = (address: string) =>
          Effect.map(request({ method: "GET", path, headers: { "x-forwarded-for": address } }), (r) => r.status)
        // This endpoint keeps no trace: a message without a receipt is unknown to it (404) — but counted.
        assert.deepStrictEqual([yield* statusFrom("203.0.113.9"), yield* statusFrom("203.0.113.9"), yield* statusFrom("203.0.113.10")], [404, 429, 404])
      }))
  })

  const tls = selfSigned("localhost")
  layer(endpointWith(FakeNodeClient, { ...options, tls }), { excludeTestServices: true })((it) => {
    it.effect("with a certificate: HTTPS, HTTP/2 chosen by ALPN, HTTP/1.1 for clients that offer only it", () =>
      Effect.gen(function*() {
        const port = yield* boundPort
        const session = yield* connect(`https://localhost:${port}`, tls.cert)
        assert.strictEqual(session.alpnProtocol, "h2")
        const sub = yield* subscribe()
        const pushed = yield* h2Request(session, { ":method": "POST", ":path": sub.path, ttl: "60" })
        assert.strictEqual(pushed.status, 201)
        const http1 = yield* Effect.callback<number>((resume) => {
          https.get({ host: "localhost", port, path: "/__lbheartbeat__", ca: tls.cert, agent: false }, (res) => {
            res.resume()
            resume(Effect.succeed(res.statusCode ?? 0))
          }).on("error", (error) => resume(Effect.die(error)))
        })
        assert.strictEqual(http1, 200)
      }))
  })

  it.effect("endpoint_tls_cert and endpoint_tls_key: both or neither, and usable, or one line naming them", () =>
    Effect.gen(function*() {
      assert.isUndefined(yield* endpointTlsOf(undefined, undefined))
      assert.deepStrictEqual(yield* endpointTlsOf(tls.cert, tls.key), tls)
      const alone = yield* Effect.flip(endpointTlsOf(tls.cert, undefined))
      assert.match(alone.message, /endpoint_tls_cert and endpoint_tls_key go together/)
      const missing = yield* Effect.flip(endpointTlsOf("/nonexistent/cert.pem", tls.key))
      assert.match(missing.message, /option endpoint_tls_cert is not usable: cannot read the file \/nonexistent\/cert.pem/)
      const mismatched = yield* Effect.flip(endpointTlsOf(tls.cert, selfSigned("other").key))
      assert.match(mismatched.message, /endpoint_tls_cert and endpoint_tls_key are not usable/)
    }))
})
