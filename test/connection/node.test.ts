/**
 * The connection node over real sockets: `ws` clients on the public port, HTTP on the router port,
 * with storage on the in-memory layer and on the DynamoDB layer against dynalite.
 */
import { Broadcasts } from "../../src/broadcast/Broadcasts.ts"
import { assert, describe, it as vitest } from "@effect/vitest"
import { Context, Effect, Exit, Layer, Logger, Scope } from "effect"
import { connect as tcpConnect } from "node:net"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { ConnectionNode } from "../../src/connection/node.ts"
import { EndpointCrypto } from "../../src/crypto/endpoint.ts"
import { CONNECTED_AT_HEADER, encodeTransportNotification } from "../../src/domain/router-wire.ts"
import { NodeClient } from "../../src/routers/NodeClient.ts"
import { RouterAuth } from "../../src/crypto/routerAuth.ts"
import { Metrics } from "../../src/observability/Metrics.ts"
import { EventLog } from "../../src/observability/EventLog.ts"
import { layerEmbedded } from "../../src/storage/dynalite/embedded.ts"
import { layerMemory } from "../../src/storage/memory/layer.ts"
import { layerSqlite } from "../../src/storage/sqlite/layer.ts"
import { createActiveTables, mapStorageOperations, Storage, StorageError } from "../../src/storage/Storage.ts"
import { Unavailable } from "../../src/storage/failures.ts"
import { httpRequest, nodeOptions, openClient, routerDelivery, routerRequest } from "./client.ts"

const CHID = "eac8e1de-cddf-42d6-9919-a7b0e0f41e59"


/** A new client with one registered channel (CHID). */
const subscribe = (ws: string) =>
  Effect.promise(async () => {
    const client = await openClient(ws)
    client.send({ messageType: "hello", use_webpush: true })
    const uaid = (await client.next())["uaid"] as string
    client.send({ messageType: "register", channelID: CHID })
    const register = await client.next()
    assert.strictEqual(register["status"], 200)
    return { client, uaid }
  })

const storageOptions = { routerTable: "router", messageTablePrefix: "message", noTableRotation: false }

/** What a node needs but its options: `storage` (its tables made), and test services. */
const nodeParts = (storage: Layer.Layer<Storage, unknown>) =>
  Layer.effectDiscard(createActiveTables).pipe(
    Layer.provideMerge(storage),
    Layer.provideMerge(Layer.mergeAll(Broadcasts.layerStatic(), EndpointCrypto.layerTest, EventLog.layer(), Metrics.layerNoop, NodeClient.layer({ connectTimeoutMs: 500, requestTimeoutMs: 500 }).pipe(Layer.provideMerge(RouterAuth.layerTest))))
  )

const nodeLayer = (storage: Layer.Layer<Storage, unknown>) =>
  ConnectionNode.layer(nodeOptions, (port) => `http://127.0.0.1:${port}`).pipe(Layer.provideMerge(nodeParts(storage)))

const suite = (name: string, storage: () => Layer.Layer<Storage, unknown>) =>
  describe(name, () => {
    const it = { live: (title: string, test: () => Effect.Effect<void, unknown, Storage | EndpointCrypto | ConnectionNode>) =>
      live(title, () => test().pipe(Effect.provide(nodeLayer(storage())))) }
    const urls = Effect.gen(function*() {
      const node = yield* ConnectionNode
      return {
        ws: `ws://127.0.0.1:${node.port}/`,
        router: `http://127.0.0.1:${node.routerPort}`,
        public: `http://127.0.0.1:${node.port}`
      }
    })

    it.live("hello, register, a delivery on the router port, ack; nothing again after reconnect", () =>
      Effect.gen(function*() {
        const { ws, router } = yield* urls
        const crypto = yield* EndpointCrypto
        const { client, uaid } = yield* subscribe(ws)
        const version = yield* crypto.makeMessageId({ kind: "timestamp", uaid, channelId: CHID, sortkeyTimestamp: Date.now() })
        const body = routerDelivery(CHID, version)
        const put = yield* Effect.promise(() => routerRequest("PUT", `${router}/push/${uaid}`, body))
        assert.strictEqual(put.status, 200)
        const notification = yield* Effect.promise(() => client.next())
        assert.deepStrictEqual(notification, {
          messageType: "notification",
          channelID: CHID,
          version,
          data: "aGVsbG8",
          headers: { encoding: "aes128gcm" }
        })
        client.send({ messageType: "ack", updates: [{ channelID: CHID, version, code: 100 }] })
        yield* Effect.promise(() => client.close())

        const again = yield* Effect.promise(() => openClient(ws))
        again.send({ messageType: "hello", uaid, use_webpush: true })
        assert.strictEqual((yield* Effect.promise(() => again.next()))["uaid"], uaid)
        assert.isTrue(yield* Effect.promise(() => again.quiet(300)))
        yield* Effect.promise(() => again.close())
      }))

    it.live("a delivery names its session: another session's, or a channel the session unregistered, is refused (404)", () =>
      Effect.gen(function*() {
        const { ws, router } = yield* urls
        const crypto = yield* EndpointCrypto
        const storage = yield* Storage
        const { client, uaid } = yield* subscribe(ws)
        const connectedAt = (yield* storage.getUser(uaid))?.connectedAt as number
        const put = (headers: Record<string, string>) =>
          Effect.gen(function*() {
            const version = yield* crypto.makeMessageId({ kind: "timestamp", uaid, channelId: CHID, sortkeyTimestamp: Date.now() })
            const body = encodeTransportNotification({ channelId: CHID, version, ttl: 60, timestamp: Math.floor(Date.now() / 1000) })
            return (yield* Effect.promise(() => routerRequest("PUT", `${router}/push/${uaid}`, body, headers))).status
          })
        const received = () => Effect.promise(() => client.next((f) => f["messageType"] === "notification"))
        assert.strictEqual(yield* put({ [CONNECTED_AT_HEADER]: String(connectedAt) }), 200)
        yield* received()
        assert.strictEqual(yield* put({ [CONNECTED_AT_HEADER]: String(connectedAt - 1) }), 404)
        assert.strictEqual(yield* put({ [CONNECTED_AT_HEADER]: "soon" }), 400)
        client.send({ messageType: "unregister", channelID: CHID })
        assert.strictEqual((yield* Effect.promise(() => client.next((f) => f["messageType"] === "unregister")))["status"], 200)
        assert.strictEqual(yield* put({ [CONNECTED_AT_HEADER]: String(connectedAt) }), 404)
        assert.strictEqual(yield* put({}), 404)
        client.send({ messageType: "register", channelID: CHID })
        assert.strictEqual((yield* Effect.promise(() => client.next((f) => f["messageType"] === "register")))["status"], 200)
        assert.strictEqual(yield* put({ [CONNECTED_AT_HEADER]: String(connectedAt) }), 200)
        yield* received()
        yield* Effect.promise(() => client.close())
      }))

    it.live("a client that is not connected gets 404 on the router port; unacked messages survive a disconnect", () =>
      Effect.gen(function*() {
        const { ws, router } = yield* urls
        const crypto = yield* EndpointCrypto
        const storage = yield* Storage
        const { client, uaid } = yield* subscribe(ws)
        const version = yield* crypto.makeMessageId({ kind: "timestamp", uaid, channelId: CHID, sortkeyTimestamp: Date.now() })
        const body = encodeTransportNotification({ channelId: CHID, version, ttl: 600, timestamp: Math.floor(Date.now() / 1000) })
        assert.strictEqual((yield* Effect.promise(() => routerRequest("PUT", `${router}/push/${uaid}`, body))).status, 200)
        yield* Effect.promise(() => client.next())
        yield* Effect.promise(() => client.close())
        // The session saves the unacked message on its way out.
        let user = yield* storage.getUser(uaid)
        for (let i = 0; i < 50 && user?.nodeId !== undefined; i++) {
          yield* Effect.sleep(20)
          user = yield* storage.getUser(uaid)
        }
        assert.isUndefined(user?.nodeId)
        assert.strictEqual((yield* Effect.promise(() => routerRequest("PUT", `${router}/push/${uaid}`, body))).status, 404)
        assert.strictEqual((yield* Effect.promise(() => routerRequest("PUT", `${router}/notif/${uaid}`))).status, 404)
        const again = yield* Effect.promise(() => openClient(ws))
        again.send({ messageType: "hello", uaid })
        yield* Effect.promise(() => again.next())
        const redelivered = yield* Effect.promise(() => again.next())
        assert.strictEqual(redelivered["version"], version)
        assert.isUndefined(redelivered["data"])
        // A poke makes a connected client read storage again.
        assert.strictEqual((yield* Effect.promise(() => routerRequest("PUT", `${router}/notif/${uaid}`))).status, 200)
        yield* Effect.promise(() => again.close())
      }))

    it.live("DELETE /notif/{uaid}/{connected_at} drops that session only", () =>
      Effect.gen(function*() {
        const { ws, router } = yield* urls
        const storage = yield* Storage
        const { client, uaid } = yield* subscribe(ws)
        const user = yield* storage.getUser(uaid)
        const wrong = yield* Effect.promise(() => routerRequest("DELETE", `${router}/notif/${uaid}/${user!.connectedAt + 1}`))
        assert.strictEqual(wrong.status, 404)
        const right = yield* Effect.promise(() => routerRequest("DELETE", `${router}/notif/${uaid}/${user!.connectedAt}`))
        assert.strictEqual(right.status, 200)
        assert.strictEqual((yield* Effect.promise(() => client.closed)).code, 1011)
      }))

    it.live("invalid frames close with their code; the server ends TCP itself after a close frame", () =>
      Effect.gen(function*() {
        const { ws, public: publicUrl } = yield* urls
        const client = yield* Effect.promise(() => openClient(ws))
        client.send("not json")
        assert.deepStrictEqual(yield* Effect.promise(() => client.closed), { code: 1011, reason: "Json" })
        // A raw socket that, like Firefox, never answers the server's close frame.
        const ended = yield* Effect.promise(() => rawClientIgnoringClose(publicUrl))
        assert.isAtMost(ended.afterCloseFrameMs, 1_000)
      }))

    it.live("health routes on both ports; router routes are not on the public port", () =>
      Effect.gen(function*() {
        const { router, public: publicUrl } = yield* urls
        for (const base of [router, publicUrl]) {
          const health = yield* Effect.promise(() => httpRequest("GET", `${base}/__heartbeat__`))
          assert.strictEqual(health.status, 200)
          const json = JSON.parse(health.body) as Record<string, unknown>
          assert.strictEqual(json["status"], "OK")
          assert.isNumber(json["connections"])
          assert.strictEqual((yield* Effect.promise(() => httpRequest("GET", `${base}/__lbheartbeat__`))).status, 200)
          const error = yield* Effect.promise(() => httpRequest("GET", `${base}/__error__`))
          assert.strictEqual(error.status, 418)
          assert.strictEqual((JSON.parse(error.body) as Record<string, unknown>)["errno"], 999)
        }
        const onPublic = yield* Effect.promise(() => httpRequest("PUT", `${publicUrl}/push/${"0".repeat(32)}`, "{}"))
        assert.strictEqual(onPublic.status, 404)
        assert.strictEqual((JSON.parse(onPublic.body) as Record<string, unknown>)["code"], 404)
      }))
  })

/** Upgrade by hand, send an invalid text frame, never answer the close frame; when did TCP end? */
const rawClientIgnoringClose = (httpUrl: string) =>
  new Promise<{ readonly afterCloseFrameMs: number }>((resolve, reject) => {
    const url = new URL(httpUrl)
    const socket = tcpConnect(Number(url.port), url.hostname)
    let closeFrameAt = 0
    let upgraded = false
    socket.on("connect", () => {
      socket.write(
        `GET / HTTP/1.1\r\nHost: ${url.host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n` +
          `Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n`
      )
    })
    socket.on("data", (chunk: Buffer) => {
      if (!upgraded) {
        upgraded = true
        // A masked text frame "x": not JSON.
        socket.write(Buffer.from([0x81, 0x81, 1, 2, 3, 4, "x".charCodeAt(0) ^ 1]))
        return
      }
      if ((chunk[0]! & 0x0f) === 0x8) closeFrameAt = Date.now()
    })
    socket.on("close", () => (closeFrameAt === 0 ? reject(new Error("no close frame")) : resolve({ afterCloseFrameMs: Date.now() - closeFrameAt })))
    socket.on("error", () => {})
  })

const live = vitest.live

describe("connection node", () => {
  suite("on in-memory storage", () => layerMemory(storageOptions))
  suite("on dynalite", () => layerEmbedded({ ...storageOptions, dataDir: mkdtempSync(join(tmpdir(), "autopush-node-")) }))
})

describe("connection node shutdown", () => {
  const stores: ReadonlyArray<readonly [string, () => Layer.Layer<Storage, unknown>]> = [
    ["in-memory storage", () => layerMemory(storageOptions)],
    ["SQLite", () => layerSqlite({ ...storageOptions, path: join(mkdtempSync(join(tmpdir(), "autopush-node-")), "autopush.sqlite") })]
  ]
  for (const [name, store] of stores) {
    live(`on ${name}: each session saves what its client did not ack; the node leaves its sessions' records all at once`, () =>
      Effect.gen(function*() {
        const storage = Context.get(yield* Layer.build(store()), Storage)
        const calls = new Map<string, number>()
        const wrapped = mapStorageOperations(storage, (operation) => (effect) =>
          Effect.suspend(() => {
            calls.set(operation, (calls.get(operation) ?? 0) + 1)
            return effect
          }))
        // Saves made together (the node gathers its sessions' saves) count one each.
        let savedTogether = 0
        const counted: typeof storage = {
          ...wrapped,
          saveManyMessages: (saves) => Effect.andThen(Effect.sync(() => void (savedTogether += saves.length)), wrapped.saveManyMessages(saves))
        }
        const scope = yield* Scope.make()
        const context = yield* Layer.buildWithScope(nodeLayer(Layer.succeed(Storage, counted)), scope)
        const node = Context.get(context, ConnectionNode)
        const crypto = Context.get(context, EndpointCrypto)
        const ws = `ws://127.0.0.1:${node.port}/`
        const clients = yield* Effect.forEach(Array.from({ length: 12 }), () => subscribe(ws), { concurrency: 4 })
        // Two of three clients hold a message they do not ack; the third has nothing to save.
        const unacked = new Map<string, string>()
        for (const [i, { client, uaid }] of clients.entries()) {
          if (i % 3 === 0) continue
          const version = yield* crypto.makeMessageId({ kind: "timestamp", uaid, channelId: CHID, sortkeyTimestamp: Date.now() })
          const put = yield* Effect.promise(() => routerRequest("PUT", `http://127.0.0.1:${node.routerPort}/push/${uaid}`, routerDelivery(CHID, version)))
          assert.strictEqual(put.status, 200)
          assert.strictEqual((yield* Effect.promise(() => client.next()))["version"], version)
          unacked.set(uaid, version)
        }
        calls.clear()
        yield* Scope.close(scope, Exit.void)

        for (const { client } of clients) assert.strictEqual((yield* Effect.promise(() => client.closed)).code, 1001)
        for (const { uaid } of clients) {
          const user = yield* storage.getUser(uaid)
          assert.isDefined(user)
          assert.isUndefined(user?.nodeId, "the record still names the stopped node")
          const page = yield* storage.fetchMessages(uaid, user!.currentMonth!, 10)
          assert.deepStrictEqual(page.messages.map((n) => n.version), unacked.has(uaid) ? [unacked.get(uaid)] : [])
        }
        // One bulk call left the records; no session left its own, and those with nothing to save made no call.
        assert.strictEqual(calls.get("clearNodeId"), undefined)
        assert.strictEqual(calls.get("clearNodeIds"), 1)
        assert.strictEqual((calls.get("saveMessages") ?? 0) + savedTogether, unacked.size)
      }))
  }

  live("a stop that runs out of time with saves failing reports the sessions it cut in one line, not one each", () => {
    const logged: Array<{ readonly message: unknown; readonly annotations: Record<string, unknown> }> = []
    const capture = Logger.layer([Logger.map(Logger.formatStructured, (entry) => void logged.push(entry))])
    return Effect.gen(function*() {
      const storage = Context.get(yield* Layer.build(layerMemory(storageOptions)), Storage)
      // Every save fails: the sessions retry until the stop cuts them.
      const failing = mapStorageOperations(storage, (operation) => (effect) =>
        operation === "saveMessages" || operation === "saveManyMessages"
          ? Effect.fail(new StorageError({ operation, reason: new Unavailable(), cause: new Error("down") })) as unknown as typeof effect
          : effect)
      const scope = yield* Scope.make()
      const options = { ...nodeOptions, shutdownTimeoutMs: 200 }
      const context = yield* Layer.buildWithScope(
        ConnectionNode.layer(options, (port) => `http://127.0.0.1:${port}`).pipe(Layer.provideMerge(nodeParts(Layer.succeed(Storage, failing)))),
        scope
      )
      const node = Context.get(context, ConnectionNode)
      const crypto = Context.get(context, EndpointCrypto)
      const clients = yield* Effect.forEach(Array.from({ length: 3 }), () => subscribe(`ws://127.0.0.1:${node.port}/`))
      for (const { client, uaid } of clients) {
        const version = yield* crypto.makeMessageId({ kind: "timestamp", uaid, channelId: CHID, sortkeyTimestamp: Date.now() })
        yield* Effect.promise(() => routerRequest("PUT", `http://127.0.0.1:${node.routerPort}/push/${uaid}`, routerDelivery(CHID, version)))
        yield* Effect.promise(() => client.next())
      }
      yield* Scope.close(scope, Exit.void)
      assert.deepStrictEqual(logged.filter((entry) => entry.message === "session ended before its unacked messages could be saved"), [])
      const cut = logged.filter((entry) => entry.message === "sessions ended before their unacked messages could be saved")
      assert.strictEqual(cut.length, 1)
      assert.deepInclude(cut[0]!.annotations, { sessions: 3, shutdown_timeout_ms: 200 })
    }).pipe(Effect.provide(capture))
  })
})
