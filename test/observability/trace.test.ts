/**
 * The message trace: the bounded window of events and the lifecycle state; `GET
 * /__trace__/{message_id}` and `GET /metrics` on the router port's handler over real HTTP, after one
 * message went through an endpoint (real HTTP server) and a session sharing one event log, as in the
 * all-in-one process.
 */
import { assert, describe, it, layer } from "@effect/vitest"
import { Effect, Layer, Redacted } from "effect"
import { TestClock } from "effect/testing"
import { createServer, type Server } from "node:http"
import type { AddressInfo } from "node:net"
import type { HealthSource } from "../../src/connection/http.ts"
import { handleRouterRequest, type RouterGuard } from "../../src/connection/routerRoutes.ts"
import { makeRouterAuth } from "../../src/crypto/routerAuth.ts"
import { EndpointCrypto, TEST_CRYPTO_KEY, TEST_ENDPOINT_URL } from "../../src/crypto/endpoint.ts"
import { MORE_INFO } from "../../src/domain/errors.ts"
import type { DomainEvent } from "../../src/domain/events.ts"
import { EndpointServer } from "../../src/endpoint/server.ts"
import { makeMessageTrace, MessageTrace } from "../../src/observability/MessageTrace.ts"
import { PROMETHEUS_CONTENT_TYPE } from "../../src/observability/Metrics.ts"
import { observabilityLayerMemory, type RouterObservability, routerObservability } from "../../src/observability/observability.ts"
import { opaqueId } from "../../src/observability/opaque.ts"
import { WebPushRouter } from "../../src/routers/webpush.ts"
import { FakeNodeClient, FakeNodes, options, push, requestTo, TestStorage } from "../endpoint/harness.ts"
import { makeHarness, pump, sessionOptions } from "../protocol/harness.ts"
import type { NodeRegistryService } from "../../src/connection/registry.ts"

const UAID = "a90359e3e4eb64f6e33d1267813bf91c"
const CHID = "eac8e1de-cddf-42d6-9919-a7b0e0f41e59"

/** An event as recorded at `time`. */
const at = (event: Omit<DomainEvent, "time">, time: number): DomainEvent => ({ ...event, time }) as DomainEvent

const accepted = (version: string): Omit<DomainEvent, "time"> => ({
  type: "notification.accepted.1",
  uaid: UAID,
  data: { channelId: CHID, version, ttl: 60 }
})

describe("the trace window", () => {
  it("keeps the last N events; a message shows the ones still there, its first ones when there are many", () => {
    const trace = makeMessageTrace({ capacity: 4, maxEventsPerMessage: 2 })
    trace.sink(at(accepted("m1"), 1))
    trace.sink(at(accepted("m2"), 2))
    trace.sink(at({ type: "notification.expired.1", uaid: UAID, data: { version: "m1" } }, 3))
    trace.sink(at(accepted("m3"), 4))
    assert.strictEqual(trace.size(), 3)
    assert.deepInclude(trace.lookup("m1"), { state: "expired", firstSeen: 1, lastSeen: 3, truncated: false })
    trace.sink(at(accepted("m4"), 5)) // m1's first event goes: m1 is seen from its expiry on
    assert.deepInclude(trace.lookup("m1"), { state: "expired", firstSeen: 3, lastSeen: 3 })
    for (let i = 0; i < 3; i++) trace.sink(at({ type: "notification.nacked.1", uaid: UAID, data: { version: "m3", code: 301 } }, 10 + i))
    assert.isUndefined(trace.lookup("m1"))
    assert.isUndefined(trace.lookup("m2"))
    const m3 = trace.lookup("m3")
    assert.deepStrictEqual(m3?.events.map((e) => e.time), [10, 11])
    assert.deepInclude(m3, { state: "nacked", firstSeen: 10, lastSeen: 12, truncated: true })
    assert.strictEqual(trace.lookup("m4")?.state, "accepted")
    assert.strictEqual(trace.size(), 2)
    // Events without a message id are not traced.
    trace.sink(at({ type: "client.hello.1", uaid: UAID, data: { kind: "new" } }, 20))
    assert.strictEqual(trace.size(), 2)
    assert.strictEqual(trace.lookup("m4")?.state, "accepted")
  })

  it("state: acked, expired and deleted are final; a late routed does not step back", () => {
    const trace = makeMessageTrace()
    const routed: Omit<DomainEvent, "time"> = {
      type: "notification.routed.1",
      uaid: UAID,
      data: { channelId: CHID, version: "m", outcome: "direct", durationMs: 1 }
    }
    trace.sink(at(accepted("m"), 1))
    trace.sink(at({ type: "notification.delivered.1", uaid: UAID, data: { channelId: CHID, version: "m", source: "direct" } }, 2))
    trace.sink(at(routed, 3))
    assert.strictEqual(trace.lookup("m")?.state, "delivered")
    trace.sink(at({ type: "notification.acked.1", uaid: UAID, data: { version: "m", code: 100, source: "direct" } }, 4))
    trace.sink(at({ type: "notification.stored.1", uaid: UAID, data: { channelId: CHID, version: "m", reason: "disconnect" } }, 5))
    const doc = trace.lookup("m")
    assert.strictEqual(doc?.state, "acked")
    assert.strictEqual(doc?.channelId, CHID)
    assert.strictEqual(doc?.uaid, opaqueId(UAID))
    assert.strictEqual(doc?.message, opaqueId("m"))
    assert.deepStrictEqual(doc?.events.map((e) => e.type), [
      "notification.accepted.1",
      "notification.delivered.1",
      "notification.routed.1",
      "notification.acked.1",
      "notification.stored.1"
    ])
    // By its opaque id too (the event log's `version`).
    assert.deepStrictEqual(trace.lookup(opaqueId("m")), doc)
  })
})

describe("the trace's index", () => {
  it("finds what reading the whole window finds, for any sequence of events, window size and lookups by id or opaque id", () => {
    const versions = ["m0", "m1", "m2", "m3", "m4", "m5"]
    const types = ["notification.accepted.1", "notification.routed.1", "notification.delivered.1", "notification.nacked.1", "notification.acked.1"] as const
    let seed = 7
    const next = (n: number): number => {
      seed = (seed * 1_103_515_245 + 12_345) % 2 ** 31
      return seed % n
    }
    for (let run = 0; run < 200; run++) {
      const capacity = 1 + next(12)
      const trace = makeMessageTrace({ capacity, maxEventsPerMessage: 3 })
      const window: Array<DomainEvent> = []
      for (let i = 0; i < 60; i++) {
        const version = versions[next(versions.length)] as string
        const event = at({ type: types[next(types.length)] as DomainEvent["type"], uaid: UAID, data: { version, channelId: CHID, outcome: "direct", code: 100, source: "direct" } } as never, i)
        trace.sink(event)
        window.push(event)
        if (window.length > capacity) window.shift()
        const asked = versions[next(versions.length)] as string
        const expected = window.filter((e) => (e.data as { version: string }).version === asked)
        const found = next(2) === 0 ? trace.lookup(asked) : trace.lookup(opaqueId(asked))
        assert.deepStrictEqual(found?.events.map((e) => e.time), expected.length === 0 ? undefined : expected.slice(0, 3).map((e) => e.time), `run ${run}, event ${i}`)
        assert.strictEqual(found?.lastSeen, expected.at(-1)?.time)
        assert.strictEqual(trace.size(), new Set(window.map((e) => (e.data as { version: string }).version)).size)
      }
    }
  })
})

// ── over HTTP: endpoint + session in one process, trace on the router port ─────────────────────

const AllInOne = EndpointServer.layerServer(options).pipe(
  Layer.provideMerge(WebPushRouter.layer),
  Layer.provideMerge(FakeNodeClient),
  Layer.provideMerge(Layer.mergeAll(TestStorage, EndpointCrypto.layerTest, observabilityLayerMemory()))
)

const health: HealthSource = { storageStatus: () => Promise.resolve({ ok: true }), logError: () => {} }
const guard: RouterGuard = { auth: makeRouterAuth({ keys: Redacted.make([TEST_CRYPTO_KEY]), acceptUnsigned: false }), now: Date.now, noted: () => {} }

/** The router port's handler on a real server (port 0) for the scope. */
const routerPort = (registry: NodeRegistryService, observability: RouterObservability) =>
  Effect.acquireRelease(
    Effect.callback<Server>((resume) => {
      const server = createServer(handleRouterRequest(registry, health, guard, observability))
      server.listen(0, "127.0.0.1", () => resume(Effect.succeed(server)))
    }),
    (server) => Effect.callback<void>((resume) => void server.close(() => resume(Effect.void)))
  ).pipe(Effect.map((server) => (server.address() as AddressInfo).port))

const get = (port: number, path: string) => requestTo(port, { method: "GET", path })

describe("GET /__trace__/{message_id}", () => {
  // The session harness runs on the TestClock (set to now): the endpoint then stamps with it too.
  layer(AllInOne)((it) => {
    it.effect("accepted → routed (direct) → delivered → acked, by message id or opaque id; 404 when unknown", () =>
      Effect.gen(function*() {
        yield* TestClock.setTime(Date.now())
        const harness = yield* makeHarness()
        const observability = yield* routerObservability(harness.registry)
        const port = yield* routerPort(harness.registry, observability)
        // The session's node is reached "directly": the fake node hands the delivery to its mailbox.
        const fake = yield* FakeNodes
        fake.behaviour.set(sessionOptions.routerUrl, (call) =>
          Effect.sync(() => {
            const session = harness.registry.get(call.uaid)
            return session !== undefined && call.notification !== undefined &&
                session.mailbox.offerDelivery({ _tag: "Delivery", notification: call.notification })
              ? 200
              : 404
          }))

        const client = yield* harness.connect()
        yield* client.frame({ messageType: "hello", use_webpush: true })
        yield* client.frame({ messageType: "register", channelID: CHID })
        const endpoint = client.of("register")[0]!["pushEndpoint"] as string
        const reply = yield* push({ path: new URL(endpoint).pathname }, { ttl: 60 })
        assert.strictEqual(reply.status, 201)
        const messageId = String(reply.headers["location"]).slice(`${TEST_ENDPOINT_URL}/m/`.length)
        yield* pump(client)
        assert.strictEqual(client.of("notification")[0]!["version"], messageId)
        yield* client.frame({ messageType: "ack", updates: [{ channelID: CHID, version: messageId, code: 100 }] })

        const trace = yield* get(port, `/__trace__/${encodeURIComponent(messageId)}`)
        assert.strictEqual(trace.status, 200)
        assert.strictEqual(trace.headers["content-type"], "application/json")
        const doc = trace.json()
        assert.strictEqual(doc.message, opaqueId(messageId))
        assert.strictEqual(doc.uaid, opaqueId(client.of("hello")[0]!["uaid"] as string))
        assert.strictEqual(doc.channelId, CHID)
        assert.strictEqual(doc.state, "acked")
        assert.deepStrictEqual(doc.events.map((e: { type: string }) => e.type), [
          "notification.accepted.1",
          "notification.routed.1",
          "notification.delivered.1",
          "notification.acked.1"
        ])
        assert.deepStrictEqual(doc.events[0].data, { ttl: 60 })
        assert.strictEqual(doc.events[1].data.outcome, "direct")
        assert.isNumber(doc.events[1].data.durationMs)
        assert.deepStrictEqual(doc.events[3].data, { code: 100, source: "direct" })
        for (const e of doc.events) assert.isTrue(e.time >= doc.firstSeen && e.time <= doc.lastSeen)
        assert.notInclude(trace.text, messageId)

        const byOpaque = yield* get(port, `/__trace__/${opaqueId(messageId)}`)
        assert.deepStrictEqual(byOpaque.json(), doc)

        for (const path of ["/__trace__/gAAAAABunknown", "/__trace__/", "/__trace__/%E0%A4%A", "/__trace__/a/b"]) {
          const missing = yield* get(port, path)
          assert.strictEqual(missing.status, 404, path)
          assert.deepStrictEqual(missing.json(), {
            code: 404,
            errno: null,
            error: "Not Found",
            message: "Not Found",
            more_info: MORE_INFO
          })
        }
        assert.strictEqual((yield* MessageTrace).size(), 1)
      }))

    it.effect("GET /metrics on the router port: Prometheus text with the connection gauges", () =>
      Effect.gen(function*() {
        yield* TestClock.setTime(Date.now())
        const harness = yield* makeHarness()
        const port = yield* routerPort(harness.registry, yield* routerObservability(harness.registry))
        const client = yield* harness.connect()
        yield* client.frame({ messageType: "hello", use_webpush: true })
        yield* harness.connect() // not identified yet
        const scrape = yield* get(port, "/metrics")
        assert.strictEqual(scrape.status, 200)
        assert.strictEqual(scrape.headers["content-type"], PROMETHEUS_CONTENT_TYPE)
        assert.include(scrape.text, "# TYPE ua_connections gauge\nua_connections 1\n")
        assert.include(scrape.text, "# TYPE ua_sockets gauge\nua_sockets 2\n")
        assert.include(scrape.text, "# TYPE ua_command_hello_total counter\n")
        // Not on other methods; health routes still there.
        assert.strictEqual((yield* requestTo(port, { method: "POST", path: "/metrics" })).status, 404)
        assert.strictEqual((yield* get(port, "/__lbheartbeat__")).status, 200)
      }))
  })

  it.effect("without observability the router port has neither route", () =>
    Effect.gen(function*() {
      const { makeNodeRegistry } = yield* Effect.promise(() => import("../../src/connection/registry.ts"))
      const registry = makeNodeRegistry()
      const port = yield* Effect.acquireRelease(
        Effect.callback<Server>((resume) => {
          const server = createServer(handleRouterRequest(registry, health, guard))
          server.listen(0, "127.0.0.1", () => resume(Effect.succeed(server)))
        }),
        (server) => Effect.callback<void>((resume) => void server.close(() => resume(Effect.void)))
      ).pipe(Effect.map((server) => (server.address() as AddressInfo).port))
      assert.strictEqual((yield* get(port, "/metrics")).status, 404)
      assert.strictEqual((yield* get(port, "/__trace__/x")).status, 404)
    }))
})
