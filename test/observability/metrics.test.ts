/**
 * Metrics: the registry and its Prometheus text; the values after a scripted exchange with the
 * session machine (connection node) and over HTTP with the endpoint node (`GET /metrics`).
 */
import { assert, describe, it, layer } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { TestClock } from "effect/testing"
import { EndpointCrypto, TEST_ENDPOINT_URL } from "../../src/crypto/endpoint.ts"
import { EndpointServer } from "../../src/endpoint/server.ts"
import { prometheusName } from "../../src/observability/catalog.ts"
import { EventLogMemory } from "../../src/observability/EventLog.ts"
import { makeMetrics, Metrics, PROMETHEUS_CONTENT_TYPE } from "../../src/observability/Metrics.ts"
import { MetricsListener } from "../../src/observability/metricsListener.ts"
import { metricsSink } from "../../src/observability/metricsSink.ts"
import { domainEvent } from "../../src/domain/events.ts"
import { observabilityLayerMemory } from "../../src/observability/observability.ts"
import { WebPushRouter } from "../../src/routers/webpush.ts"
import { layerMemory } from "../../src/storage/memory/layer.ts"
import { type Client, makeHarness, pump, pushMessage } from "../protocol/harness.ts"
import { fakeNode, FakeNodeClient, options, push, request, requestTo, subscribe, TestStorage, withStorageFaults } from "../endpoint/harness.ts"
import { rawHttp } from "../connection/raw.ts"

const NOW = Date.UTC(2026, 10, 21, 12, 0, 0)
const CHID = "eac8e1de-cddf-42d6-9919-a7b0e0f41e59"
const CHID2 = "7dbb5bdb-0845-4535-98c9-0f34a94e2e7b"

/** Lines of a Prometheus text, without comments. */
const samples = (text: string): Map<string, string> =>
  new Map(
    text.split("\n").filter((l) => l !== "" && !l.startsWith("#")).map((l) => {
      const at = l.lastIndexOf(" ")
      return [l.slice(0, at), l.slice(at + 1)] as const
    })
  )

describe("the registry", () => {
  it("counters, gauges, sampled gauges and timers; Prometheus text with TYPE lines and sanitized names", () => {
    const m = makeMetrics()
    m.counter("ua.command.hello", { uaid: "new" }).inc()
    m.counter("ua.command.hello", { uaid: "new" }).inc(2)
    m.counter("ua.command.hello", { uaid: "existing" }).inc()
    m.counter("odd-name.x", { "a.b": "q\"uo\\te\nnl" }).inc()
    const g = m.gauge("request.in_flight")
    g.add(3)
    g.add(-1)
    let connections = 7
    const unregister = m.sampled("ua.connections", {}, () => connections)
    const t = m.timer("notification.route_time", { outcome: "direct" })
    t.record(0.5)
    t.record(3)
    t.record(20_000)

    assert.strictEqual(m.value("ua.command.hello", { uaid: "new" }), 3)
    assert.strictEqual(m.value("request.in_flight"), 2)
    assert.strictEqual(m.value("ua.connections"), 7)
    connections = 9
    assert.strictEqual(m.value("ua.connections"), 9)
    assert.strictEqual(m.value("notification.route_time", { outcome: "direct" }), 3)
    assert.isUndefined(m.value("never.touched"))
    assert.throws(() => m.gauge("ua.command.hello"), /is a counter/)

    const text = m.prometheus()
    assert.include(text, "# HELP ua_command_hello_total Hello commands answered\n")
    assert.include(text, "# TYPE ua_command_hello_total counter\n")
    assert.include(text, "# TYPE request_in_flight gauge\n")
    assert.include(text, "# TYPE notification_route_time_milliseconds histogram\n")
    assert.include(text, "# TYPE odd_name_x_total counter\n")
    const s = samples(text)
    assert.strictEqual(s.get("ua_command_hello_total{uaid=\"new\"}"), "3")
    assert.strictEqual(s.get("ua_command_hello_total{uaid=\"existing\"}"), "1")
    assert.strictEqual(s.get("odd_name_x_total{a_b=\"q\\\"uo\\\\te\\nnl\"}"), "1")
    assert.strictEqual(s.get("request_in_flight"), "2")
    assert.strictEqual(s.get("ua_connections"), "9")
    assert.strictEqual(s.get("notification_route_time_milliseconds_bucket{outcome=\"direct\",le=\"1\"}"), "1")
    assert.strictEqual(s.get("notification_route_time_milliseconds_bucket{outcome=\"direct\",le=\"2\"}"), "1")
    assert.strictEqual(s.get("notification_route_time_milliseconds_bucket{outcome=\"direct\",le=\"5\"}"), "2")
    assert.strictEqual(s.get("notification_route_time_milliseconds_bucket{outcome=\"direct\",le=\"10000\"}"), "2")
    assert.strictEqual(s.get("notification_route_time_milliseconds_bucket{outcome=\"direct\",le=\"+Inf\"}"), "3")
    assert.strictEqual(s.get("notification_route_time_milliseconds_sum{outcome=\"direct\"}"), "20003.5")
    assert.strictEqual(s.get("notification_route_time_milliseconds_count{outcome=\"direct\"}"), "3")
    // Every sample line is a valid Prometheus name, labels and a number.
    for (const line of text.split("\n").filter((l) => l !== "" && !l.startsWith("#"))) {
      assert.match(line, /^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\.)*",?)*\})? (-?[0-9.e+]+|\+Inf|NaN)$/)
    }

    unregister()
    assert.strictEqual(m.value("ua.connections"), 0)
    assert.strictEqual(prometheusName("9lives.x", "gauge"), "_9lives_x")
  })
})

// ── connection node: the session machine ─────────────────────────────────────────────────────────

const SessionParts = Layer.mergeAll(
  layerMemory({ routerTable: "router", messageTablePrefix: "message", noTableRotation: false }),
  EndpointCrypto.layerTest,
  observabilityLayerMemory()
)

const ack = (client: Client, code = 100) =>
  client.frame({
    messageType: "ack",
    updates: client.of("notification").map((f) => ({ channelID: f["channelID"] as string, version: f["version"] as string, code }))
  })

describe("connection node metrics", () => {
  it.effect("a scripted exchange: hello, register, direct and stored deliveries, acks, nacks, unregister, ghost", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(NOW)
      const metrics = yield* Metrics
      const harness = yield* makeHarness()

      const a = yield* harness.connect()
      yield* a.frame({ messageType: "hello", use_webpush: true })
      const uaid = a.of("hello")[0]!["uaid"] as string
      yield* a.frame({ messageType: "register", channelID: CHID })
      yield* a.frame({ messageType: "register", channelID: CHID2 })

      // Direct: delivered, acked.
      yield* pushMessage(harness, uaid, CHID, { data: "c2VjcmV0" })
      yield* pump(a)
      yield* ack(a)
      // Stored: written while connected, poked, drained.
      yield* pushMessage(harness, uaid, CHID2, { direct: false })
      yield* pump(a)
      assert.strictEqual(a.of("notification").length, 2)
      yield* a.frame({
        messageType: "ack",
        updates: [{ channelID: CHID2, version: a.of("notification")[1]!["version"] as string, code: 101 }]
      })
      yield* a.frame({ messageType: "nack", version: "v", code: 302 })
      yield* a.frame({ messageType: "nack", version: "v", code: 999_999 })
      yield* a.frame({ messageType: "unregister", channelID: CHID2, code: 201 })
      yield* a.frame({ messageType: "unregister", channelID: CHID2, code: 123_456 })

      // The same uaid again: hello existing, the older session is kicked (Ghost).
      const b = yield* harness.connect()
      yield* b.frame({ messageType: "hello", uaid, use_webpush: true })
      yield* pump(a)
      // A uaid that was never registered is replaced.
      const c = yield* harness.connect()
      yield* c.frame({ messageType: "hello", uaid: "deadbeefdeadbeefdeadbeefdeadbeef", use_webpush: true })

      const v = (name: string, tags?: Record<string, string>) => metrics.value(name, tags)
      assert.strictEqual(v("ua.command.hello", { uaid: "new" }), 1)
      assert.strictEqual(v("ua.command.hello", { uaid: "existing" }), 1)
      assert.strictEqual(v("ua.command.hello", { uaid: "reassigned" }), 1)
      assert.strictEqual(v("ua.command.register"), 2)
      assert.strictEqual(v("ua.notification.sent", { source: "direct" }), 1)
      assert.strictEqual(v("ua.notification.sent", { source: "stored" }), 1)
      assert.strictEqual(v("notification.message.retrieved"), 1)
      assert.strictEqual(v("ua.command.ack", { source: "direct", code: "100" }), 1)
      assert.strictEqual(v("ua.command.ack", { source: "stored", code: "101" }), 1)
      assert.strictEqual(v("ua.command.nack", { code: "302" }), 1)
      assert.strictEqual(v("ua.command.nack", { code: "0" }), 1)
      assert.strictEqual(v("ua.command.unregister", { code: "201" }), 1)
      assert.strictEqual(v("ua.command.unregister", { code: "other" }), 1)
      assert.strictEqual(v("ua.connection.closed", { code: "1011", reason: "Ghost" }), 1)

      // The same numbers in the Prometheus text.
      const s = samples(metrics.prometheus())
      assert.strictEqual(s.get("ua_command_hello_total{uaid=\"new\"}"), "1")
      assert.strictEqual(s.get("ua_command_register_total"), "2")
      assert.strictEqual(s.get("ua_notification_sent_total{source=\"direct\"}"), "1")
      assert.strictEqual(s.get("notification_message_retrieved_total"), "1")
      assert.strictEqual(s.get("ua_command_ack_total{code=\"101\",source=\"stored\"}"), "1")
      assert.strictEqual(s.get("ua_command_nack_total{code=\"302\"}"), "1")
      assert.strictEqual(s.get("ua_command_unregister_total{code=\"other\"}"), "1")
      assert.strictEqual(s.get("ua_connection_closed_total{code=\"1011\",reason=\"Ghost\"}"), "1")
      // Client-chosen codes do not make new series.
      assert.notInclude(metrics.prometheus(), "999999")
      assert.notInclude(metrics.prometheus(), "123456")
    }).pipe(Effect.provide(SessionParts)))

  it.effect("too many stored messages: ua.expiration; unacked direct messages saved at disconnect: stored{disconnect}", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(NOW)
      const metrics = yield* Metrics
      const harness = yield* makeHarness({ msgLimit: 2 })
      const a = yield* harness.connect()
      yield* a.frame({ messageType: "hello", use_webpush: true })
      const uaid = a.of("hello")[0]!["uaid"] as string
      // Three sites: msg_limit guards several subscriptions' backlogs together (one counts up to half of it).
      const sites = [CHID, crypto.randomUUID(), crypto.randomUUID()]
      for (const channelID of sites) yield* a.frame({ messageType: "register", channelID })
      yield* pushMessage(harness, uaid, CHID)
      yield* pump(a)
      yield* a.feed({ _tag: "SocketClosed" })
      assert.strictEqual(metrics.value("notification.message.stored", { reason: "disconnect" }), 1)

      for (let i = 0; i < 3; i++) {
        yield* TestClock.adjust(1)
        yield* pushMessage(harness, uaid, sites[1 + (i % 2)]!, { direct: false })
      }
      const b = yield* harness.connect()
      yield* b.frame({ messageType: "hello", uaid, use_webpush: true })
      // The client gets msg_limit of them; once it has acked those, the user is dropped.
      const got = b.of("notification")
      assert.strictEqual(got.length, 2)
      assert.isUndefined(metrics.value("ua.expiration", { reason: "too_many_messages" }))
      yield* b.frame({ messageType: "ack", updates: got.map((f) => ({ channelID: f["channelID"] as string, version: f["version"] as string })) })
      assert.strictEqual(metrics.value("ua.expiration", { reason: "too_many_messages" }), 1)
    }).pipe(Effect.provide(SessionParts)))
})

// ── endpoint node: over HTTP ─────────────────────────────────────────────────────────────────────

const ObservedEndpoint = EndpointServer.layerServer(options).pipe(
  Layer.provideMerge(MetricsListener.layer({ port: 0, host: "127.0.0.1" })),
  Layer.provideMerge(WebPushRouter.layer),
  Layer.provideMerge(FakeNodeClient),
  Layer.provideMerge(Layer.mergeAll(TestStorage, EndpointCrypto.layerTest, observabilityLayerMemory()))
)

const messageIdOf = (location: string | string[] | undefined) => String(location).slice(`${TEST_ENDPOINT_URL}/m/`.length)

describe("receipt metrics", () => {
  it.effect("a push with a receipt counts as requested; each recorded outcome by kind", () =>
    Effect.sync(() => {
      const metrics = makeMetrics()
      const sink = metricsSink(metrics)
      sink(domainEvent("notification.accepted.1", "u", 0, { channelId: "c", version: "a", ttl: 60 }))
      sink(domainEvent("notification.accepted.1", "u", 0, { channelId: "c", version: "b", ttl: 60, receipt: "r" }))
      sink(domainEvent("notification.receipt.1", "u", 1, { version: "b", receipt: "r", outcome: "acknowledged" }))
      sink(domainEvent("notification.receipt.1", "u", 1, { version: "c", receipt: "r", outcome: "expired" }))
      const s = samples(metrics.prometheus())
      assert.strictEqual(s.get("notification_receipt_requested_total"), "1")
      assert.strictEqual(s.get("notification_receipt_total{outcome=\"acknowledged\"}"), "1")
      assert.strictEqual(s.get("notification_receipt_total{outcome=\"expired\"}"), "1")
    }))
})

describe("limit metrics", () => {
  it.effect("registers and unregisters refused at a limit, by command and reason", () =>
    Effect.sync(() => {
      const metrics = makeMetrics()
      const sink = metricsSink(metrics)
      sink(domainEvent("channel.refused.1", "u", 0, { channelId: "c", command: "register", reason: "too_many_channels" }))
      sink(domainEvent("channel.refused.1", "u", 0, { channelId: "c", command: "unregister", reason: "busy" }))
      sink(domainEvent("channel.refused.1", "u", 0, { channelId: "d", command: "unregister", reason: "busy" }))
      const s = samples(metrics.prometheus())
      assert.strictEqual(s.get("ua_command_refused_total{command=\"register\",reason=\"too_many_channels\"}"), "1")
      assert.strictEqual(s.get("ua_command_refused_total{command=\"unregister\",reason=\"busy\"}"), "2")
    }))
})

describe("endpoint node metrics", () => {
  layer(ObservedEndpoint, { excludeTestServices: true })((it) => {
    it.effect("GET /metrics after direct, stored, dropped and refused notifications and a cancel", () =>
      Effect.gen(function*() {
        const metrics = yield* Metrics
        const direct = yield* subscribe({ nodeId: yield* fakeNode(200) })
        const offline = yield* subscribe({ nodeId: yield* fakeNode(404) })
        const idle = yield* subscribe()
        assert.strictEqual((yield* push(direct, { ttl: 60 })).status, 201)
        const stored = yield* push(offline, { ttl: 60 })
        assert.strictEqual(stored.status, 201)
        assert.strictEqual((yield* push(idle, { ttl: 0 })).status, 201)
        assert.strictEqual((yield* request({ path: "/wpush/v1/not-a-token", headers: { ttl: 60 } })).status, 404)
        assert.strictEqual((yield* request({ path: "/wpush/v3/x", headers: { ttl: 60 } })).status, 404)
        assert.strictEqual((yield* request({ method: "PATCH", path: "/health" })).status, 405)
        const cancel = yield* request({ method: "DELETE", path: `/m/${messageIdOf(stored.headers["location"])}` })
        assert.strictEqual(cancel.status, 204)

        assert.strictEqual((yield* request({ method: "GET", path: "/metrics" })).status, 404, "not on the public port")
        const scrape = yield* requestTo((yield* MetricsListener).port, { method: "GET", path: "/metrics" })
        assert.strictEqual(scrape.status, 200)
        assert.strictEqual(scrape.headers["content-type"], PROMETHEUS_CONTENT_TYPE)
        assert.include(scrape.text, "# TYPE notification_route_time_milliseconds histogram\n")
        assert.include(scrape.text, "# TYPE request_in_flight gauge\n")
        const s = samples(scrape.text)
        assert.strictEqual(s.get("notification_received_total"), "3")
        assert.strictEqual(s.get("notification_routed_total{outcome=\"direct\"}"), "1")
        assert.strictEqual(s.get("notification_routed_total{outcome=\"stored\"}"), "1")
        assert.strictEqual(s.get("notification_routed_total{outcome=\"dropped\"}"), "1")
        assert.strictEqual(s.get("notification_route_time_milliseconds_count{outcome=\"direct\"}"), "1")
        assert.strictEqual(s.get("notification_message_stored_total{reason=\"offline\"}"), "1")
        assert.strictEqual(s.get("notification_message_expired_total"), "1")
        assert.strictEqual(s.get("notification_message_deleted_total"), "1")
        assert.strictEqual(s.get("request_error_total{errno=\"102\",status=\"404\"}"), "2")
        assert.strictEqual(s.get("request_error_total{errno=\"none\",status=\"405\"}"), "1")
        assert.strictEqual(s.get("request_time_milliseconds_count{route=\"push\",status=\"201\"}"), "3")
        assert.strictEqual(s.get("request_time_milliseconds_count{route=\"push\",status=\"404\"}"), "2")
        assert.strictEqual(s.get("request_time_milliseconds_count{route=\"message\",status=\"204\"}"), "1")
        assert.strictEqual(s.get("request_time_milliseconds_count{route=\"health\",status=\"405\"}"), "1")
        // Scrapes come on the private listener: they are not requests of the API.
        assert.strictEqual(s.get("request_in_flight"), "0")
        assert.strictEqual(metrics.value("request.in_flight"), 0)
      }))

    it.effect("storage failures: errno 201 (503) counted; a failed routing is notification.routed{failed}", () =>
      Effect.gen(function*() {
        const metrics = yield* Metrics
        const { events } = yield* EventLogMemory
        const sub = yield* subscribe({ nodeId: yield* fakeNode(404) })
        const refused = yield* withStorageFaults(["getUser"], push(sub, { ttl: 60 }))
        assert.strictEqual(refused.status, 503)
        assert.strictEqual(metrics.value("request.error", { errno: "201", status: "503" }), 1)
        const failed = yield* withStorageFaults(["saveMessage"], push(sub, { ttl: 60 }))
        assert.strictEqual(failed.status, 503)
        assert.strictEqual(metrics.value("notification.routed", { outcome: "failed" }), 1)
        assert.strictEqual(metrics.value("request.error", { errno: "201", status: "503" }), 2)
        const routed = events.filter((e) => e.uaid === sub.uaid && e.type === "notification.routed.1")
        assert.deepStrictEqual(routed.map((e) => e.type === "notification.routed.1" && e.data.outcome), ["failed"])
      }))
  })
})

describe("metrics listener: what Node cannot hand to it", () => {
  layer(MetricsListener.layer({ port: 0, host: "127.0.0.1", clientRequestTimeoutMs: 300 }).pipe(Layer.provideMerge(Metrics.layerNoop)), { excludeTestServices: true })((it) => {
    it.effect("stalled headers are answered 408 soon after client_request_timeout, an unparsable request 400, both with the error JSON", () =>
      Effect.gen(function*() {
        const { port } = yield* MetricsListener
        const started = Date.now()
        const stalled = yield* Effect.promise(() => rawHttp(port, "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Half: a", "", 5_000))
        assert.match(stalled.text, /^HTTP\/1\.1 408 /)
        assert.include(stalled.text, "\"errno\":null")
        assert.isBelow(Date.now() - started, 2_000)
        const garbled = yield* Effect.promise(() => rawHttp(port, "GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", "", 1_000))
        assert.match(garbled.text, /^HTTP\/1\.1 400 /)
        assert.include(garbled.text, "\"message\":\"The request could not be parsed\"")
      }))
  })
})
