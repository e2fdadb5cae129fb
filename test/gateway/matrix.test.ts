/**
 * The Matrix push gateway on the endpoint's real HTTP server (in-memory storage, fake connection
 * nodes: the users here are offline, so what is pushed is stored and read back): the spec's example
 * bodies, full and `event_id_only`; which pushkeys are rejected; a homeserver's retry; the message
 * shrunk to 4096 bytes; urgency and TTL; the Matrix errors; a storage outage; the per-pushkey rate
 * limit; the discovery answer; and the gateway off under `require_vapid`.
 */
import * as http from "node:http"
import { assert, describe, layer } from "@effect/vitest"
import { Effect, Layer, Logger } from "effect"
import { TEST_ENDPOINT_URL } from "../../src/crypto/endpoint.ts"
import { LOG_LINES } from "../../src/gateway/matrix.ts"
import { MAX_DEVICES } from "../../src/gateway/matrixRequest.ts"
import { NO_LIMITS } from "../../src/endpoint/rateLimits.ts"
import { opaqueId } from "../../src/observability/opaque.ts"
import type { Notification } from "../../src/domain/notification.ts"
import { METRICS } from "../../src/observability/catalog.ts"
import { Metrics } from "../../src/observability/Metrics.ts"
import { boundPort } from "../../src/endpoint/server.ts"
import {
  endpointWith,
  FakeNodeClient,
  messagesOf,
  options,
  push,
  request,
  subscribe,
  type Subscription,
  TestEndpoint,
  vapidKeys,
  withStorageFaults
} from "../endpoint/harness.ts"

const NOTIFY = "/_matrix/push/v1/notify"

/** Log lines of the gateway's layers that capture them. */
const logged: Array<{ readonly message: unknown; readonly level: string; readonly annotations: Record<string, unknown> }> = []
const captureLogs = Logger.layer([Logger.map(Logger.formatStructured, (entry) => void logged.push(entry))])

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

/**
 * 64 spellings of `sub`'s endpoint that all name it: other schemes and hosts, credentials, a path
 * prefix or dot segments, no version segment, an empty or other query, a fragment.
 */
const spellingsOf = (sub: Subscription): ReadonlyArray<string> => {
  const token = sub.path.split("/").pop()
  const origins = [
    TEST_ENDPOINT_URL,
    TEST_ENDPOINT_URL.toUpperCase(),
    TEST_ENDPOINT_URL.replace("http:", "https:"),
    TEST_ENDPOINT_URL.replace("localhost", "127.0.0.1"),
    "https://push.example.com",
    TEST_ENDPOINT_URL.replace("//", "//u:p@"),
    `${TEST_ENDPOINT_URL}/x/..`,
    `${TEST_ENDPOINT_URL}/prefix`
  ]
  return origins.flatMap((origin) =>
    [`/wpush/v1/${token}`, `/wpush/${token}`].flatMap((path) => ["", "?", "#x", "?k=1"].map((suffix) => `${origin}${path}${suffix}`)))
}

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

    it.effect("rejected: not a URL, not a push endpoint's path, a token that is not ours, an unsubscribed channel, a v2 endpoint (bound to a VAPID key)", () =>
      Effect.gen(function*() {
        const ours = yield* subscribe()
        const gone = yield* subscribe({ register: false })
        const keys = yield* vapidKeys
        const bound = yield* subscribe({ key: keys.raw })
        const token = ours.path.split("/").pop()
        const foreignPush = "https://updates.push.services.mozilla.com/wpush/v1/gAAAAABnot-a-token-of-ours"
        const badToken = `${TEST_ENDPOINT_URL}/wpush/v1/gAAAAABnot-a-token-of-ours`
        const badVersion = `${TEST_ENDPOINT_URL}/wpush/v9/${token}`
        const notUrl = "V2h5IG9uIGVhcnRoIGRpZCB5b3UgZGVjb2RlIHRoaXM/"
        const otherPath = `${TEST_ENDPOINT_URL}/m/${token}`
        assert.isTrue(bound.path.startsWith("/wpush/v2/"))
        const before = yield* outcome("rejected")
        const reply = yield* notify(fullRequest([foreignPush, ours.endpoint, notUrl, badToken, gone.endpoint, badVersion, bound.endpoint, otherPath, notUrl]))
        assert.strictEqual(reply.status, 200)
        assert.deepStrictEqual(reply.json(), { rejected: [foreignPush, notUrl, badToken, gone.endpoint, badVersion, bound.endpoint, otherPath] })
        assert.strictEqual((yield* storedMessages(ours)).length, 1)
        assert.deepStrictEqual(yield* storedMessages(bound), [])
        assert.strictEqual((yield* outcome("rejected")) - before, 8)
      }))

    it.effect("our endpoint under any origin the server may answer on (https behind a TLS proxy, 127.0.0.1, another name, a path prefix) is ours, not rejected", () =>
      Effect.gen(function*() {
        const origins = ["https://localhost:8082", "http://127.0.0.1:8082", "https://push.example.com", "https://push.example.com/prefix", "http://[::1]:8082"]
        for (const [i, origin] of origins.entries()) {
          const sub = yield* subscribe()
          const reply = yield* notify(fullRequest([`${origin}${sub.path}`], { event_id: `$origin-${i}` }))
          assert.deepStrictEqual([reply.status, reply.json()], [200, { rejected: [] }], origin)
          assert.strictEqual((yield* storedMessages(sub)).length, 1, origin)
        }
      }))

    it.effect("one subscription under 64 spellings in one notify is pushed once, with or without event_id; a retry under other spellings is a duplicate", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        const spellings = spellingsOf(sub)
        assert.strictEqual(new Set(spellings).size, 64)
        const [delivered, duplicate] = [yield* outcome("delivered"), yield* outcome("duplicate")]
        const reply = yield* notify(fullRequest(spellings, { event_id: "$spelled" }))
        assert.deepStrictEqual([reply.status, reply.json()], [200, { rejected: [] }])
        assert.strictEqual((yield* storedMessages(sub)).length, 1)
        assert.strictEqual((yield* outcome("delivered")) - delivered, 1)
        assert.strictEqual((yield* outcome("duplicate")) - duplicate, 63)
        // The homeserver's retry, under the spellings in another order: not pushed again.
        assert.deepStrictEqual((yield* notify(fullRequest(spellings.toReversed(), { event_id: "$spelled" }))).json(), { rejected: [] })
        assert.strictEqual((yield* storedMessages(sub)).length, 1)
        // Without event_id (a badge): once per request.
        const { event_id: _eventId, ...badge } = fullRequest(spellings).notification
        assert.deepStrictEqual((yield* notify({ notification: badge })).json(), { rejected: [] })
        assert.strictEqual((yield* storedMessages(sub)).length, 2)
      }))

    it.effect("a subscription gone is rejected under each of its spellings", () =>
      Effect.gen(function*() {
        const gone = yield* subscribe({ register: false })
        const spellings = spellingsOf(gone).slice(0, 5)
        assert.deepStrictEqual((yield* notify(fullRequest(spellings))).json(), { rejected: spellings })
      }))

    it.effect(`more than ${MAX_DEVICES} devices: 413 M_TOO_LARGE and nothing pushed (none rejected: the homeserver keeps its pushers and retries)`, () =>
      Effect.gen(function*() {
        const subs = yield* Effect.forEach(Array.from({ length: MAX_DEVICES + 1 }), () => subscribe())
        const reply = yield* notify(fullRequest(subs.map((sub) => sub.endpoint)))
        assert.deepStrictEqual([reply.status, reply.json()], [413, { errcode: "M_TOO_LARGE", error: `A notification may name at most ${MAX_DEVICES} devices, not ${MAX_DEVICES + 1}` }])
        for (const sub of subs) assert.deepStrictEqual(yield* storedMessages(sub), [])
        const fits = yield* notify(fullRequest(subs.slice(1).map((sub) => sub.endpoint)))
        assert.deepStrictEqual([fits.status, fits.json()], [200, { rejected: [] }])
        for (const sub of subs.slice(1)) assert.strictEqual((yield* storedMessages(sub)).length, 1)
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
    rateLimits: { perAddress: { perSecond: 1, burst: 2 }, perVapidKey: { perSecond: 0, burst: 1 }, perSubscription: { perSecond: 1, burst: 2 }, trustedProxies: [] }
  }), { excludeTestServices: true })((it) => {
    it.effect("the rate limit is per pushkey, not per address: 429 M_LIMIT_EXCEEDED with retry_after_ms; matrix_gateway_ttl is the TTL", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        const other = yield* subscribe()
        for (const event of ["$1", "$2"]) assert.strictEqual((yield* notify(fullRequest([sub.endpoint], { event_id: event }))).status, 200)
        const limited = yield* notify(fullRequest([sub.endpoint], { event_id: "$3" }))
        assert.strictEqual(limited.status, 429)
        assert.strictEqual(limited.headers["retry-after"], "1")
        assert.deepStrictEqual(limited.json(), { errcode: "M_LIMIT_EXCEEDED", error: "Too many pushes to this subscription, retry after 1 s", retry_after_ms: 1000 })
        // The same sender, another pushkey: not limited (the homeserver sends for all its users).
        for (const event of ["$1", "$2"]) assert.strictEqual((yield* notify(fullRequest([other.endpoint], { event_id: event }))).status, 200)
        // A retry of an event already pushed costs nothing.
        assert.strictEqual((yield* notify(fullRequest([sub.endpoint], { event_id: "$1" }))).status, 200)
        const stored = yield* storedMessages(sub)
        assert.deepStrictEqual(stored.map((m) => m.ttl), [600, 600])
      }))

    it.effect("the rate limit is per subscription: another spelling of the same pushkey draws on the same bucket, and a retry under it is a duplicate", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        const [a, b, c] = spellingsOf(sub).filter((_, i) => i % 9 === 0)
        assert.strictEqual((yield* notify(fullRequest([a!], { event_id: "$1" }))).status, 200)
        assert.strictEqual((yield* notify(fullRequest([b!], { event_id: "$2" }))).status, 200)
        const limited = yield* notify(fullRequest([c!], { event_id: "$3" }))
        assert.deepStrictEqual([limited.status, limited.json().errcode], [429, "M_LIMIT_EXCEEDED"])
        assert.strictEqual((yield* notify(fullRequest([c!], { event_id: "$1" }))).status, 200)
        assert.strictEqual((yield* storedMessages(sub)).length, 2)
      }))

    it.effect("the subscription's bucket is the push path's: pushes to it from anyone and the gateway's notifies draw on one", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        assert.deepStrictEqual([(yield* push(sub)).status, (yield* push(sub)).status], [201, 201])
        const limited = yield* notify(fullRequest([sub.endpoint], { event_id: "$after-pushes" }))
        assert.deepStrictEqual([limited.status, limited.json().errcode], [429, "M_LIMIT_EXCEEDED"])
        assert.strictEqual((yield* storedMessages(sub)).length, 2)
      }))
  })

  layer(endpointWith(FakeNodeClient, {
    ...options,
    rateLimits: { perAddress: { perSecond: 1, burst: 2 }, perVapidKey: { perSecond: 0, burst: 1 }, perSubscription: { perSecond: 0, burst: 1 }, trustedProxies: ["127.0.0.1"] }
  }), { excludeTestServices: true })((it) => {
    const from = (address: string, body: unknown) =>
      request({ method: "POST", path: NOTIFY, headers: { "content-type": "application/json", "x-forwarded-for": address }, body: JSON.stringify(body) })

    it.effect("per address (behind a listed proxy): 429 M_LIMIT_EXCEEDED with Retry-After and retry_after_ms, that address only; pushes count too", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        for (const event of ["$a1", "$a2"]) assert.strictEqual((yield* from("203.0.113.20", fullRequest([sub.endpoint], { event_id: event }))).status, 200)
        const limited = yield* from("203.0.113.20", fullRequest([sub.endpoint], { event_id: "$a3" }))
        assert.strictEqual(limited.status, 429)
        assert.strictEqual(limited.headers["retry-after"], "1")
        assert.strictEqual(limited.headers["connection"], "close")
        assert.deepStrictEqual(limited.json(), { errcode: "M_LIMIT_EXCEEDED", error: "Too many requests from this address, retry after 1 s", retry_after_ms: 1000 })
        const other = yield* subscribe()
        assert.strictEqual((yield* from("203.0.113.21", fullRequest([other.endpoint], { event_id: "$a3" }))).status, 200, "another sender")
        // An address that pushed its burst has no notify left.
        for (let i = 0; i < 2; i++) assert.strictEqual((yield* push(sub, { "x-forwarded-for": "203.0.113.22" })).status, 201)
        const limitedAgain = yield* from("203.0.113.22", fullRequest([other.endpoint], { event_id: "$a4" }))
        assert.deepStrictEqual([limitedAgain.status, limitedAgain.json().error], [429, "Too many requests from this address, retry after 1 s"])
      }))

    it.effect("per address before the body is read: a sender over its limit is answered at once, though its body never comes", () =>
      Effect.gen(function*() {
        for (let i = 0; i < 2; i++) assert.strictEqual((yield* from("203.0.113.30", { notification: { devices: [] } })).status, 200)
        const port = yield* boundPort
        const started = Date.now()
        const status = yield* Effect.callback<number>((resume) => {
          const req = http.request({
            host: "127.0.0.1",
            port,
            method: "POST",
            path: NOTIFY,
            headers: { "content-type": "application/json", "content-length": 60_000, "x-forwarded-for": "203.0.113.30" },
            agent: false
          }, (res) => {
            res.resume()
            resume(Effect.succeed(res.statusCode ?? 0))
          })
          req.on("error", () => undefined)
          req.write("{\"notification\":")
        })
        assert.strictEqual(status, 429)
        assert.isBelow(Date.now() - started, 2_000)
      }))
  })

  layer(endpointWith(FakeNodeClient, { ...options, rateLimits: NO_LIMITS }).pipe(Layer.provide(captureLogs)), { excludeTestServices: true })((it) => {
    it.effect("each rejected pushkey is logged once at info with its reason, by opaque id; each refused request with its status and reason", () =>
      Effect.gen(function*() {
        logged.length = 0
        const ours = yield* subscribe()
        const gone = yield* subscribe({ register: false })
        const notOurs = `${TEST_ENDPOINT_URL}/wpush/v1/gAAAAABnot-a-token-of-ours`
        const keys = [notOurs, "not a url", gone.endpoint, `${TEST_ENDPOINT_URL}/m/x`]
        yield* notify(fullRequest([ours.endpoint, ...keys]))
        yield* notify(fullRequest([ours.endpoint, ...keys], { event_id: "$again" }))
        const rejected = logged.filter((entry) => String(entry.message).startsWith("matrix pushkey rejected"))
        assert.deepStrictEqual(rejected.map((entry) => entry.annotations["pushkey"]), keys.map(opaqueId))
        assert.deepStrictEqual(rejected.map((entry) => entry.level), ["INFO", "INFO", "INFO", "INFO"])
        assert.deepStrictEqual(rejected.map((entry) => entry.annotations["reason"]), [
          "its token does not open with this server's key (not a subscription of this server)",
          "not an http(s) URL",
          "a push to it is answered 410: No such subscription",
          "its path is not a push endpoint's (/wpush/v1/{token})"
        ])
        yield* notify("{\"notification\": [")
        yield* notify({ notification: { devices: {} } })
        const refusedLines = logged.filter((entry) => entry.message === "matrix notify refused")
        assert.deepStrictEqual(refusedLines.map((entry) => entry.annotations), [
          { status: 400, errcode: "M_NOT_JSON", reason: "The body is not JSON" },
          { status: 400, errcode: "M_BAD_JSON", reason: "notification.devices must be a list" }
        ])
        // Tokens and pushkeys stay out of the log.
        const text = JSON.stringify(logged)
        for (const secret of [ours.path.split("/").pop()!, gone.path.split("/").pop()!, "gAAAAABnot-a-token-of-ours"]) assert.notInclude(text, secret)
      }))

    it.effect(`a flood of refused requests writes at most ${LOG_LINES} lines a minute`, () =>
      Effect.gen(function*() {
        yield* Effect.forEach(Array.from({ length: LOG_LINES + 20 }), (_, i) => notify(`not json ${i}`), { concurrency: 8 })
        const lines = logged.filter((entry) => entry.message === "matrix notify refused" || String(entry.message).startsWith("matrix pushkey rejected"))
        assert.isAtMost(lines.length, LOG_LINES)
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
