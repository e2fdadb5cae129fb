/**
 * The real connection-node client against a real local HTTP server playing the node's router port:
 * the requests it makes, keep-alive, refused connections and both timeouts; then the endpoint with
 * the real client end to end (direct delivery, and a hanging node being forgotten).
 */
import * as http from "node:http"
import * as net from "node:net"
import { assert, describe, it, layer } from "@effect/vitest"
import { Effect, Exit, Layer } from "effect"
import * as Redacted from "effect/Redacted"
import { TEST_CRYPTO_KEY, TEST_ENDPOINT_URL } from "../../src/crypto/endpoint.ts"
import { makeRouterAuth, ROUTER_AUTH_HEADER, type RouterAuthRefusal, RouterAuth } from "../../src/crypto/routerAuth.ts"
import { hyphenate } from "../../src/domain/ids.ts"
import type { Notification } from "../../src/domain/notification.ts"
import { decodeTransportNotification } from "../../src/domain/router-wire.ts"
import { EndpointServer } from "../../src/endpoint/server.ts"
import { makeHttpNodeClient, type NodeTransportError } from "../../src/routers/NodeClient.ts"
import { Storage } from "../../src/storage/Storage.ts"
import { messagesOf, options, push, Shared, subscribe } from "./harness.ts"

interface Seen {
  readonly method: string
  readonly url: string
  readonly headers: http.IncomingHttpHeaders
  readonly body: string
  /** The signature check a connection node makes: undefined when it accepts the request. */
  readonly refusal: RouterAuthRefusal | undefined
}

/** What a connection node of the test deployment checks signatures with. */
const auth = makeRouterAuth({ keys: Redacted.make([TEST_CRYPTO_KEY]), acceptUnsigned: false })

/** A local router port: `answer` decides the status (undefined = never answer). */
const localNode = (answer: (seen: Seen) => number | undefined = () => 200) =>
  Effect.acquireRelease(
    Effect.callback<{ readonly url: string; readonly seen: Array<Seen>; readonly connections: () => number }>((resume) => {
      const seen: Array<Seen> = []
      let connections = 0
      const server = http.createServer((req, res) => {
        const chunks: Array<Buffer> = []
        req.on("data", (c: Buffer) => chunks.push(c))
        req.on("end", () => {
          const bytes = Buffer.concat(chunks)
          const header = req.headers[ROUTER_AUTH_HEADER] as string | undefined
          const connectedAt = req.headers["autopush-connected-at"] as string | undefined
          const refusal = auth.verify(Date.now(), header, req.method ?? "", req.url ?? "", connectedAt, bytes)
          const entry = { method: req.method ?? "", url: req.url ?? "", headers: req.headers, body: bytes.toString(), refusal }
          seen.push(entry)
          const status = answer(entry)
          if (status !== undefined) res.writeHead(status).end()
        })
      })
      server.on("connection", () => connections++)
      server.listen(0, "127.0.0.1", () => {
        const { port } = server.address() as net.AddressInfo
        resume(Effect.succeed(Object.assign({ url: `http://127.0.0.1:${port}`, seen, connections: () => connections }, { server })))
      })
    }),
    (node) =>
      Effect.callback<void>((resume) => {
        const server = (node as unknown as { readonly server: http.Server }).server
        server.closeAllConnections()
        server.close(() => resume(Effect.void))
      })
  )

const sign = (method: string, path: string, connectedAt: string | undefined, body: string | undefined) =>
  auth.sign(Date.now(), method, path, connectedAt, body)

const client = (connectTimeoutMs = 500, requestTimeoutMs = 300) =>
  Effect.acquireRelease(
    Effect.sync(() => makeHttpNodeClient({ connectTimeoutMs, requestTimeoutMs, sign })),
    (c) => Effect.sync(c.close)
  )

const UAID = "0123456789abcdef0123456789abcdef"
const NOTIFICATION: Notification = {
  channelId: "3f1b2c4d-5e6f-4a1b-8c2d-3e4f5a6b7c8d",
  version: "gAAAAAB-message-id==",
  ttl: 60,
  timestamp: 1_700_000_000,
  sortkeyTimestamp: 1_700_000_000_123,
  data: "ZGF0YQ",
  headers: { encoding: "aes128gcm" }
}

const transportError = <A>(exit: Exit.Exit<A, NodeTransportError>): NodeTransportError => {
  assert.isTrue(Exit.isFailure(exit), "expected a transport error")
  const error = Exit.isFailure(exit) ? exit.cause : undefined
  const failure = error?.reasons.find((r) => r._tag === "Fail")
  assert.isDefined(failure)
  return (failure as { readonly error: NodeTransportError }).error
}

describe("NodeClient over node:http", () => {
  it.live("push: PUT /push/{hyphenated uaid} with the transport notification JSON", () =>
    Effect.gen(function*() {
      const node = yield* localNode(() => 200)
      const nodes = yield* client()
      assert.strictEqual(yield* nodes.push(node.url, UAID, NOTIFICATION), 200)
      const [seen] = node.seen
      assert.strictEqual(seen?.method, "PUT")
      assert.strictEqual(seen?.url, `/push/${hyphenate(UAID)}`)
      assert.strictEqual(seen?.headers["content-type"], "application/json")
      assert.deepStrictEqual(JSON.parse(seen?.body ?? ""), {
        channelID: NOTIFICATION.channelId,
        version: NOTIFICATION.version,
        ttl: 60,
        topic: null,
        timestamp: 1_700_000_000,
        sortkey_timestamp: 1_700_000_000_123,
        data: "ZGF0YQ",
        headers: { encoding: "aes128gcm" }
      })
      const topical = { ...NOTIFICATION, topic: "t", sortkeyTimestamp: undefined, data: undefined, headers: undefined }
      yield* nodes.push(node.url, UAID, topical)
      assert.deepStrictEqual(JSON.parse(node.seen[1]?.body ?? ""), {
        channelID: NOTIFICATION.channelId,
        version: NOTIFICATION.version,
        ttl: 60,
        topic: "t",
        timestamp: 1_700_000_000
      })
      // What the connection node decodes is what was sent.
      assert.deepStrictEqual(decodeTransportNotification(seen?.body ?? ""), { ...NOTIFICATION, topic: undefined })
    }))

  it.live("statuses pass through; notify is PUT /notif/{uaid} without a body", () =>
    Effect.gen(function*() {
      const node = yield* localNode((seen) => (seen.url.startsWith("/notif/") ? 202 : 404))
      const nodes = yield* client()
      assert.strictEqual(yield* nodes.push(`${node.url}/`, UAID, NOTIFICATION), 404)
      assert.strictEqual(yield* nodes.notify(node.url, UAID), 202)
      assert.deepStrictEqual(node.seen.map((s) => [s.method, s.url, s.body]), [
        ["PUT", `/push/${hyphenate(UAID)}`, JSON.stringify(JSON.parse(node.seen[0]?.body ?? "{}"))],
        ["PUT", `/notif/${hyphenate(UAID)}`, ""]
      ])
    }))

  it.live("a node id with a path: the router API under it; one with a query: the path in the query, as the URL spelled out", () =>
    Effect.gen(function*() {
      const node = yield* localNode(() => 200)
      const nodes = yield* client()
      assert.strictEqual(yield* nodes.push(`${node.url}/router//`, UAID, NOTIFICATION), 200)
      assert.strictEqual(yield* nodes.notify(`${node.url}/router`, UAID), 200)
      assert.strictEqual(yield* nodes.notify(`${node.url}/?x=1`, UAID), 200)
      assert.deepStrictEqual(node.seen.map((s) => s.url), [
        `/router/push/${hyphenate(UAID)}`,
        `/router/notif/${hyphenate(UAID)}`,
        `/?x=1/notif/${hyphenate(UAID)}`
      ])
      const refused = yield* Effect.exit(nodes.push("not a url", UAID, NOTIFICATION))
      assert.strictEqual(transportError(refused).reason, "error")
      // Signed over the path as sent: the prefix and the query are covered.
      assert.deepStrictEqual(node.seen.map((s) => s.refusal), [undefined, undefined, undefined])
    }))

  it.live("every request is signed, over its method, path, Autopush-Connected-At and body, with the deployment's key", () =>
    Effect.gen(function*() {
      const node = yield* localNode(() => 200)
      const nodes = yield* client()
      yield* nodes.push(node.url, UAID, NOTIFICATION, 1_700_000_000_123)
      yield* nodes.notify(node.url, UAID)
      yield* nodes.disconnect(node.url, UAID, 1_700_000_000_123)
      assert.deepStrictEqual(node.seen.map((s) => s.refusal), [undefined, undefined, undefined])
      assert.match(node.seen[0]?.headers[ROUTER_AUTH_HEADER] as string, /^t=\d+,v1=[A-Za-z0-9_-]{43}$/)
      // The same signature does not hold for another method, path, session or body, nor under another key.
      const [first] = node.seen
      const header = first?.headers[ROUTER_AUTH_HEADER] as string
      const body = Buffer.from(first?.body ?? "")
      const now = Date.now()
      assert.isUndefined(auth.verify(now, header, "PUT", first?.url ?? "", "1700000000123", body))
      assert.strictEqual(auth.verify(now, header, "DELETE", first?.url ?? "", "1700000000123", body), "bad_signature")
      assert.strictEqual(auth.verify(now, header, "PUT", `/push/${hyphenate(UAID).replace("a", "b")}`, "1700000000123", body), "bad_signature")
      assert.strictEqual(auth.verify(now, header, "PUT", first?.url ?? "", "1700000000124", body), "bad_signature")
      assert.strictEqual(auth.verify(now, header, "PUT", first?.url ?? "", "1700000000123", Buffer.concat([body, Buffer.from(" ")])), "bad_signature")
      const other = makeRouterAuth({ keys: Redacted.make(["CkiBNLrHHFiXrt1nm-XGsLqqYd6c9dqgk9WJbVW2kLQ="]), acceptUnsigned: false })
      assert.strictEqual(other.verify(now, header, "PUT", first?.url ?? "", "1700000000123", body), "bad_signature")
      // Out of the ±60 s window either way; a rotated-in key still verifies what the old first key signed.
      assert.strictEqual(auth.verify(now + 61_000, header, "PUT", first?.url ?? "", "1700000000123", body), "stale")
      assert.strictEqual(auth.verify(now - 61_000, header, "PUT", first?.url ?? "", "1700000000123", body), "stale")
      const rotated = makeRouterAuth({ keys: Redacted.make(["CkiBNLrHHFiXrt1nm-XGsLqqYd6c9dqgk9WJbVW2kLQ=", TEST_CRYPTO_KEY]), acceptUnsigned: false })
      assert.isUndefined(rotated.verify(now, header, "PUT", first?.url ?? "", "1700000000123", body))
    }))

  it.live("disconnect is DELETE /notif/{uaid}/{connected_at}; the current span travels as traceparent", () =>
    Effect.gen(function*() {
      const node = yield* localNode(() => 200)
      const nodes = yield* client()
      assert.strictEqual(yield* nodes.disconnect(node.url, UAID, 1_700_000_000_123), 200)
      assert.deepStrictEqual(node.seen.map((s) => [s.method, s.url]), [["DELETE", `/notif/${hyphenate(UAID)}/1700000000123`]])
      assert.isUndefined(node.seen[0]?.headers["traceparent"], "no span, no traceparent")
      const span = yield* nodes.push(node.url, UAID, NOTIFICATION).pipe(
        Effect.andThen(Effect.currentSpan),
        Effect.withSpan("notification.route")
      )
      assert.strictEqual(node.seen[1]?.headers["traceparent"], `00-${span.traceId}-${span.spanId}-01`)
    }))

  it.live("keeps the connection alive between requests", () =>
    Effect.gen(function*() {
      const node = yield* localNode(() => 200)
      const nodes = yield* client()
      for (let i = 0; i < 5; i++) yield* nodes.push(node.url, UAID, NOTIFICATION)
      assert.strictEqual(node.seen.length, 5)
      assert.strictEqual(node.connections(), 1)
    }))

  it.live("refused connection → NodeTransportError", () =>
    Effect.gen(function*() {
      const url = yield* Effect.scoped(Effect.map(localNode(), (node) => node.url))
      const nodes = yield* client()
      const error = transportError(yield* Effect.exit(nodes.push(url, UAID, NOTIFICATION)))
      assert.strictEqual(error.reason, "error")
      assert.strictEqual(error.nodeId, url)
    }))

  it.live("a node that never answers → timeout after request_timeout", () =>
    Effect.gen(function*() {
      const node = yield* localNode(() => undefined)
      const nodes = yield* client(500, 250)
      const started = Date.now()
      const error = transportError(yield* Effect.exit(nodes.notify(node.url, UAID)))
      const elapsed = Date.now() - started
      assert.strictEqual(error.reason, "timeout")
      assert.isAtLeast(elapsed, 240)
      assert.isBelow(elapsed, 2000)
    }))

  it.live("a node that cannot be connected to → connect timeout", () =>
    Effect.gen(function*() {
      // A socket that stays "connecting" forever, as towards a host that drops the SYN.
      class Unreachable extends http.Agent {
        override createConnection() {
          const socket = new net.Socket()
          Object.defineProperty(socket, "connecting", { value: true })
          return socket
        }
      }
      const nodes = yield* Effect.acquireRelease(
        Effect.sync(() => makeHttpNodeClient({ connectTimeoutMs: 150, requestTimeoutMs: 3000, httpAgent: new Unreachable(), sign })),
        (c) => Effect.sync(c.close)
      )
      const started = Date.now()
      const error = transportError(yield* Effect.exit(nodes.push("http://192.0.2.1:8081", UAID, NOTIFICATION)))
      const elapsed = Date.now() - started
      assert.strictEqual(error.reason, "connect-timeout")
      assert.isAtLeast(elapsed, 140)
      assert.isBelow(elapsed, 1500)
    }))

  it.live("a node id that is not a URL → NodeTransportError", () =>
    Effect.gen(function*() {
      const nodes = yield* client()
      assert.strictEqual(transportError(yield* Effect.exit(nodes.push("not a url", UAID, NOTIFICATION))).reason, "error")
      assert.strictEqual(transportError(yield* Effect.exit(nodes.notify("ftp://x", UAID))).reason, "error")
    }))
})

describe("EndpointServer.layer: the endpoint with the real NodeClient", () => {
  const live = EndpointServer.layer({ ...options, connectionTimeoutMs: 200, requestTimeoutMs: 300 }).pipe(
    Layer.provideMerge(Shared),
    Layer.provideMerge(RouterAuth.layerTest)
  )
  layer(live, { excludeTestServices: true })((it) => {
    it.effect("direct delivery to a local node", () =>
      Effect.gen(function*() {
        const node = yield* localNode(() => 200)
        const sub = yield* subscribe({ nodeId: node.url })
        const reply = yield* push(sub, { ttl: 90, topic: "abc", "content-encoding": "aes128gcm" }, "payload")
        assert.strictEqual(reply.status, 201)
        const id = String(reply.headers["location"]).slice(`${TEST_ENDPOINT_URL}/m/`.length)
        assert.strictEqual(node.seen.length, 1)
        assert.strictEqual(node.seen[0]?.url, `/push/${hyphenate(sub.uaid)}`)
        assert.isUndefined(node.seen[0]?.refusal, "signed with the deployment's key")
        const body = JSON.parse(node.seen[0]?.body ?? "")
        assert.deepStrictEqual(body, {
          channelID: sub.channelId,
          version: id,
          ttl: 90,
          topic: "abc",
          timestamp: body.timestamp,
          sortkey_timestamp: body.sortkey_timestamp,
          data: Buffer.from("payload").toString("base64url"),
          headers: { encoding: "aes128gcm" }
        })
        assert.strictEqual(Math.floor(body.sortkey_timestamp / 1000), body.timestamp, "the ms it was accepted at")
        assert.deepStrictEqual(yield* messagesOf(sub), [])
      }).pipe(Effect.scoped))

    it.effect("a hanging node: timed out, node_id cleared, message stored", () =>
      Effect.gen(function*() {
        const node = yield* localNode(() => undefined)
        const sub = yield* subscribe({ nodeId: node.url })
        const started = Date.now()
        const reply = yield* push(sub)
        assert.strictEqual(reply.status, 201)
        assert.isAtLeast(Date.now() - started, 290)
        assert.isUndefined((yield* (yield* Storage).getUser(sub.uaid))?.nodeId)
        assert.strictEqual((yield* messagesOf(sub)).length, 1)
      }).pipe(Effect.scoped))
  })
})
