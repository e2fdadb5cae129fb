/**
 * What a push to an offline client costs the store, counted operation by operation through a
 * counting Storage layer: the first push reads the router record and the channel (and counts the
 * subscription's stored messages, stores, and reads the record again); every later one, while the
 * router cache holds the record, only counts, stores and reads the record again — three operations,
 * on any backend (the cache is the endpoint's). And what
 * the cached record may not hide: a user dropped meanwhile (410 on the re-read), a channel
 * unregistered in a session since (201 once more at most, then 410), a record past
 * `router_cache_ttl` (read afresh).
 */
import { assert, describe, layer } from "@effect/vitest"
import { Context, Effect, Layer } from "effect"
import { EndpointCrypto } from "../../src/crypto/endpoint.ts"
import { EndpointServer } from "../../src/endpoint/server.ts"
import { EventLog } from "../../src/observability/EventLog.ts"
import { Metrics } from "../../src/observability/Metrics.ts"
import { WebPushRouter } from "../../src/routers/webpush.ts"
import { mapStorageOperations, Storage } from "../../src/storage/Storage.ts"
import { FakeNodeClient, fakeNode, nodeCalls, options, push, subscribe, TestStorage } from "./harness.ts"

/** Storage operations the endpoint made, by name, in order. */
class Operations extends Context.Service<Operations, Array<string>>()("test/Operations") {}

/** The endpoint over a Storage that records each of its operations (values read from memory, like the active tables, are not operations). */
const countedEndpoint = (ttlMs: number) => {
  const counted = Layer.effect(
    Storage,
    Effect.gen(function*() {
      const inner = yield* Storage
      const operations = yield* Operations
      return mapStorageOperations(inner, (name) => (operation) => Effect.andThen(Effect.sync(() => void operations.push(name)), operation), { values: false })
    })
  )
  return EndpointServer.layerServer({ ...options, routerCache: { ttlMs, entries: 100 } }).pipe(
    Layer.provide(counted),
    Layer.provideMerge(WebPushRouter.layer.pipe(Layer.provide(counted))),
    Layer.provideMerge(FakeNodeClient),
    Layer.provideMerge(Layer.mergeAll(TestStorage, EndpointCrypto.layerTest, EventLog.layerMemory, Metrics.layerMemory)),
    Layer.provideMerge(Layer.sync(Operations, () => []))
  )
}

/** The storage operations `effect` made, and its result. */
const counting = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.gen(function*() {
    const operations = yield* Operations
    operations.length = 0
    const result = yield* effect
    return [result, [...operations]] as const
  })

const headers = { ttl: 60, "content-encoding": "aes128gcm" }
const BODY = "pretend-ciphertext"

/** The client came back (a new session: `connected_at` moves on), with `patch`. */
const cameBack = (uaid: string, patch: { readonly nodeId?: string } = {}) =>
  Effect.gen(function*() {
    const storage = yield* Storage
    const before = yield* storage.getUser(uaid)
    yield* storage.updateUser(uaid, { ...patch, connectedAt: (before?.connectedAt ?? 0) + 1 })
  })

describe("storage operations per push to an offline client", () => {
  layer(countedEndpoint(60_000), { excludeTestServices: true })((it) => {
    it.effect("the first push reads the record and the channel; every later one costs three: the count, the store and the re-read", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        const [first, firstOps] = yield* counting(push(sub, headers, BODY))
        assert.strictEqual(first.status, 201)
        assert.deepStrictEqual(firstOps, ["getUser", "hasChannel", "countChannelMessages", "saveMessage", "getUser"])
        for (let i = 0; i < 5; i++) {
          const [reply, ops] = yield* counting(push(sub, headers, BODY))
          assert.strictEqual(reply.status, 201)
          assert.isAtMost(ops.length, 3, ops.join(", "))
          assert.deepStrictEqual(ops, ["countChannelMessages", "saveMessage", "getUser"])
        }
      }))

    it.effect("another channel of a cached user: its channel is read once, then three again", () =>
      Effect.gen(function*() {
        const storage = yield* Storage
        const sub = yield* subscribe()
        const other = { ...sub, channelId: crypto.randomUUID() }
        yield* storage.addChannel(sub.uaid, sub.table, other.channelId)
        const endpoint = yield* (yield* EndpointCrypto).makeEndpoint(sub.uaid, other.channelId)
        const otherPath = { path: new URL(endpoint).pathname }
        yield* push(sub, headers, BODY)
        const [, firstOps] = yield* counting(push(otherPath, headers, BODY))
        assert.deepStrictEqual(firstOps, ["hasChannel", "countChannelMessages", "saveMessage", "getUser"])
        const [, laterOps] = yield* counting(push(otherPath, headers, BODY))
        assert.deepStrictEqual(laterOps, ["countChannelMessages", "saveMessage", "getUser"])
      }))

    it.effect("a user dropped while its record was cached: the re-read answers 410 (105), the next push 410 (106) on a fresh read", () =>
      Effect.gen(function*() {
        const storage = yield* Storage
        const sub = yield* subscribe()
        yield* push(sub, headers, BODY)
        yield* storage.dropUser(sub.uaid)
        const [during, duringOps] = yield* counting(push(sub, headers, BODY))
        assert.deepStrictEqual([during.status, JSON.parse(during.text).errno], [410, 105])
        assert.deepStrictEqual(duringOps, ["countChannelMessages", "saveMessage", "getUser"])
        const [after, afterOps] = yield* counting(push(sub, headers, BODY))
        assert.deepStrictEqual([after.status, JSON.parse(after.text).errno], [410, 106])
        assert.deepStrictEqual(afterOps, ["getUser"])
      }))

    it.effect("a channel unregistered in a session since the record was cached: one 201 more (caught by the re-read), then 410 on a fresh read", () =>
      Effect.gen(function*() {
        const storage = yield* Storage
        const sub = yield* subscribe()
        yield* push(sub, headers, BODY)
        // The client came back, unregistered the channel, and left again.
        yield* cameBack(sub.uaid)
        yield* storage.removeChannel(sub.uaid, sub.table, sub.channelId)
        const [once, onceOps] = yield* counting(push(sub, headers, BODY))
        assert.strictEqual(once.status, 201)
        assert.deepStrictEqual(onceOps, ["countChannelMessages", "saveMessage", "getUser"])
        const [refused, refusedOps] = yield* counting(push(sub, headers, BODY))
        assert.deepStrictEqual([refused.status, JSON.parse(refused.text).errno], [410, 106])
        assert.deepStrictEqual(refusedOps, ["getUser", "hasChannel"])
      }))

    it.effect("a client that came back and is connected: the re-read finds it (its node poked), the next push goes to its node with no storage operation", () =>
      Effect.gen(function*() {
        const node = yield* fakeNode(200)
        const sub = yield* subscribe()
        yield* push(sub, headers, BODY)
        yield* cameBack(sub.uaid, { nodeId: node })
        const [, storedOps] = yield* counting(push(sub, headers, BODY))
        assert.deepStrictEqual(storedOps, ["countChannelMessages", "saveMessage", "getUser"])
        const [direct, directOps] = yield* counting(push(sub, headers, BODY))
        assert.strictEqual(direct.status, 201)
        assert.deepStrictEqual(directOps, [])
        assert.deepStrictEqual((yield* nodeCalls(sub.uaid)).map((c) => c.kind), ["notify", "push"])
      }))
  })

  layer(countedEndpoint(200), { excludeTestServices: true })((it) => {
    it.effect("past router_cache_ttl the record and the channel are read again", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        yield* push(sub, headers, BODY)
        const [, warmOps] = yield* counting(push(sub, headers, BODY))
        assert.deepStrictEqual(warmOps, ["countChannelMessages", "saveMessage", "getUser"])
        yield* Effect.sleep("300 millis")
        const [, expiredOps] = yield* counting(push(sub, headers, BODY))
        assert.deepStrictEqual(expiredOps, ["getUser", "hasChannel", "countChannelMessages", "saveMessage", "getUser"])
      }))
  })
})
