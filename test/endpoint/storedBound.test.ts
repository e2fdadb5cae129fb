/**
 * What one subscription may have stored (`max_stored_per_subscription`): a push beyond it is refused
 * 429/119 with `Retry-After` before anything is written, whoever else the user has subscriptions for;
 * a message replacing its topic's stored one adds none; what the client received (acked) or what
 * expired frees room again.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Effect } from "effect"
import { EndpointCrypto } from "../../src/crypto/endpoint.ts"
import { messageKeyOf } from "../../src/domain/notification.ts"
import { Storage } from "../../src/storage/Storage.ts"
import { endpointWith, FakeNodeClient, fakeNode, messagesOf, options, push, subscribe, type Subscription } from "./harness.ts"

const BOUND = 3

/** A second subscription of `sub`'s user. */
const sibling = (sub: Subscription) =>
  Effect.gen(function*() {
    const channelId = crypto.randomUUID()
    yield* (yield* Storage).addChannel(sub.uaid, sub.table, channelId)
    const endpoint = yield* (yield* EndpointCrypto).makeEndpoint(sub.uaid, channelId)
    return { ...sub, channelId, endpoint, path: new URL(endpoint).pathname }
  })

describe("the stored bound of a subscription (max_stored_per_subscription)", () => {
  layer(endpointWith(FakeNodeClient, { ...options, maxStoredPerSubscription: BOUND }), { excludeTestServices: true })((it) => {
    it.effect("an offline client's subscription holds the bound; the next push is refused 429/119 (Retry-After 300) and nothing is written; the user's other subscription is served", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        for (let i = 0; i < BOUND; i++) assert.strictEqual((yield* push(sub, { ttl: 600 })).status, 201)
        const refused = yield* push(sub, { ttl: 600 })
        assert.strictEqual(refused.status, 429)
        assert.strictEqual(refused.headers["retry-after"], "300")
        assert.deepInclude(JSON.parse(refused.text), { code: 429, errno: 119 })
        assert.strictEqual((yield* messagesOf(sub)).length, BOUND, "nothing written for the refused push")
        const other = yield* sibling(sub)
        assert.strictEqual((yield* push(other, { ttl: 600 })).status, 201)
        assert.strictEqual((yield* push(other, { ttl: 0 })).status, 201, "TTL 0 is never stored: never refused")
      }))

    it.effect("a topic message replacing its topic's stored one is taken at the bound; a new topic is not", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        assert.strictEqual((yield* push(sub, { topic: "news" })).status, 201)
        for (let i = 1; i < BOUND; i++) assert.strictEqual((yield* push(sub)).status, 201)
        assert.strictEqual((yield* push(sub, { topic: "news" })).status, 201)
        assert.strictEqual((yield* push(sub, { topic: "sports" })).status, 429)
        assert.strictEqual((yield* messagesOf(sub)).length, BOUND)
      }))

    it.effect("what the client acked frees its room: the next push is stored again", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        for (let i = 0; i < BOUND; i++) yield* push(sub)
        assert.strictEqual((yield* push(sub)).status, 429)
        const [first] = yield* messagesOf(sub)
        assert.isDefined(first)
        yield* (yield* Storage).ackMessages(sub.uaid, sub.table, [{ key: messageKeyOf(first!), version: first!.version }])
        assert.strictEqual((yield* push(sub)).status, 201)
      }))

    it.effect("a connected client whose connection is full (its node refuses): stored up to the bound, then refused with Retry-After 10", () =>
      Effect.gen(function*() {
        const nodeId = yield* fakeNode(503)
        const sub = yield* subscribe({ nodeId })
        for (let i = 0; i < BOUND; i++) assert.strictEqual((yield* push(sub)).status, 201)
        const refused = yield* push(sub)
        assert.strictEqual(refused.status, 429)
        assert.strictEqual(refused.headers["retry-after"], "10")
      }))
  })

  layer(endpointWith(FakeNodeClient, { ...options, maxStoredPerSubscription: 0 }), { excludeTestServices: true })((it) => {
    it.effect("0 turns the bound off", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        for (let i = 0; i < 2 * BOUND; i++) assert.strictEqual((yield* push(sub)).status, 201)
      }))
  })
})
