/**
 * The connection node's ports against clients that hold connections and say nothing, or too
 * little: on the WebSocket port before the upgrade (nothing, or part of the upgrade request: 408)
 * each is closed within `client_request_timeout` of connecting, after it by `hello_timeout`; on the
 * router port the same; kept-alive connections within `client_idle_timeout`; one address holds at
 * most `max_connections_per_address` on the WebSocket port (beyond: 503). Meanwhile a connected
 * client's pushes arrive at once, and afterwards the process holds no more sockets than before.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import WebSocket from "ws"
import { Broadcasts } from "../../src/broadcast/Broadcasts.ts"
import { ConnectionNode, type ConnectionNodeOptions } from "../../src/connection/node.ts"
import { EndpointCrypto } from "../../src/crypto/endpoint.ts"
import { MORE_INFO } from "../../src/domain/errors.ts"
import { encodeTransportNotification } from "../../src/domain/router-wire.ts"
import { METRICS } from "../../src/observability/catalog.ts"
import { EventLog } from "../../src/observability/EventLog.ts"
import { Metrics } from "../../src/observability/Metrics.ts"
import { NodeClient } from "../../src/routers/NodeClient.ts"
import { RouterAuth } from "../../src/crypto/routerAuth.ts"
import { layerMemory } from "../../src/storage/memory/layer.ts"
import { createActiveTables } from "../../src/storage/Storage.ts"
import { eventually, waitUntil } from "../eventually.ts"
import { allClosed, type Held, holdSockets, lifetimes, openTcpSockets, sleep, timedRequest } from "../endpoint/silent-sockets.ts"
import { nodeOptions, routerSignature } from "./client.ts"

const CHID = "eac8e1de-cddf-42d6-9919-a7b0e0f41e59"
/** The connections are all held at once: each must outlast the opening of them all. */
// Opening them takes seconds on a loaded machine (9.8 s seen for 3,000 on two busy cores).
const HOLD_TIMEOUT = 15_000
const IDLE_TIMEOUT = 1_500
const SLACK = 2_500
/**
 * How late the thousands of held connections may be closed after HOLD_TIMEOUT: the server closes
 * them all at once, on a loaded machine seconds late (4.3 s seen on two busy cores). Without the
 * request timeout they would stay open for Node's own (60 s headers timeout) or for good.
 */
const HOLD_SLACK = HOLD_TIMEOUT
/**
 * The victim's worst push latency while the abuse goes on: with the test's own sockets in this
 * process and other test files on the same cores, far from the figures measured alone, but half
 * the abusers' hold (a victim held until they time out would fail it).
 */
const VICTIM_MAX_MS = HOLD_TIMEOUT / 2

const nodeWith = (overrides: Partial<Omit<ConnectionNodeOptions, "routerUrl">>) =>
  ConnectionNode.layer({ ...nodeOptions, ...overrides }, (port) => `http://127.0.0.1:${port}`).pipe(
    Layer.provideMerge(Layer.effectDiscard(createActiveTables).pipe(
      Layer.provideMerge(layerMemory({ routerTable: "router", messageTablePrefix: "message", noTableRotation: false }))
    )),
    Layer.provideMerge(Layer.mergeAll(Broadcasts.layerStatic(), EndpointCrypto.layerTest, EventLog.layer(), Metrics.layerMemory, NodeClient.layer({ connectTimeoutMs: 500, requestTimeoutMs: 500 }).pipe(Layer.provideMerge(RouterAuth.layerTest))))
  )

const limits = (maxPerAddress: number): Partial<Omit<ConnectionNodeOptions, "routerUrl">> => ({
  clientRequestTimeoutMs: HOLD_TIMEOUT,
  socketLimits: { idleTimeoutMs: IDLE_TIMEOUT, maxPerAddress, exempt: [] }
})

const live = (title: string, overrides: Partial<Omit<ConnectionNodeOptions, "routerUrl">>, test: () => Effect.Effect<void, never, ConnectionNode | Metrics>) =>
  // Room for a flood's opening, hold and slack on a loaded machine.
  it.live(title, () => test().pipe(Effect.provide(nodeWith(overrides))), HOLD_TIMEOUT * 4)

interface Victim {
  readonly ws: WebSocket
  readonly uaid: string
  readonly next: () => Promise<Record<string, unknown>>
}

/** A client from 127.0.0.2 that said hello and registered CHID. */
const connectVictim = (port: number): Promise<Victim> =>
  new Promise((resolve, reject) => {
    const ws = new WebSocket(`ws://127.0.0.1:${port}/`, "push-notification", { localAddress: "127.0.0.2" })
    const frames: Array<Record<string, unknown>> = []
    const waiting: Array<(frame: Record<string, unknown>) => void> = []
    ws.on("message", (data) => {
      const frame = JSON.parse(data.toString()) as Record<string, unknown>
      const wake = waiting.shift()
      if (wake !== undefined) wake(frame)
      else frames.push(frame)
    })
    const next = () => new Promise<Record<string, unknown>>((done) => {
      const frame = frames.shift()
      if (frame !== undefined) done(frame)
      else waiting.push(done)
    })
    ws.once("error", reject)
    ws.once("open", async () => {
      ws.send(JSON.stringify({ messageType: "hello", use_webpush: true }))
      const uaid = (await next())["uaid"] as string
      ws.send(JSON.stringify({ messageType: "register", channelID: CHID }))
      await next()
      resolve({ ws, uaid, next })
    })
  })

/** Pushes to `victim` through the router port until `stop` resolves (at least 5): each one's time to arrive (ms). */
const pushes = async (routerPort: number, victim: Victim, stop: Promise<unknown>) => {
  const times: Array<number> = []
  let done = false
  void stop.finally(() => void (done = true))
  for (let i = 0; !done || times.length < 5; i++) {
    const version = `v${i}`
    const body = encodeTransportNotification({ channelId: CHID, version, ttl: 60, timestamp: Math.floor(Date.now() / 1000) })
    const start = performance.now()
    const put = await timedRequest(routerPort, "PUT", `/push/${victim.uaid}`, body, {
      "content-type": "application/json",
      ...routerSignature("PUT", `/push/${victim.uaid}`, body)
    })
    assert.strictEqual(put.status, 200, put.text)
    const frame = await victim.next()
    times.push(performance.now() - start)
    assert.strictEqual(frame["version"], version)
    victim.ws.send(JSON.stringify({ messageType: "ack", updates: [{ channelID: CHID, version }] }))
    await sleep(50)
  }
  return times
}

const value = (name: string, tags: Record<string, string>) => Effect.map(Metrics, (metrics) => metrics.value(name, tags) ?? 0)

const report = (label: string, figures: Record<string, unknown>) => console.log(`[silent-sockets] ${label}: ${JSON.stringify(figures)}`)

const partialUpgrade = "GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"

describe("connection node: silent and idle connections", () => {
  live(
    "2,000 silent connections on the WebSocket port and 1,000 on the router port are closed within client_request_timeout; a connected client's pushes arrive fast",
    limits(1_000),
    () =>
      Effect.gen(function*() {
        const node = yield* ConnectionNode
        const victim = yield* Effect.promise(() => connectVictim(node.port))
        const before = openTcpSockets()
        const start = performance.now()
        let opened = 0
        let held: ReadonlyArray<Held> = []
        const closed = (async () => {
          held = [
            ...await holdSockets(node.port, 1_000, (i) => (i % 2 === 0 ? "" : partialUpgrade), "127.0.0.1"),
            ...await holdSockets(node.port, 1_000, (i) => (i % 2 === 0 ? "" : partialUpgrade), "127.0.0.3"),
            ...await holdSockets(node.routerPort, 1_000, (i) => (i % 2 === 0 ? "" : "PUT /push/0123456789abcdef0123456789abcdef HTTP/1.1\r\n"), "127.0.0.1")
          ]
          opened = performance.now() - start
          return allClosed(held, HOLD_TIMEOUT + HOLD_SLACK)
        })()
        const times = yield* Effect.promise(() => pushes(node.routerPort, victim, closed))
        assert.isTrue(yield* Effect.promise(() => closed), `every silent connection is closed: ${held.filter((h) => h.closedAt === undefined).length} of ${held.length} still open`)
        assert.isBelow(opened, HOLD_TIMEOUT, "all opened before the first could time out")
        const lived = lifetimes(held)
        assert.isAtLeast(lived[0]!, HOLD_TIMEOUT - 100)
        assert.isAtMost(lived.at(-1)!, HOLD_TIMEOUT + HOLD_SLACK)
        // Node's HTTP server answers both (nothing, part of a request) 408.
        for (const h of held) assert.match(h.received.toString(), /^HTTP\/1\.1 408 /)
        const worst = Math.max(...times)
        assert.isBelow(worst, VICTIM_MAX_MS, `push latencies ${JSON.stringify(times.map(Math.round))}`)
        assert.strictEqual(yield* value(METRICS.netTimeout.name, { port: "websocket", phase: "request" }), 2_000)
        assert.strictEqual(yield* value(METRICS.netTimeout.name, { port: "router", phase: "request" }), 1_000)
        victim.ws.terminate()
        yield* eventually(Effect.map(value(METRICS.netConnections.name, { port: "websocket" }), (n) => n === 0 && openTcpSockets() <= before + 2), SLACK)
        assert.strictEqual(yield* value(METRICS.netConnections.name, { port: "websocket" }), 0)
        const after = openTcpSockets()
        assert.isAtMost(after, before + 2)
        report("silent, connection node", {
          connections: held.length,
          openedInMs: Math.round(opened),
          closedAfterMs: { min: Math.round(lived[0]!), max: Math.round(lived.at(-1)!) },
          victim: { pushes: times.length, maxMs: Math.round(worst), medianMs: Math.round([...times].sort((a, b) => a - b)[times.length >> 1]!) },
          tcpSockets: { before, after }
        })
      })
  )

  // The kept connections are held for the whole test (their request timeout is past its end), so
  // the cap is counted however long opening 2,000 takes on a loaded machine; their closing at the
  // timeout is the first test's.
  live("beyond max_connections_per_address on the WebSocket port: 503 Too many connections at once; another address is not affected", { ...limits(500), clientRequestTimeoutMs: HOLD_TIMEOUT * 4 }, () =>
    Effect.gen(function*() {
      const node = yield* ConnectionNode
      const victim = yield* Effect.promise(() => connectVictim(node.port))
      const before = openTcpSockets()
      let held: ReadonlyArray<Held> = []
      const closedOf = () => held.filter((h) => h.closedAt !== undefined)
      const refusing = (async () => {
        held = await holdSockets(node.port, 2_000, () => "")
        await waitUntil(() => closedOf().length >= 1_500, HOLD_TIMEOUT)
      })()
      const times = yield* Effect.promise(() => pushes(node.routerPort, victim, refusing))
      const refused = closedOf()
      assert.strictEqual(refused.length, 1_500, "closed: the refused ones")
      assert.isTrue(refused.every((h) => h.received.toString().startsWith("HTTP/1.1 503 ")))
      const kept = held.filter((h) => h.closedAt === undefined)
      assert.isTrue(kept.every((h) => h.received.length === 0), "the others held, unanswered")
      assert.include(refused[0]!.received.toString(), JSON.stringify({ code: 503, errno: null, error: "Service Unavailable", message: "Too many connections, retry later", more_info: MORE_INFO }))
      // Refused at once, not held: a held one lives past the test; HOLD_TIMEOUT / 2 is room for late timers.
      assert.isBelow(lifetimes(refused).at(-1)!, HOLD_TIMEOUT / 2)
      assert.strictEqual(yield* value(METRICS.netRefused.name, { port: "websocket", reason: "per_address" }), 1_500)
      const worst = Math.max(...times)
      assert.isBelow(worst, VICTIM_MAX_MS, `push latencies ${JSON.stringify(times.map(Math.round))}`)
      for (const h of kept) h.socket.destroy()
      victim.ws.terminate()
      yield* eventually(Effect.sync(() => openTcpSockets() <= before + 2), SLACK)
      const after = openTcpSockets()
      assert.isAtMost(after, before + 2)
      report("per-address cap, WebSocket port", { refused: refused.length, refusedWithinMs: Math.round(lifetimes(refused).at(-1)!), victimMaxMs: Math.round(worst), tcpSockets: { before, after } })
    }))

  live("after the upgrade, a silent WebSocket is closed by hello_timeout; an idle kept-alive connection on either port after client_idle_timeout", { ...limits(1_000), clientRequestTimeoutMs: 1_000, helloTimeoutMs: 1_000 }, () =>
    Effect.gen(function*() {
      const node = yield* ConnectionNode
      const upgraded = yield* Effect.promise(() =>
        new Promise<{ code: number; ms: number }>((resolve) => {
          const ws = new WebSocket(`ws://127.0.0.1:${node.port}/`, "push-notification")
          let openedAt = 0
          ws.once("open", () => void (openedAt = performance.now()))
          ws.once("close", (code) => resolve({ code, ms: performance.now() - openedAt }))
        }))
      assert.strictEqual(upgraded.code, 1011)
      assert.isAtMost(upgraded.ms, 1_000 + SLACK)
      const idle = yield* Effect.promise(() =>
        Promise.all([node.port, node.routerPort].map(async (port) => {
          const [h] = await holdSockets(port, 1, () => "GET /__lbheartbeat__ HTTP/1.1\r\nHost: x\r\n\r\n")
          await allClosed([h!], IDLE_TIMEOUT + 1_000 + SLACK)
          return h!
        })))
      for (const h of idle) {
        assert.match(h.received.toString(), /^HTTP\/1\.1 200 /)
        const lived = h.closedAt! - h.connectedAt
        assert.isAtLeast(lived, IDLE_TIMEOUT)
        assert.isAtMost(lived, IDLE_TIMEOUT + 1_000 + SLACK)
      }
      assert.strictEqual(yield* value(METRICS.netTimeout.name, { port: "websocket", phase: "idle" }), 1)
      assert.strictEqual(yield* value(METRICS.netTimeout.name, { port: "router", phase: "idle" }), 1)
      report("connection node idle", { helloTimeoutCloseMs: Math.round(upgraded.ms), idleClosedAfterMs: idle.map((h) => Math.round(h.closedAt! - h.connectedAt)) })
    }))
})
