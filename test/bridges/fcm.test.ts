/**
 * The FCM bridge against a local FCM v1 server and token endpoint (fake-fcm.ts): registration, the
 * message FCM receives, the OAuth token flow (JWT verified, token cached, refreshed once on 401),
 * and every error mapping — recipient gone, auth, quota (429 with FCM's Retry-After), unavailable
 * (503), upstream errors, garbage, timeout, connection loss — with the metric each one counts.
 */
import { assert, describe, layer } from "@effect/vitest"
import { randomBytes } from "node:crypto"
import { Effect, Layer } from "effect"
import type { BridgeOptions } from "../../src/bridges/Bridges.ts"
import { HPKE_CONTENT_TYPE } from "../../src/endpoint/headers.ts"
import { makeMetrics } from "../../src/observability/Metrics.ts"
import { metricsSink } from "../../src/observability/metricsSink.ts"
import { Storage } from "../../src/storage/Storage.ts"
import { hpkeRecipient, hpkeSeal } from "../crypto/hpke.ts"
import { freePort } from "../e2e/servers.ts"
import { push, request } from "../endpoint/harness.ts"
import { FakeFcm, type FakeFcmService } from "./fake-fcm.ts"
import { bridgedEndpoint, call, errnoOf, eventsOf, pathOf, register } from "./harness.ts"

const BODY = Buffer.from("pretend-aes128gcm-ciphertext")

const fcmOptions = (fake: FakeFcmService, closedPort: number): BridgeOptions => ({
  fcm: {
    apps: {
      firefox: { projectId: "firefox-project", serviceAccount: fake.account },
      stranger: { projectId: "stranger-project", serviceAccount: fake.strangerAccount },
      offline: { projectId: "p", serviceAccount: { ...fake.account, token_uri: `http://127.0.0.1:${closedPort}/token` } }
    },
    minTtl: 60,
    maxTtl: 2_419_200,
    timeoutMs: 400,
    baseUrl: fake.url
  }
})

/** `notification.bridge.error{platform=fcm,reason}` as the metrics sink counts a user's events. */
const bridgeErrors = (uaid: string, reason: string) =>
  Effect.map(eventsOf(uaid), (events) => {
    const metrics = makeMetrics()
    const sink = metricsSink(metrics)
    for (const event of events) sink(event)
    return metrics.value("notification.bridge.error", { platform: "fcm", reason }) ?? 0
  })

/** A push to `endpoint` while FCM answers with `retryAfter` as its `Retry-After` header (none when undefined). */
const pushWithRetryAfter = (fake: FakeFcmService, endpoint: string, retryAfter: string | undefined) =>
  Effect.suspend(() => {
    fake.retryAfter = retryAfter
    return push({ path: pathOf(endpoint) })
  }).pipe(Effect.ensuring(Effect.sync(() => {
    fake.retryAfter = undefined
  })))

const TestFcm = Layer.unwrap(
  Effect.gen(function*() {
    const fake = yield* FakeFcm
    const closed = yield* Effect.promise(freePort)
    return bridgedEndpoint(fcmOptions(fake, closed))
  })
).pipe(Layer.provideMerge(FakeFcm.layer))

describe("FCM bridge", () => {
  layer(TestFcm, { excludeTestServices: true })((it) => {
    it.effect("register (fcm and gcm alike) and push: FCM gets token, clamped ttl, priority and the data map", () =>
      Effect.gen(function*() {
        const fake = yield* FakeFcm
        const reg = yield* register("gcm", "firefox", { token: "device-token-1" })
        const user = yield* (yield* Storage).getUser(reg.uaid.replaceAll("-", ""))
        assert.strictEqual(user?.routerType, "fcm")
        assert.deepStrictEqual(user?.routerData, { token: "device-token-1", app_id: "firefox" })

        const reply = yield* push({ path: pathOf(reg.endpoint) }, { ttl: 10, urgency: "high", "content-encoding": "aes128gcm" }, BODY)
        assert.strictEqual(reply.status, 201)
        assert.strictEqual(reply.headers["ttl"], "10")
        const sent = fake.sends.at(-1)
        assert.strictEqual(sent?.project, "firefox-project")
        assert.deepStrictEqual(sent?.body, {
          message: {
            token: "device-token-1",
            android: {
              ttl: "60s",
              priority: "HIGH",
              data: { chid: reg.channelID, body: BODY.toString("base64url"), con: "aes128gcm" }
            }
          }
        })
        const verified = fake.tokenRequests.filter((r) => r.verified)
        assert.isAbove(verified.length, 0)
        assert.strictEqual(verified[0]?.claims?.["iss"], "fcm-sender@test.iam.gserviceaccount.com")

        // The access token is reused; low urgency asks for NORMAL priority; a huge TTL is capped at max_ttl.
        const before = fake.tokenRequests.length
        assert.strictEqual((yield* push({ path: pathOf(reg.endpoint) }, { ttl: 9_999_999, urgency: "low" })).status, 201)
        assert.strictEqual(fake.tokenRequests.length, before)
        assert.deepStrictEqual(fake.sends.at(-1)?.body.message.android, { ttl: "2419200s", priority: "NORMAL", data: { chid: reg.channelID } })
      }))

    it.effect("an HPKE message reaches FCM byte for byte, marked by cty and no con; one over FCM's 4096 bytes of data is 413/104", () =>
      Effect.gen(function*() {
        const fake = yield* FakeFcm
        const reg = yield* register("fcm", "firefox", { token: "device-token-hpke" })
        const recipient = hpkeRecipient()
        const info = Buffer.from("WebPush: info")
        const message = hpkeSeal(recipient.publicKey, info, Buffer.from("to a phone, with HPKE"))
        const reply = yield* push({ path: pathOf(reg.endpoint) }, { "content-type": HPKE_CONTENT_TYPE }, message)
        assert.strictEqual(reply.status, 201, reply.text)
        const data = fake.sends.at(-1)?.body.message.android.data as Record<string, string>
        assert.deepStrictEqual(data, { chid: reg.channelID, body: message.toString("base64url"), cty: HPKE_CONTENT_TYPE })
        const carried = Buffer.from(data["body"] ?? "", "base64url")
        assert.isTrue(carried.equals(message))
        assert.strictEqual(recipient.open(carried, info).toString(), "to a phone, with HPKE")

        // 3,100 bytes are 4,134 in base64: the data map is over FCM's limit, as an aes128gcm one would be.
        const sends = fake.sends.length
        const large = yield* push({ path: pathOf(reg.endpoint) }, { "content-type": HPKE_CONTENT_TYPE }, randomBytes(3100))
        assert.deepStrictEqual(errnoOf(large), [413, 104])
        assert.match(large.json().message, /Converted buffer is too long by \d+ bytes/)
        assert.strictEqual(fake.sends.length, sends, "nothing sent")
      }))

    it.effect("registration refusals: unknown app id 400/106, short or spaced token 400; health names the FCM router", () =>
      Effect.gen(function*() {
        const health = yield* request({ method: "GET", path: "/health" })
        assert.deepStrictEqual(health.json().routers, { webpush: true, fcm: true, apns: false, adm: false })
        assert.deepStrictEqual(errnoOf(yield* call("POST", "/v1/fcm/nope/registration", { token: "device-token-1" })), [400, 106])
        assert.deepStrictEqual(errnoOf(yield* call("POST", "/v1/fcm/firefox/registration", { token: "short" })), [400, null])
        assert.deepStrictEqual(errnoOf(yield* call("POST", "/v1/fcm/firefox/registration", { token: "has a space" })), [400, null])
        assert.deepStrictEqual(errnoOf(yield* call("POST", "/v1/fcm/firefox/registration", {})), [400, null])
      }))

    it.effect("FCM 401 → a new access token, the message sent again (201); 401 again → 502/901", () =>
      Effect.gen(function*() {
        const fake = yield* FakeFcm
        const reg = yield* register("fcm", "firefox", { token: "device-token-2" })
        assert.strictEqual((yield* push({ path: pathOf(reg.endpoint) })).status, 201)
        fake.valid.clear() // FCM forgot every token it issued
        const before = fake.tokenRequests.length
        assert.strictEqual((yield* push({ path: pathOf(reg.endpoint) })).status, 201)
        assert.strictEqual(fake.tokenRequests.length, before + 1)

        fake.rejectAll = true
        const refused = yield* push({ path: pathOf(reg.endpoint) })
        fake.rejectAll = false
        assert.deepStrictEqual(errnoOf(refused), [502, 901])
        assert.deepInclude((yield* eventsOf(reg.uaid)).find((e) => e.type === "notification.bridge_failed.1")?.data, { platform: "fcm", reason: "auth" })
      }))

    it.effect("token endpoint refuses our JWT (unknown key) → 502/901", () =>
      Effect.gen(function*() {
        const reg = yield* register("fcm", "stranger", { token: "device-token-3" })
        assert.deepStrictEqual(errnoOf(yield* push({ path: pathOf(reg.endpoint) })), [502, 901])
        assert.isTrue((yield* FakeFcm).tokenRequests.some((r) => !r.verified))
      }))

    it.effect("router data naming an app no longer configured → 502/900, user kept; router data without a token → user dropped", () =>
      Effect.gen(function*() {
        const storage = yield* Storage
        const reg = yield* register("fcm", "firefox", { token: "device-token-5" })
        const uaid = reg.uaid.replaceAll("-", "")
        yield* storage.updateUser(uaid, { routerData: { token: "device-token-5", app_id: "removed-app" } })
        assert.deepStrictEqual(errnoOf(yield* push({ path: pathOf(reg.endpoint) })), [502, 900])
        assert.isDefined(yield* storage.getUser(uaid))
        yield* storage.updateUser(uaid, { routerData: { app_id: "firefox" } })
        assert.deepStrictEqual(errnoOf(yield* push({ path: pathOf(reg.endpoint) })), [410, 106])
        assert.isUndefined(yield* storage.getUser(uaid))
      }))

    it.effect("UNREGISTERED (404) → user dropped, 410/106", () =>
      Effect.gen(function*() {
        const reg = yield* register("fcm", "firefox", { token: "gone-device-token" })
        const reply = yield* push({ path: pathOf(reg.endpoint) })
        assert.deepStrictEqual(errnoOf(reply), [410, 106])
        assert.isUndefined(yield* (yield* Storage).getUser(reg.uaid.replaceAll("-", "")))
      }))

    it.effect("RESOURCE_EXHAUSTED (429) → 429/116 with FCM's Retry-After within 10–3600 s (120 s when none or unusable); user kept", () =>
      Effect.gen(function*() {
        const fake = yield* FakeFcm
        const reg = yield* register("fcm", "firefox", { token: "quota-device-token" })
        const cases: ReadonlyArray<readonly [string | undefined, number]> = [
          ["30", 30],
          ["5", 10],
          ["99999", 3600],
          [undefined, 120],
          ["soon", 120],
          ["-3", 120],
          [new Date(Date.now() - 60_000).toUTCString(), 10]
        ]
        for (const [header, expected] of cases) {
          const reply = yield* pushWithRetryAfter(fake, reg.endpoint, header)
          assert.deepStrictEqual(errnoOf(reply), [429, 116], String(header))
          assert.strictEqual(reply.headers["retry-after"], String(expected), String(header))
          assert.strictEqual(reply.json().error, "Too Many Requests")
          assert.strictEqual(reply.json().message, `FCM sending quota exceeded, retry after ${expected} s`)
        }
        // An HTTP-date: the seconds until then (FCM's date has whole seconds, so 599 or 600).
        const dated = yield* pushWithRetryAfter(fake, reg.endpoint, new Date(Date.now() + 600_000).toUTCString())
        assert.deepStrictEqual(errnoOf(dated), [429, 116])
        assert.include(["599", "600"], dated.headers["retry-after"])

        assert.isDefined(yield* (yield* Storage).getUser(reg.uaid.replaceAll("-", "")))
        assert.strictEqual(yield* bridgeErrors(reg.uaid, "rate_limited"), cases.length + 1)
        assert.strictEqual(yield* bridgeErrors(reg.uaid, "upstream"), 0)
        assert.deepInclude((yield* eventsOf(reg.uaid)).find((e) => e.type === "notification.bridge_failed.1")?.data, { platform: "fcm", reason: "rate_limited" })
      }))

    it.effect("UNAVAILABLE (503) and INTERNAL (500) → 503/201 with FCM's Retry-After within 10–3600 s, else 120 s; user kept", () =>
      Effect.gen(function*() {
        const fake = yield* FakeFcm
        const reg = yield* register("fcm", "firefox", { token: "unavailable-device" })
        const cases: ReadonlyArray<readonly [string | undefined, number]> = [["45", 45], ["1", 10], ["86400", 3600], [undefined, 120], ["later", 120]]
        for (const [header, expected] of cases) {
          const reply = yield* pushWithRetryAfter(fake, reg.endpoint, header)
          assert.deepStrictEqual(errnoOf(reply), [503, 201], String(header))
          assert.strictEqual(reply.headers["retry-after"], String(expected), String(header))
          assert.strictEqual(reply.json().error, "Service Unavailable")
          assert.strictEqual(reply.json().message, "FCM is unavailable (UNAVAILABLE), retry later")
        }
        assert.isDefined(yield* (yield* Storage).getUser(reg.uaid.replaceAll("-", "")))
        assert.strictEqual(yield* bridgeErrors(reg.uaid, "unavailable"), cases.length)

        const internal = yield* register("fcm", "firefox", { token: "internal-device" })
        const reply = yield* pushWithRetryAfter(fake, internal.endpoint, "60")
        assert.deepStrictEqual(errnoOf(reply), [503, 201])
        assert.strictEqual(reply.headers["retry-after"], "60")
        assert.strictEqual(reply.json().message, "FCM is unavailable (INTERNAL), retry later")
        assert.strictEqual(yield* bridgeErrors(internal.uaid, "unavailable"), 1)
      }))

    it.effect("other FCM errors and garbage → 502 (errno null); hang → 502/903; token endpoint unreachable → 502/902", () =>
      Effect.gen(function*() {
        const invalid = yield* register("fcm", "firefox", { token: "invalid-device" })
        const reply = yield* push({ path: pathOf(invalid.endpoint) })
        assert.deepStrictEqual(errnoOf(reply), [502, null])
        assert.match(reply.json().message, /INVALID_ARGUMENT/)
        const garbage = yield* register("fcm", "firefox", { token: "garbage-device" })
        const garbled = yield* push({ path: pathOf(garbage.endpoint) })
        assert.deepStrictEqual(errnoOf(garbled), [502, null])
        assert.isUndefined(garbled.headers["retry-after"])
        assert.strictEqual(yield* bridgeErrors(invalid.uaid, "upstream"), 1)
        const hang = yield* register("fcm", "firefox", { token: "hang-device" })
        assert.deepStrictEqual(errnoOf(yield* push({ path: pathOf(hang.endpoint) })), [502, 903])
        const offline = yield* register("fcm", "offline", { token: "device-token-4" })
        assert.deepStrictEqual(errnoOf(yield* push({ path: pathOf(offline.endpoint) })), [502, 902])
        // The user is kept through all of these.
        assert.isDefined(yield* (yield* Storage).getUser(hang.uaid.replaceAll("-", "")))
      }))
  })
})
