/**
 * The ADM bridge against a local ADM server and token endpoint (fake-adm.ts): registration, the
 * message ADM receives (data map, consolidationKey, clamped expiresAfter), the client-credentials
 * token (cached, fetched again on 401), and the error mappings.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Effect, Layer, Redacted } from "effect"
import { Storage } from "../../src/storage/Storage.ts"
import { push } from "../endpoint/harness.ts"
import { ADM_CLIENT_ID, ADM_CLIENT_SECRET, FakeAdm } from "./fake-adm.ts"
import { bridgedEndpoint, call, errnoOf, pathOf, register } from "./harness.ts"

const TestAdm = Layer.unwrap(
  Effect.map(Effect.service(FakeAdm), (fake) =>
    bridgedEndpoint({
      adm: {
        profiles: {
          fire: { clientId: ADM_CLIENT_ID, clientSecret: Redacted.make(ADM_CLIENT_SECRET) },
          wrong: { clientId: ADM_CLIENT_ID, clientSecret: Redacted.make("not-the-secret") }
        },
        minTtl: 60,
        maxTtl: 2_419_200,
        timeoutMs: 500,
        baseUrl: fake.url
      }
    }))
).pipe(Layer.provideMerge(FakeAdm.layer))

describe("ADM bridge", () => {
  layer(TestAdm, { excludeTestServices: true })((it) => {
    it.effect("register and push: ADM gets the data map, consolidationKey and expiresAfter; the token is reused", () =>
      Effect.gen(function*() {
        const fake = yield* FakeAdm
        const reg = yield* register("adm", "fire", { token: "amzn1.adm-registration.device-1" })
        assert.deepStrictEqual((yield* (yield* Storage).getUser(reg.uaid.replaceAll("-", "")))?.routerData, {
          token: "amzn1.adm-registration.device-1",
          app_id: "fire"
        })
        assert.strictEqual((yield* push({ path: pathOf(reg.endpoint) }, { ttl: 30 })).status, 201)
        assert.strictEqual((yield* push({ path: pathOf(reg.endpoint) }, { ttl: 3600, topic: "tabs" })).status, 201)
        const [first, second] = fake.sends.slice(-2)
        assert.strictEqual(first?.registrationId, "amzn1.adm-registration.device-1")
        assert.deepStrictEqual(first?.body, { data: { chid: reg.channelID }, consolidationKey: reg.channelID, expiresAfter: 60 })
        assert.deepStrictEqual(second?.body, { data: { chid: reg.channelID }, consolidationKey: "tabs", expiresAfter: 3600 })
        assert.strictEqual(fake.tokenRequests.filter((r) => r.ok).length, 1)
        assert.deepStrictEqual(errnoOf(yield* call("POST", "/v1/adm/nope/registration", { token: "amzn1.adm-registration.device-1" })), [400, 106])
      }))

    it.effect("401 → a new token, sent again; wrong client secret → 502/901", () =>
      Effect.gen(function*() {
        const fake = yield* FakeAdm
        const reg = yield* register("adm", "fire", { token: "amzn1.adm-registration.device-2" })
        assert.strictEqual((yield* push({ path: pathOf(reg.endpoint) })).status, 201)
        fake.valid.clear()
        assert.strictEqual((yield* push({ path: pathOf(reg.endpoint) })).status, 201)
        assert.isAtLeast(fake.tokenRequests.filter((r) => r.ok).length, 2)

        const wrong = yield* register("adm", "wrong", { token: "amzn1.adm-registration.device-3" })
        assert.deepStrictEqual(errnoOf(yield* push({ path: pathOf(wrong.endpoint) })), [502, 901])
      }))

    it.effect("Unregistered and InvalidRegistrationId → user dropped, 410/106; other errors → 502; hang → 502/903", () =>
      Effect.gen(function*() {
        for (const token of ["unregistered-device-1", "invalid-device-1"]) {
          const reg = yield* register("adm", "fire", { token })
          assert.deepStrictEqual(errnoOf(yield* push({ path: pathOf(reg.endpoint) })), [410, 106])
          assert.isUndefined(yield* (yield* Storage).getUser(reg.uaid.replaceAll("-", "")))
        }
        const large = yield* register("adm", "fire", { token: "toolarge-device-1" })
        const reply = yield* push({ path: pathOf(large.endpoint) })
        assert.deepStrictEqual(errnoOf(reply), [502, null])
        assert.match(reply.json().message, /MessageTooLarge/)
        const hang = yield* register("adm", "fire", { token: "hang-device-1" })
        assert.deepStrictEqual(errnoOf(yield* push({ path: pathOf(hang.endpoint) })), [502, 903])
      }))
  })
})
