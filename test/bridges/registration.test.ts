/**
 * The bridge registration API (`/v1/{router_type}/{app_id}/registration...`) and routing to
 * bridged users, through the stub bridge: every call, every refusal (status and errno), what is
 * stored, and what a push to a bridged user answers.
 */
import { randomUUID } from "node:crypto"
import { assert, describe, layer } from "@effect/vitest"
import { Effect } from "effect"
import { issueBridgeSecret } from "../../src/crypto/secrets.ts"
import { Storage } from "../../src/storage/Storage.ts"
import { messagesOf, push, request, subscribe, vapidKeys } from "../endpoint/harness.ts"
import { AUTH_KEY, bridgedEndpoint, call, errnoOf, eventsOf, pathOf, register } from "./harness.ts"

const STUB = "/v1/stub/success/registration"
const BODY = Buffer.from("pretend-aes128gcm-ciphertext")

describe("registration API (stub bridge)", () => {
  layer(bridgedEndpoint({ stub: true }), { excludeTestServices: true })((it) => {
    it.effect("register: uaid (hyphenated), channel, endpoint and the HMAC secret; user and channel stored", () =>
      Effect.gen(function*() {
        const reg = yield* register("stub", "success", { token: "success" })
        assert.match(reg.uaid, /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/)
        assert.match(reg.channelID, /^[0-9a-f]{8}-/)
        const uaid = reg.uaid.replaceAll("-", "")
        assert.strictEqual(reg.secret, issueBridgeSecret([AUTH_KEY], uaid))
        assert.match(reg.endpoint, /\/wpush\/v1\//)
        const storage = yield* Storage
        const user = yield* storage.getUser(uaid)
        assert.strictEqual(user?.routerType, "stub")
        assert.deepStrictEqual(user?.routerData, { token: "success", app_id: "success" })
        assert.isTrue(yield* storage.hasChannel(uaid, user?.currentMonth ?? "", reg.channelID))
      }))

    it.effect("register with a channelID and a VAPID key: that channel, a v2 endpoint; router type any case", () =>
      Effect.gen(function*() {
        const keys = yield* vapidKeys
        const channelID = randomUUID()
        const reg = yield* register("STUB", "success", { token: "success", channelID, key: keys.publicKey })
        assert.strictEqual(reg.channelID, channelID)
        assert.match(reg.endpoint, /\/wpush\/v2\//)
      }))

    it.effect("register refusals: router type 400/108, token 400, app id 400/106, body 400", () =>
      Effect.gen(function*() {
        assert.deepStrictEqual(errnoOf(yield* call("POST", "/v1/fcm/app/registration", { token: "abcdefghij" })), [400, 108])
        assert.deepStrictEqual(errnoOf(yield* call("POST", "/v1/webpush/app/registration", { token: "abcdefghij" })), [400, 108])
        assert.deepStrictEqual(errnoOf(yield* call("POST", "/v1/nope/app/registration", { token: "abcdefghij" })), [400, 108])
        const badToken = yield* call("POST", STUB, { token: "failure" })
        assert.deepStrictEqual(errnoOf(badToken), [400, null])
        assert.strictEqual(badToken.json().message, "Invalid router token")
        assert.deepStrictEqual(errnoOf(yield* call("POST", "/v1/stub/other/registration", { token: "success" })), [400, 106])
        assert.deepStrictEqual(errnoOf(yield* call("POST", STUB, "{not json")), [400, null])
        assert.deepStrictEqual(errnoOf(yield* call("POST", STUB, "[1]")), [400, null])
        assert.deepStrictEqual(errnoOf(yield* call("POST", STUB, { token: "success", channelID: "nope" })), [400, null])
        assert.deepStrictEqual(errnoOf(yield* call("POST", STUB, { token: "success", key: "AAAA" })), [400, null])
        assert.deepStrictEqual(errnoOf(yield* call("POST", STUB, "x".repeat(9000))), [400, null])
      }))

    it.effect("secrets: missing, wrong, other scheme → 401/109; webpush scheme accepted; unknown or bad uaid → 410/103", () =>
      Effect.gen(function*() {
        const reg = yield* register("stub", "success", { token: "success" })
        const path = `${STUB}/${reg.uaid}`
        assert.deepStrictEqual(errnoOf(yield* call("GET", path)), [401, 109])
        assert.deepStrictEqual(errnoOf(yield* call("GET", path, undefined, "0".repeat(64))), [401, 109])
        const basic = yield* request({ method: "GET", path, headers: { authorization: `Basic ${reg.secret}` } })
        assert.deepStrictEqual(errnoOf(basic), [401, 109])
        const webpushScheme = yield* request({ method: "GET", path, headers: { authorization: `WebPush ${reg.secret}` } })
        assert.strictEqual(webpushScheme.status, 200)
        const unknown = randomUUID()
        assert.deepStrictEqual(errnoOf(yield* call("GET", `${STUB}/${unknown}`, undefined, issueBridgeSecret([AUTH_KEY], unknown))), [410, 103])
        assert.deepStrictEqual(errnoOf(yield* call("GET", `${STUB}/not-a-uaid`, undefined, reg.secret)), [410, 103])
      }))

    it.effect("GET lists channels; POST subscription adds one; DELETE subscription drops it (again → 410/106)", () =>
      Effect.gen(function*() {
        const reg = yield* register("stub", "success", { token: "success" })
        const path = `${STUB}/${reg.uaid}`
        const added = yield* call("POST", `${path}/subscription`, undefined, reg.secret)
        assert.strictEqual(added.status, 200)
        const second = added.json() as { channelID: string; endpoint: string }
        assert.match(second.endpoint, /\/wpush\/v1\//)
        const listed = (yield* call("GET", path, undefined, reg.secret)).json()
        assert.deepStrictEqual(listed, { uaid: reg.uaid, channelIDs: [reg.channelID, second.channelID].sort() })
        assert.strictEqual((yield* call("DELETE", `${path}/subscription/${second.channelID}`, undefined, reg.secret)).status, 200)
        assert.deepStrictEqual(errnoOf(yield* call("DELETE", `${path}/subscription/${second.channelID}`, undefined, reg.secret)), [410, 106])
        assert.deepStrictEqual(errnoOf(yield* call("DELETE", `${path}/subscription/nope`, undefined, reg.secret)), [410, 106])
        assert.deepStrictEqual((yield* call("GET", path, undefined, reg.secret)).json().channelIDs, [reg.channelID])
        // A push to the dropped channel's endpoint is refused.
        assert.deepStrictEqual(errnoOf(yield* push({ path: pathOf(second.endpoint) })), [410, 106])
      }))

    it.effect("PUT replaces the router data; DELETE drops the user (then 410/103)", () =>
      Effect.gen(function*() {
        const reg = yield* register("stub", "success", { token: "success" })
        const uaid = reg.uaid.replaceAll("-", "")
        const path = `/v1/stub/error/registration/${reg.uaid}`
        assert.deepStrictEqual(errnoOf(yield* call("PUT", path, { token: "bad" }, reg.secret)), [400, null])
        assert.strictEqual((yield* call("PUT", path, { token: "success" }, reg.secret)).status, 200)
        assert.deepStrictEqual((yield* (yield* Storage).getUser(uaid))?.routerData, { token: "success", app_id: "error" })
        assert.strictEqual((yield* call("DELETE", path, undefined, reg.secret)).status, 200)
        assert.isUndefined(yield* (yield* Storage).getUser(uaid))
        assert.deepStrictEqual(errnoOf(yield* call("GET", path, undefined, reg.secret)), [410, 103])
      }))

    it.effect("a push to a bridged user goes to its bridge: 201 with Location and TTL, events with the urgency", () =>
      Effect.gen(function*() {
        const reg = yield* register("stub", "success", { token: "success" })
        const reply = yield* push({ path: pathOf(reg.endpoint) }, { ttl: 90, urgency: "High", "content-encoding": "aes128gcm" }, BODY)
        assert.strictEqual(reply.status, 201)
        assert.strictEqual(reply.headers["ttl"], "90")
        assert.match(reply.headers["location"] ?? "", /\/m\//)
        const events = yield* eventsOf(reg.uaid)
        const bridged = events.find((e) => e.type === "notification.bridged.1")
        assert.deepInclude(bridged?.data, { platform: "stub", urgency: "high", channelId: reg.channelID })
        const routed = events.find((e) => e.type === "notification.routed.1")
        assert.strictEqual((routed?.data as { outcome: string }).outcome, "bridged")
        const accepted = events.find((e) => e.type === "notification.accepted.1")
        assert.strictEqual((accepted?.data as { urgency?: string }).urgency, "high")
      }))

    it.effect("stub error app → 502; payload over the bridge limit → 413/104 saying by how much", () =>
      Effect.gen(function*() {
        const failing = yield* register("stub", "error", { token: "success" })
        const reply = yield* push({ path: pathOf(failing.endpoint) })
        assert.deepStrictEqual(errnoOf(reply), [502, null])
        const events = yield* eventsOf(failing.uaid)
        assert.deepInclude(events.find((e) => e.type === "notification.bridge_failed.1")?.data, { platform: "stub", reason: "upstream" })

        const ok = yield* register("stub", "success", { token: "success" })
        const big = yield* push({ path: pathOf(ok.endpoint) }, { "content-encoding": "aes128gcm" }, Buffer.alloc(4000, 7))
        assert.deepStrictEqual(errnoOf(big), [413, 104])
        assert.match(big.json().message, /Converted buffer is too long by \d+ bytes/)
      }))

    it.effect("Urgency outside very-low/low/normal/high → 400/115, for WebPush users too; a stored message keeps it", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        assert.deepStrictEqual(errnoOf(yield* push(sub, { urgency: "urgent" })), [400, 115])
        assert.strictEqual((yield* push(sub, { urgency: "very-low" })).status, 201)
        assert.deepStrictEqual((yield* messagesOf(sub)).map((m) => m.urgency), ["very-low"])
      }))

    it.effect("stored gcm user → dropped, 410/106; fcm user without an FCM bridge → 502/900", () =>
      Effect.gen(function*() {
        const gcm = yield* subscribe({ routerType: "gcm" })
        assert.deepStrictEqual(errnoOf(yield* push(gcm)), [410, 106])
        assert.isUndefined(yield* (yield* Storage).getUser(gcm.uaid))
        const fcm = yield* subscribe({ routerType: "fcm" })
        assert.deepStrictEqual(errnoOf(yield* push(fcm)), [502, 900])
      }))
  })
})

describe("registration API with max_channels_per_user 3", () => {
  layer(bridgedEndpoint({ stub: true }, { maxChannelsPerUser: 3 }), { excludeTestServices: true })((it) => {
    it.effect("a channel beyond it → 413/121, nothing stored; one already there, or one after an unsubscribe, is taken", () =>
      Effect.gen(function*() {
        const reg = yield* register("stub", "success", { token: "success" })
        const path = `${STUB}/${reg.uaid}/subscription`
        const second = (yield* call("POST", path, undefined, reg.secret)).json() as { channelID: string }
        assert.strictEqual((yield* call("POST", path, undefined, reg.secret)).status, 200)
        const beyond = yield* call("POST", path, undefined, reg.secret)
        assert.deepStrictEqual(errnoOf(beyond), [413, 121])
        assert.match(beyond.json().message, /has 3 channels, the most it may have/)
        assert.strictEqual((yield* call("GET", `${STUB}/${reg.uaid}`, undefined, reg.secret)).json().channelIDs.length, 3)
        // Asking again for a channel the user has is no new channel.
        assert.strictEqual((yield* call("POST", path, { channelID: second.channelID }, reg.secret)).status, 200)
        assert.strictEqual((yield* call("DELETE", `${path}/${second.channelID}`, undefined, reg.secret)).status, 200)
        assert.strictEqual((yield* call("POST", path, undefined, reg.secret)).status, 200)
        assert.deepStrictEqual(errnoOf(yield* call("POST", path, undefined, reg.secret)), [413, 121])
      }))
  })
})

describe("registration API without the stub", () => {
  layer(bridgedEndpoint({}), { excludeTestServices: true })((it) => {
    it.effect("stub is off by default: 400/108", () =>
      Effect.gen(function*() {
        assert.deepStrictEqual(errnoOf(yield* call("POST", STUB, { token: "success" })), [400, 108])
      }))
  })
})
