/**
 * The Matrix push gateway on the endpoint's real HTTP server (in-memory storage, fake connection
 * nodes: the users here are offline, so what is pushed is stored and read back): the spec's example
 * bodies, full and `event_id_only`; which pushkeys are rejected; a homeserver's retry; the message
 * shrunk to 4096 bytes; urgency and TTL; the Matrix errors; a storage outage; the per-pushkey rate
 * limit; the discovery answer; and the gateway off under `require_vapid`.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Effect } from "effect"
import { TEST_ENDPOINT_URL } from "../../src/crypto/endpoint.ts"
import type { Notification } from "../../src/domain/notification.ts"
import { METRICS } from "../../src/observability/catalog.ts"
import { Metrics } from "../../src/observability/Metrics.ts"
import {
  endpointWith,
  FakeNodeClient,
  messagesOf,
  options,
  request,
  subscribe,
  type Subscription,
  TestEndpoint,
  vapidKeys,
  withStorageFaults
} from "../endpoint/harness.ts"

const NOTIFY = "/_matrix/push/v1/notify"

/** The spec's example notify request, for these pushkeys (one device each). */
const fullRequest = (pushkeys: ReadonlyArray<string>, overrides: Record<string, unknown> = {}) => ({
  notification: {
    content: { body: "I'm floating in a most peculiar way.", msgtype: "m.text" },
    counts: { missed_calls: 1, unread: 2 },
    devices: pushkeys.map((pushkey) => ({
      app_id: "org.matrix.matrixConsole.ios",
      data: {},
      pushkey,
      pushkey_ts: 12345678,
      tweaks: { sound: "bing" }
    })),
    event_id: "$3957tyerfgewrf384",
    prio: "high",
    room_alias: "#exampleroom:matrix.org",
    room_id: "!slw48wfj34rtnrf:example.com",
    room_name: "Mission Control",
    sender: "@exampleuser:matrix.org",
    sender_display_name: "Major Tom",
    type: "m.room.message",
    ...overrides
  }
})

/** The same event as a pusher with `"format": "event_id_only"` sends it. */
const eventIdOnlyRequest = (pushkeys: ReadonlyArray<string>, eventId = "$3957tyerfgewrf384") => ({
  notification: {
    event_id: eventId,
    room_id: "!slw48wfj34rtnrf:example.com",
    counts: { unread: 2, missed_calls: 1 },
    prio: "high",
    devices: pushkeys.map((pushkey) => ({
      app_id: "org.unifiedpush.example",
      pushkey,
      pushkey_ts: 12345678,
      data: { format: "event_id_only" },
      tweaks: {}
    }))
  }
})

/** What the device gets for `fullRequest`: the notification without `devices`. */
const { devices: _devices, ...fullMessage } = fullRequest([]).notification

const notify = (body: unknown) =>
  request({ method: "POST", path: NOTIFY, headers: { "content-type": "application/json" }, body: typeof body === "string" ? body : JSON.stringify(body) })

/** The stored messages of `sub`, their `data` decoded. */
const storedMessages = (sub: Subscription) =>
  Effect.map(messagesOf(sub), (messages) =>
    messages.map((m: Notification) => ({ ...m, json: m.data === undefined ? undefined : JSON.parse(Buffer.from(m.data, "base64url").toString("utf8")) })))

const outcome = (name: "delivered" | "rejected" | "duplicate" | "failed") =>
  Effect.map(Metrics, (metrics) => metrics.value(METRICS.matrixNotify.name, { outcome: name }) ?? 0)

describe("Matrix push gateway", () => {
  layer(TestEndpoint, { excludeTestServices: true })((it) => {
    it.effect("the spec's example: the device's message is the notification without devices, TTL one day, urgency high, no encryption", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        const reply = yield* notify(fullRequest([sub.endpoint]))
        assert.strictEqual(reply.status, 200)
        assert.strictEqual(reply.headers["content-type"], "application/json")
        assert.strictEqual(reply.headers["access-control-allow-origin"], "*")
        assert.deepStrictEqual(reply.json(), { rejected: [] })
        const [stored, ...more] = yield* storedMessages(sub)
        assert.deepStrictEqual(more, [])
        assert.deepStrictEqual(stored?.json, { notification: fullMessage })
        assert.strictEqual(stored?.ttl, 86_400)
        assert.strictEqual(stored?.urgency, "high")
        assert.isUndefined(stored?.topic)
        assert.deepStrictEqual(stored?.headers ?? {}, {})
      }))

    it.effect("event_id_only: only event_id, room_id, counts and prio are pushed", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        const body = eventIdOnlyRequest([sub.endpoint], "$event-id-only")
        const reply = yield* notify(body)
        assert.deepStrictEqual([reply.status, reply.json()], [200, { rejected: [] }])
        const [stored] = yield* storedMessages(sub)
        assert.deepStrictEqual(stored?.json, {
          notification: { event_id: "$event-id-only", room_id: "!slw48wfj34rtnrf:example.com", counts: { unread: 2, missed_calls: 1 }, prio: "high" }
        })
      }))

    it.effect("rejected: a foreign URL, not a URL, a token that is not ours, an unsubscribed channel, a v2 endpoint (bound to a VAPID key)", () =>
      Effect.gen(function*() {
        const ours = yield* subscribe()
        const gone = yield* subscribe({ register: false })
        const keys = yield* vapidKeys
        const bound = yield* subscribe({ key: keys.raw })
        const foreign = `https://push.example.org${ours.path}`
        const badToken = `${TEST_ENDPOINT_URL}/wpush/v1/gAAAAABnot-a-token-of-ours`
        const badVersion = `${TEST_ENDPOINT_URL}/wpush/v9/${ours.path.split("/").pop()}`
        const notUrl = "V2h5IG9uIGVhcnRoIGRpZCB5b3UgZGVjb2RlIHRoaXM/"
        const otherPath = `${TEST_ENDPOINT_URL}/m/${ours.path.split("/").pop()}`
        const withQuery = `${ours.endpoint}?x=1`
        assert.isTrue(bound.path.startsWith("/wpush/v2/"))
        const before = yield* outcome("rejected")
        const reply = yield* notify(fullRequest([foreign, ours.endpoint, notUrl, badToken, gone.endpoint, badVersion, bound.endpoint, otherPath, withQuery, notUrl]))
        assert.strictEqual(reply.status, 200)
        assert.deepStrictEqual(reply.json(), { rejected: [foreign, notUrl, badToken, gone.endpoint, badVersion, bound.endpoint, otherPath, withQuery] })
        assert.strictEqual((yield* storedMessages(ours)).length, 1)
        assert.deepStrictEqual(yield* storedMessages(bound), [])
        assert.strictEqual((yield* outcome("rejected")) - before, 9)
      }))

    it.effect("a homeserver's retry of the same event to the same pushkey is answered as delivered and not pushed twice", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        const other = yield* subscribe()
        const [delivered, duplicate] = [yield* outcome("delivered"), yield* outcome("duplicate")]
        const body = fullRequest([sub.endpoint], { event_id: "$retried" })
        assert.deepStrictEqual((yield* notify(body)).json(), { rejected: [] })
        const retry = yield* notify(body)
        assert.deepStrictEqual([retry.status, retry.json()], [200, { rejected: [] }])
        assert.strictEqual((yield* storedMessages(sub)).length, 1)
        // Another event, or the same event for another pushkey, is pushed.
        yield* notify(fullRequest([sub.endpoint, other.endpoint], { event_id: "$next" }))
        yield* notify(fullRequest([other.endpoint], { event_id: "$retried" }))
        assert.strictEqual((yield* storedMessages(sub)).length, 2)
        assert.strictEqual((yield* storedMessages(other)).length, 2)
        assert.strictEqual((yield* outcome("delivered")) - delivered, 4)
        assert.strictEqual((yield* outcome("duplicate")) - duplicate, 1)
      }))

    it.effect("a notification without event_id (counts only) is pushed each time", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        const badge = { notification: { counts: { unread: 0 }, devices: [{ app_id: "a", pushkey: sub.endpoint }] } }
        yield* notify(badge)
        yield* notify(badge)
        const stored = yield* storedMessages(sub)
        assert.deepStrictEqual(stored.map((m) => m.json), [{ notification: { counts: { unread: 0 }, prio: "high" } }, { notification: { counts: { unread: 0 }, prio: "high" } }])
      }))

    it.effect("a big content is dropped to fit 4096 bytes, then other optional fields; event_id, room_id, counts and prio stay", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        const content = { body: "x".repeat(6000), msgtype: "m.text" }
        yield* notify(fullRequest([sub.endpoint], { event_id: "$big", content }))
        const [stored] = yield* storedMessages(sub)
        const { content: _content, ...rest } = fullMessage
        assert.deepStrictEqual(stored?.json, { notification: { ...rest, event_id: "$big" } })
        // Optional fields that are too large go too, the last ones named in the spec's order last.
        const huge = "y".repeat(2500)
        yield* notify(fullRequest([sub.endpoint], { event_id: "$bigger", content, room_name: huge, sender_display_name: huge, extra: huge }))
        const bigger = (yield* storedMessages(sub)).find((m) => m.json.notification.event_id === "$bigger")
        const data = Buffer.from(bigger?.data ?? "", "base64url")
        assert.isAtMost(data.length, 4096)
        // content, then extra (not in the spec), room_alias and room_name went; sender_display_name fits.
        assert.deepStrictEqual(Object.keys(bigger?.json.notification).sort(), ["counts", "event_id", "prio", "room_id", "sender", "sender_display_name", "type"])
        assert.deepStrictEqual(bigger?.json.notification.counts, { missed_calls: 1, unread: 2 })
        assert.strictEqual(bigger?.json.notification.room_id, "!slw48wfj34rtnrf:example.com")
      }))

    it.effect("prio low → urgency low; no prio → high", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        yield* notify(fullRequest([sub.endpoint], { event_id: "$low", prio: "low" }))
        const { prio: _prio, ...withoutPrio } = fullRequest([sub.endpoint], { event_id: "$none" }).notification
        yield* notify({ notification: withoutPrio })
        const stored = yield* storedMessages(sub)
        const byEvent = new Map(stored.map((m) => [m.json.notification.event_id, m]))
        assert.strictEqual(byEvent.get("$low")?.urgency, "low")
        assert.strictEqual(byEvent.get("$low")?.json.notification.prio, "low")
        assert.strictEqual(byEvent.get("$none")?.urgency, "high")
        assert.strictEqual(byEvent.get("$none")?.json.notification.prio, "high")
      }))

    it.effect("storage down: 503 M_UNKNOWN with Retry-After, nothing remembered: the homeserver's retry is pushed", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        const body = fullRequest([sub.endpoint], { event_id: "$outage" })
        const failed = yield* outcome("failed")
        const down = yield* withStorageFaults(["getUser"], notify(body))
        assert.strictEqual(down.status, 503)
        assert.strictEqual(down.headers["retry-after"], "120")
        assert.deepStrictEqual(down.json(), { errcode: "M_UNKNOWN", error: "A database error occurred, retry later" })
        assert.strictEqual((yield* outcome("failed")) - failed, 1)
        const retry = yield* notify(body)
        assert.deepStrictEqual([retry.status, retry.json()], [200, { rejected: [] }])
        assert.strictEqual((yield* storedMessages(sub)).length, 1)
      }))

    it.effect("GET: UnifiedPush gateway discovery", () =>
      Effect.gen(function*() {
        const reply = yield* request({ method: "GET", path: NOTIFY })
        assert.strictEqual(reply.status, 200)
        assert.strictEqual(reply.headers["access-control-allow-origin"], "*")
        assert.deepStrictEqual(reply.json(), { unifiedpush: { gateway: "matrix" } })
      }))

    it.effect("Matrix errors: unknown path 404, other method 405 (M_UNRECOGNIZED), over 64 KiB 413 M_TOO_LARGE, not JSON M_NOT_JSON, not a notify request M_BAD_JSON", () =>
      Effect.gen(function*() {
        const errorOf = (reply: { readonly status: number; readonly json: () => any }) => [reply.status, reply.json().errcode]
        assert.deepStrictEqual(errorOf(yield* request({ method: "GET", path: "/_matrix/push/v2/notify" })), [404, "M_UNRECOGNIZED"])
        assert.deepStrictEqual(errorOf(yield* request({ method: "POST", path: "/_matrix/client/versions", body: "{}" })), [404, "M_UNRECOGNIZED"])
        assert.deepStrictEqual(errorOf(yield* request({ method: "PUT", path: NOTIFY, body: "{}" })), [405, "M_UNRECOGNIZED"])
        assert.deepStrictEqual(errorOf(yield* request({ method: "DELETE", path: NOTIFY })), [405, "M_UNRECOGNIZED"])
        const sub = yield* subscribe()
        const tooLarge = yield* notify(fullRequest([sub.endpoint], { content: { body: "z".repeat(70_000) } }))
        assert.deepStrictEqual(errorOf(tooLarge), [413, "M_TOO_LARGE"])
        assert.strictEqual(tooLarge.headers["connection"], "close")
        assert.deepStrictEqual(yield* storedMessages(sub), [])
        assert.deepStrictEqual(errorOf(yield* notify("{\"notification\": {")), [400, "M_NOT_JSON"])
        for (const body of [{}, { notification: "x" }, { notification: {} }, { notification: { devices: {} } }, { notification: { devices: [{ app_id: "a" }] } }, { notification: { devices: [], event_id: 5 } }, [1]]) {
          const reply = yield* notify(body)
          assert.deepStrictEqual(errorOf(reply), [400, "M_BAD_JSON"], JSON.stringify(body))
          assert.isString(reply.json().error)
        }
        // Nothing of the autopush error JSON.
        assert.deepStrictEqual(Object.keys((yield* notify("nope")).json()).sort(), ["errcode", "error"])
      }))

    it.effect("the bypass of the encryption rule is the gateway's only: the same plaintext POSTed to the endpoint is 400/110", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        const plain = yield* request({ path: sub.path, headers: { ttl: 60, "content-type": "application/json" }, body: JSON.stringify({ notification: fullMessage }) })
        assert.deepStrictEqual([plain.status, plain.json().errno, plain.json().message], [400, 110, "Missing Content-Encoding header"])
        assert.deepStrictEqual(yield* storedMessages(sub), [])
      }))

    it.effect("an empty device list is answered 200 with nothing rejected", () =>
      Effect.gen(function*() {
        const reply = yield* notify({ notification: { event_id: "$e", devices: [] } })
        assert.deepStrictEqual([reply.status, reply.json()], [200, { rejected: [] }])
      }))
  })

  layer(endpointWith(FakeNodeClient, {
    ...options,
    matrixGatewayTtl: 600,
    rateLimits: { perAddress: { perSecond: 1, burst: 2 }, perVapidKey: { perSecond: 0, burst: 1 }, trustedProxies: [] }
  }), { excludeTestServices: true })((it) => {
    it.effect("the rate limit is per pushkey, not per address: 429 M_LIMIT_EXCEEDED with retry_after_ms; matrix_gateway_ttl is the TTL", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        const other = yield* subscribe()
        for (const event of ["$1", "$2"]) assert.strictEqual((yield* notify(fullRequest([sub.endpoint], { event_id: event }))).status, 200)
        const limited = yield* notify(fullRequest([sub.endpoint], { event_id: "$3" }))
        assert.strictEqual(limited.status, 429)
        assert.strictEqual(limited.headers["retry-after"], "1")
        assert.deepStrictEqual(limited.json(), { errcode: "M_LIMIT_EXCEEDED", error: "Too many notifications for this pushkey, retry after 1 s", retry_after_ms: 1000 })
        // The same sender, another pushkey: not limited (the homeserver sends for all its users).
        for (const event of ["$1", "$2"]) assert.strictEqual((yield* notify(fullRequest([other.endpoint], { event_id: event }))).status, 200)
        // A retry of an event already pushed costs nothing.
        assert.strictEqual((yield* notify(fullRequest([sub.endpoint], { event_id: "$1" }))).status, 200)
        const stored = yield* storedMessages(sub)
        assert.deepStrictEqual(stored.map((m) => m.ttl), [600, 600])
      }))
  })

  layer(endpointWith(FakeNodeClient, { ...options, requireVapid: true }), { excludeTestServices: true })((it) => {
    it.effect("with require_vapid the gateway is off: 404 M_UNRECOGNIZED, nothing pushed", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        const discovery = yield* request({ method: "GET", path: NOTIFY })
        assert.deepStrictEqual([discovery.status, discovery.json().errcode], [404, "M_UNRECOGNIZED"])
        const reply = yield* notify(fullRequest([sub.endpoint]))
        assert.deepStrictEqual([reply.status, reply.json().errcode], [404, "M_UNRECOGNIZED"])
        assert.deepStrictEqual(yield* storedMessages(sub), [])
      }))
  })
})
