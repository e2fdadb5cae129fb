/**
 * Hostile input against a connection node over real sockets: what used to end the process or drop
 * connections silently now gets a defined answer (an error JSON of the table, or a documented close
 * code), and the node carries on serving.
 */
import { Broadcasts } from "../../src/broadcast/Broadcasts.ts"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import WebSocket from "ws"
import { ConnectionNode, type ConnectionNodeOptions } from "../../src/connection/node.ts"
import { EndpointCrypto } from "../../src/crypto/endpoint.ts"
import { MORE_INFO } from "../../src/domain/errors.ts"
import { encodeTransportNotification } from "../../src/domain/router-wire.ts"
import { Metrics } from "../../src/observability/Metrics.ts"
import { EventLog } from "../../src/observability/EventLog.ts"
import { NodeClient } from "../../src/routers/NodeClient.ts"
import { RouterAuth } from "../../src/crypto/routerAuth.ts"
import { layerMemory } from "../../src/storage/memory/layer.ts"
import { createActiveTables } from "../../src/storage/Storage.ts"
import { httpRequest, nodeOptions, openClient, routerRequest, routerSignature } from "./client.ts"
import { closeOf, frame, frames, rawHttp as raw, rawWebSocket } from "./raw.ts"
import { eventually } from "../eventually.ts"

/** A router API request's signature header as a raw header line (over an empty body: the body is not the point here). */
const signatureLine = (method: string, path: string): string =>
  Object.entries(routerSignature(method, path)).map(([name, value]) => `${name}: ${value}\r\n`).join("")

const CHID = "eac8e1de-cddf-42d6-9919-a7b0e0f41e59"

const nodeWith = (overrides: Partial<Omit<ConnectionNodeOptions, "routerUrl">>) =>
  ConnectionNode.layer({ ...nodeOptions, ...overrides }, (port) => `http://127.0.0.1:${port}`).pipe(
    Layer.provideMerge(Layer.effectDiscard(createActiveTables).pipe(
      Layer.provideMerge(layerMemory({ routerTable: "router", messageTablePrefix: "message", noTableRotation: false }))
    )),
    Layer.provideMerge(Layer.mergeAll(Broadcasts.layerStatic(), EndpointCrypto.layerTest, EventLog.layer(), Metrics.layerNoop, NodeClient.layer({ connectTimeoutMs: 500, requestTimeoutMs: 500 }).pipe(Layer.provideMerge(RouterAuth.layerTest))))
  )

const urls = Effect.map(ConnectionNode, (node) => ({
  ws: `ws://127.0.0.1:${node.port}/`,
  router: `http://127.0.0.1:${node.routerPort}`,
  routerPort: node.routerPort,
  port: node.port
}))

const errorJson = (status: number, errno: number | null, error: string, message: string) => ({
  code: status,
  errno,
  error,
  message,
  more_info: MORE_INFO
})

describe("connection node: the router port refuses hostile requests, and stays up", () => {
  const live = (title: string, test: () => Effect.Effect<void, unknown, ConnectionNode | EndpointCrypto>) =>
    it.live(title, () => test().pipe(Effect.provide(nodeWith({ clientRequestTimeoutMs: 400 }))), 20_000)

  live("a malformed percent-encoding in the path is a 404, not a crash", () =>
    Effect.gen(function*() {
      const { router } = yield* urls
      for (const path of ["/push/%E0%A4%A", "/notif/%", "/notif/%ZZ/1", "/__trace__/%E0%A4%A"]) {
        const reply = yield* Effect.promise(() => httpRequest("PUT", `${router}${path}`, "{}"))
        assert.strictEqual(reply.status, 404, path)
        assert.deepStrictEqual(JSON.parse(reply.body), errorJson(404, null, "Not Found", "Not Found"))
      }
      assert.strictEqual((yield* Effect.promise(() => httpRequest("GET", `${router}/__lbheartbeat__`))).status, 200)
    }))

  live("bodies over 64 KiB (2 MB, or 120 KB of nested JSON) are answered 413 and the connection closed", () =>
    Effect.gen(function*() {
      const { routerPort } = yield* urls
      const uaid = "0123456789abcdef0123456789abcdef"
      for (const body of [Buffer.alloc(2 * 1024 * 1024, "x"), Buffer.from("[".repeat(120_000))]) {
        const reply = yield* Effect.promise(() =>
          raw(routerPort, `PUT /push/${uaid} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n${signatureLine("PUT", `/push/${uaid}`)}Content-Length: ${body.length}\r\n\r\n`, body)
        )
        assert.match(reply.text, /^HTTP\/1\.1 413 /)
        assert.include(reply.text, JSON.stringify(errorJson(413, 104, "Payload Too Large", "The request body must be at most 65536 bytes")))
        assert.isTrue(reply.closed, "the connection is closed")
      }
    }))

  live("a body that is not a notification, nested however deep, is a 400", () =>
    Effect.gen(function*() {
      const { router } = yield* urls
      for (const body of ["[".repeat(60_000), "{", "{\"channelID\":1}", "null"]) {
        const reply = yield* Effect.promise(() => routerRequest("PUT", `${router}/push/0123456789abcdef0123456789abcdef`, body))
        assert.strictEqual(reply.status, 400)
        assert.strictEqual(JSON.parse(reply.body).message, "The body is not a notification")
      }
    }))

  live("requests Node's parser refuses, CONNECT, and broken WebSocket handshakes get the error JSON, on both ports", () =>
    Effect.gen(function*() {
      const { routerPort, port } = yield* urls
      const cases: ReadonlyArray<readonly [number, string, number, string]> = [
        [routerPort, "PUT /push/x HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", 400, "The request could not be parsed"],
        [routerPort, `GET /status HTTP/1.1\r\nHost: x\r\nX-Filler: ${"x".repeat(20_000)}\r\n\r\n`, 400, "The request headers are too large"],
        [routerPort, "CONNECT /status HTTP/1.1\r\nHost: x\r\n\r\n", 405, "Method Not Allowed"],
        [port, "get / HTTP/1.1\r\nHost: x\r\n\r\n", 400, "The request could not be parsed"],
        [port, "GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n", 400, "Invalid Upgrade header"],
        [port, "POST / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nContent-Length: 0\r\n\r\n", 405, "Method Not Allowed"]
      ]
      for (const [target, head, status, message] of cases) {
        const reply = yield* Effect.promise(() => raw(target, head, "", 1_000))
        assert.match(reply.text, new RegExp(`^HTTP/1\\.1 ${status} `), head.slice(0, 40))
        assert.strictEqual(JSON.parse(reply.text.slice(reply.text.indexOf("\r\n\r\n") + 4)).message, message)
        assert.isTrue(reply.closed, "the connection is closed")
      }
    }))

  live("headers that stall are answered 408 soon after client_request_timeout, on both ports", () =>
    Effect.gen(function*() {
      const { routerPort, port } = yield* urls
      for (const target of [routerPort, port]) {
        const started = Date.now()
        const reply = yield* Effect.promise(() => raw(target, "GET /status HTTP/1.1\r\nHost: x\r\nX-Half: a", "", 5_000))
        assert.match(reply.text, /^HTTP\/1\.1 408 /)
        assert.include(reply.text, "\"errno\":null")
        assert.isTrue(reply.closed)
        assert.isBelow(Date.now() - started, 2_500)
      }
    }))

  live("a body that stalls is answered 408 within client_request_timeout, and the connection closed", () =>
    Effect.gen(function*() {
      const { routerPort } = yield* urls
      const started = Date.now()
      const reply = yield* Effect.promise(() =>
        raw(routerPort, `PUT /push/0123456789abcdef0123456789abcdef HTTP/1.1\r\nHost: x\r\n${signatureLine("PUT", "/push/0123456789abcdef0123456789abcdef")}Content-Length: 100\r\n\r\n`, "{\"chann")
      )
      assert.match(reply.text, /^HTTP\/1\.1 408 /)
      assert.include(reply.text, "\"errno\":null")
      assert.isTrue(reply.closed)
      assert.isBelow(Date.now() - started, 2_500)
    }))
})

describe("connection node: WebSocket limits", () => {
  it.live("ping frames: a keepalive pace is always answered; a flood is closed 1008 ControlFlood with a close frame", () =>
    Effect.gen(function*() {
      const { port } = yield* urls
      const steady = yield* Effect.promise(() => rawWebSocket(port))
      for (let i = 0; i < 5; i++) {
        steady.socket.write(frame(9, Buffer.from(`k${i}`)))
        yield* Effect.sleep(150)
      }
      assert.deepStrictEqual(frames(steady.received()).map((f) => [f.opcode, f.payload.toString()]), [[10, "k0"], [10, "k1"], [10, "k2"], [10, "k3"], [10, "k4"]])
      steady.socket.destroy()

      const flood = yield* Effect.promise(() => rawWebSocket(port))
      flood.socket.write(frame(1, Buffer.from(JSON.stringify({ messageType: "hello", use_webpush: true }))))
      for (let i = 0; i < 100; i++) flood.socket.write(frame(9))
      yield* eventually(Effect.sync(() => closeOf(flood.received()) !== undefined), 10_000)
      assert.deepStrictEqual(closeOf(flood.received()), { code: 1008, reason: "ControlFlood" })
      flood.socket.destroy()
    }).pipe(Effect.provide(nodeWith({}))), 20_000)

  it.live("a message over max_message_size closes 1009", () =>
    Effect.gen(function*() {
      const { port } = yield* urls
      const client = yield* Effect.promise(() => rawWebSocket(port))
      client.socket.write(frame(1, Buffer.alloc(2_000, "a")))
      yield* eventually(Effect.sync(() => closeOf(client.received()) !== undefined), 10_000)
      assert.strictEqual(closeOf(client.received())?.code, 1009)
      client.socket.destroy()
    }).pipe(Effect.provide(nodeWith({ maxMessageBytes: 1_024 }))), 20_000)

  it.live("beyond max_connections an upgrade is answered 503 with the error JSON", () =>
    Effect.gen(function*() {
      const { ws, port } = yield* urls
      const open = [yield* Effect.promise(() => openClient(ws)), yield* Effect.promise(() => openClient(ws))]
      const refused = yield* Effect.promise(() => new Promise<number>((resolve) => {
        const third = new WebSocket(ws)
        third.on("unexpected-response", (_req, res) => resolve(res.statusCode ?? 0))
        third.on("error", () => resolve(-1))
      }))
      assert.strictEqual(refused, 503)
      const reply = yield* Effect.promise(() => raw(port, "GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n", "", 1_000))
      assert.include(reply.text, JSON.stringify(errorJson(503, null, "Service Unavailable", "Too many connections, retry later")))
      for (const client of open) yield* Effect.promise(() => client.close())
    }).pipe(Effect.provide(nodeWith({ maxConnections: 2 }))), 20_000)

  /**
   * A client stops reading while large messages come until the node stops sending (it closes the
   * client 1013); `stalledMs` later the client reads again and must find the close frame behind
   * what it had not read, then its unacked messages on its next connection.
   */
  const stopsReading = (stalledMs: number) =>
    Effect.gen(function*() {
      const { port, router, ws } = yield* urls
      const crypto = yield* EndpointCrypto
      const slow = yield* Effect.promise(() => rawWebSocket(port))
      slow.socket.write(frame(1, Buffer.from(JSON.stringify({ messageType: "hello", use_webpush: true }))))
      slow.socket.write(frame(1, Buffer.from(JSON.stringify({ messageType: "register", channelID: CHID }))))
      yield* eventually(Effect.sync(() => frames(slow.received()).length >= 2), 10_000)
      const uaid = JSON.parse(frames(slow.received())[0]!.payload.toString()).uaid as string
      slow.socket.pause() // reads nothing more
      const versions: Array<string> = []
      let status = 200
      // Large messages until the node stops taking them: loopback's kernel buffers hold megabytes.
      for (let i = 0; i < 1_000 && status === 200; i++) {
        const version = yield* crypto.makeMessageId({ kind: "timestamp", uaid, channelId: CHID, sortkeyTimestamp: Date.now() + i })
        const body = encodeTransportNotification({
          channelId: CHID,
          version,
          ttl: 600,
          timestamp: Math.floor(Date.now() / 1000),
          sortkeyTimestamp: Date.now() + i,
          data: "A".repeat(60_000),
          headers: { encoding: "aes128gcm" }
        })
        status = (yield* Effect.promise(() => routerRequest("PUT", `${router}/push/${uaid}`, body))).status
        if (status === 200) versions.push(version)
      }
      yield* Effect.sleep(stalledMs)
      // The close frame waits behind what the client never read: reading again, it gets there.
      slow.socket.resume()
      yield* eventually(Effect.sync(() => closeOf(slow.received()) !== undefined), 15_000)
      assert.deepStrictEqual(closeOf(slow.received()), { code: 1013, reason: "SlowClient" })
      slow.socket.destroy()

      // Whatever it did not ack is kept and comes on its next connection.
      const again = yield* Effect.promise(() => openClient(ws))
      again.send({ messageType: "hello", uaid, use_webpush: true })
      const got = new Set<string>()
      while (got.size < versions.length) {
        const f = yield* Effect.promise(() => again.next((m) => m["messageType"] === "notification"))
        got.add(f["version"] as string)
        again.send({ messageType: "ack", updates: [{ channelID: CHID, version: f["version"] }] })
      }
      assert.isAtLeast(versions.length, 10)
      assert.deepStrictEqual([...got].sort(), [...versions].sort())
      yield* Effect.promise(() => again.close())
    })

  it.live("a client that stops reading is closed 1013 SlowClient; its unacked messages come on its next connection", () =>
    stopsReading(0).pipe(Effect.provide(nodeWith({ maxSendBufferBytes: 64 * 1024, msgLimit: 10_000, closeGraceMs: 3_000 }))), 60_000)

  // `ws` ends a closed connection 30 s after its close frame unless told otherwise: close_grace is what counts.
  it.live("a client that reads again 31 s after it was closed still gets the close frame within close_grace (45 s), then its messages", () =>
    stopsReading(31_000).pipe(Effect.provide(nodeWith({ maxSendBufferBytes: 64 * 1024, msgLimit: 10_000, closeGraceMs: 45_000 }))), 90_000)
})
