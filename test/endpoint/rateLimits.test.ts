/**
 * Rate limits: the token bucket's arithmetic, the client address (X-Forwarded-For only from a
 * listed proxy, the rightmost hop that is not one; IPv6 by /64; the loopback not limited), and
 * through the endpoint over HTTP: 429/116 with Retry-After by address and by VAPID key, other
 * senders untouched, the bucket refilled after a second; the other routes that read a body, a
 * credential or storage take a token of the address's bucket too. Who sends: a push to a
 * subscription bound to its key, signed by it, counts against the key and not its address (two
 * senders behind one address limited apart), any other push against its address; forged signatures
 * for a bound key count per address in a bucket of their own. To whom: one subscription's bucket,
 * whoever sends. Each refusal counted by its limit.
 */
import { assert, describe, it, layer } from "@effect/vitest"
import { Effect } from "effect"
import { clientAddress, makeTokenBuckets, type RateLimitOptions, trustedProxies } from "../../src/endpoint/rateLimits.ts"
import { METRICS } from "../../src/observability/catalog.ts"
import { Metrics } from "../../src/observability/Metrics.ts"
import { endpointWith, FakeNodeClient, goodClaims, options, push, request, subscribe, type Subscription, type VapidKeys, vapidKeys } from "./harness.ts"

describe("token buckets", () => {
  it("a burst, then one per 1/perSecond; the wait in whole seconds; a full bucket after a quiet period", () => {
    const buckets = makeTokenBuckets({ perSecond: 2, burst: 3 })
    const t0 = 1_000_000
    assert.deepStrictEqual([0, 0, 0].map(() => buckets.take("a", t0)), [0, 0, 0])
    assert.strictEqual(buckets.take("a", t0), 1)
    assert.strictEqual(buckets.take("b", t0), 0, "another sender has its own bucket")
    assert.strictEqual(buckets.take("a", t0 + 500), 0, "half a second: one token back")
    assert.strictEqual(buckets.take("a", t0 + 500), 1)
    assert.deepStrictEqual([0, 0, 0, 1].map(() => buckets.take("a", t0 + 60_000)), [0, 0, 0, 1], "refilled up to the burst, not beyond")
    const slow = makeTokenBuckets({ perSecond: 0.1, burst: 1 })
    assert.strictEqual(slow.take("a", t0), 0)
    assert.strictEqual(slow.take("a", t0), 10)
    const off = makeTokenBuckets({ perSecond: 0, burst: 1 })
    assert.isTrue([1, 2, 3, 4].every(() => off.take("a", t0) === 0))
  })

  it("wait answers as take would, without taking; it makes no bucket for a key it does not know", () => {
    const buckets = makeTokenBuckets({ perSecond: 1, burst: 2 }, 2)
    assert.deepStrictEqual([buckets.wait("a", 0), buckets.wait("a", 0), buckets.wait("a", 0)], [0, 0, 0])
    assert.deepStrictEqual([buckets.take("a", 0), buckets.take("a", 0), buckets.wait("a", 0), buckets.take("a", 0)], [0, 0, 1, 1])
    // Waits on unknown keys kept no bucket: a's is still the one it emptied.
    for (const key of ["b", "c", "d"]) buckets.wait(key, 0)
    assert.strictEqual(buckets.wait("a", 0), 1)
  })

  it("keeps the most recent senders only", () => {
    const buckets = makeTokenBuckets({ perSecond: 1, burst: 1 }, 2)
    assert.strictEqual(buckets.take("a", 0), 0)
    assert.strictEqual(buckets.take("a", 0), 1)
    buckets.take("b", 0)
    buckets.take("c", 0) // a is forgotten: a fresh bucket
    assert.strictEqual(buckets.take("a", 0), 0)
  })
})

describe("client address", () => {
  const proxies = trustedProxies(["10.0.0.0/8", "192.0.2.1"])
  it("the peer, unless it is a listed proxy; then the rightmost hop that is not one", () => {
    assert.strictEqual(clientAddress("203.0.113.9", "198.51.100.1", proxies), "203.0.113.9", "not from a proxy: the header is not believed")
    assert.strictEqual(clientAddress("203.0.113.9", "198.51.100.1", undefined), "203.0.113.9")
    assert.strictEqual(clientAddress("10.1.2.3", "198.51.100.1", proxies), "198.51.100.1")
    assert.strictEqual(clientAddress("10.1.2.3", "6.6.6.6, 198.51.100.1, 192.0.2.1", proxies), "198.51.100.1", "what the client wrote on the left is skipped")
    assert.strictEqual(clientAddress("::ffff:10.1.2.3", ["6.6.6.6", "198.51.100.1"], proxies), "198.51.100.1")
    assert.strictEqual(clientAddress("10.1.2.3", undefined, proxies), "10.1.2.3")
    assert.strictEqual(clientAddress("10.1.2.3", "garbage", proxies), "10.1.2.3")
  })

  it("IPv6 by its /64; the loopback is not limited unless it is a listed proxy", () => {
    assert.strictEqual(clientAddress("2001:db8:1:2:aaaa::1", undefined, undefined), "2001:db8:1:2/64")
    assert.strictEqual(clientAddress("2001:0db8:0001:0002:bbbb:0:0:9", undefined, undefined), "2001:db8:1:2/64")
    assert.strictEqual(clientAddress("2001:db8::1", undefined, undefined), "2001:db8:0:0/64")
    assert.isUndefined(clientAddress("127.0.0.1", "198.51.100.1", undefined))
    assert.isUndefined(clientAddress("::1", undefined, proxies))
    assert.strictEqual(clientAddress("127.0.0.1", "198.51.100.1", trustedProxies(["127.0.0.1"])), "198.51.100.1")
  })
})

const slow = { perSecond: 1, burst: 2 }
const off = { perSecond: 0, burst: 1 }
const limited = (limits: Partial<RateLimitOptions>): RateLimitOptions => ({ perAddress: off, perVapidKey: off, perSubscription: off, trustedProxies: [], ...limits })

describe("through the endpoint", () => {
  layer(endpointWith(FakeNodeClient, { ...options, rateLimits: limited({ perAddress: slow, trustedProxies: ["127.0.0.1"] }) }), {
    excludeTestServices: true
  })((it) => {
    it.effect("by address (behind a listed proxy): 429/116 with Retry-After for that address only, again after a second", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        const from = (address: string) => push(sub, { "x-forwarded-for": `6.6.6.6, ${address}` })
        assert.deepStrictEqual([(yield* from("203.0.113.5")).status, (yield* from("203.0.113.5")).status], [201, 201])
        const refused = yield* from("203.0.113.5")
        assert.strictEqual(refused.status, 429)
        assert.strictEqual(refused.headers["retry-after"], "1")
        assert.deepInclude(refused.json(), { code: 429, errno: 116, error: "Too Many Requests", message: "Too many pushes from this address, retry after 1 s" })
        assert.strictEqual((yield* from("203.0.113.6")).status, 201, "another sender behind the same proxy")
        yield* Effect.sleep("1100 millis")
        assert.strictEqual((yield* from("203.0.113.5")).status, 201)
      }))

    it.effect("cancels, registration API, broadcast admin and log check calls take a token of the same bucket, before their request is read", () =>
      Effect.gen(function*() {
        const calls: ReadonlyArray<readonly [string, string, string | undefined]> = [
          ["DELETE", "/m/not-a-message-id", undefined],
          ["POST", "/v1/stub/app/registration", "not json"],
          ["GET", "/v1/stub/app/registration/0123456789abcdef0123456789abcdef", undefined],
          ["PUT", "/v1/broadcasts/x", "{}"],
          ["GET", "/__error__", undefined]
        ]
        for (const [i, [method, path, body]] of calls.entries()) {
          const sender = `203.0.113.${100 + i}`
          const call = () => request({ method, path, headers: { "x-forwarded-for": sender }, ...(body === undefined ? {} : { body }) })
          const first = [(yield* call()).status, (yield* call()).status]
          assert.notInclude(first, 429, `${method} ${path}`)
          const refused = yield* call()
          assert.strictEqual(refused.status, 429, `${method} ${path}: the third call of the burst of 2`)
          assert.deepInclude(refused.json(), { errno: 116 })
        }
        // The health routes answer from memory (and a cached status): not limited.
        for (let i = 0; i < 5; i++) assert.strictEqual((yield* request({ method: "GET", path: "/__lbheartbeat__", headers: { "x-forwarded-for": "203.0.113.99" } })).status, 200)
      }))
  })

  layer(endpointWith(FakeNodeClient, { ...options, rateLimits: limited({ perAddress: slow, perVapidKey: slow }) }), {
    excludeTestServices: true
  })((it) => {
    it.effect("by VAPID key: a verified key's pushes are limited; unsigned ones and the loopback by address are not", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        const keys = yield* vapidKeys
        const other = yield* vapidKeys
        const signed = (k: typeof keys) =>
          Effect.flatMap(Effect.promise(() => k.sign(goodClaims())), (t) => push(sub, { authorization: `vapid t=${t}, k=${k.publicKey}` }))
        assert.deepStrictEqual([(yield* signed(keys)).status, (yield* signed(keys)).status], [201, 201])
        const refused = yield* signed(keys)
        assert.strictEqual(refused.status, 429)
        assert.deepInclude(refused.json(), { errno: 116, message: "Too many pushes from this VAPID key, retry after 1 s" })
        assert.strictEqual((yield* signed(other)).status, 201, "another key")
        for (let i = 0; i < 5; i++) assert.strictEqual((yield* push(sub)).status, 201, "unsigned, from the loopback")
      }))
  })
})

/** A push signed with `keys` (a fresh JWT) from behind the test's proxy, as `address`. */
const signedPush = (sub: Pick<Subscription, "path">, keys: VapidKeys, address: string) =>
  Effect.flatMap(Effect.promise(() => keys.sign(goodClaims())), (jwt) =>
    push(sub, { authorization: `vapid t=${jwt}, k=${keys.publicKey}`, "x-forwarded-for": address }))

const statuses = (replies: ReadonlyArray<{ readonly status: number }>) => replies.map((r) => r.status)

/** `n` pushes made one after another by `send`: their statuses. */
const times = <R>(n: number, send: () => Effect.Effect<{ readonly status: number }, never, R>) =>
  Effect.map(Effect.forEach(Array.from({ length: n }), send), statuses)

const refusals = (limit: string) => Effect.map(Effect.service(Metrics), (metrics) => metrics.value(METRICS.rateLimited.name, { limit }) ?? 0)

describe("who sends, and to whom", () => {
  // Behind one proxy (the loopback, listed): an address may push 2 at once, a key 5, a subscription 8.
  layer(endpointWith(FakeNodeClient, {
    ...options,
    rateLimits: limited({ perAddress: slow, perVapidKey: { perSecond: 1, burst: 5 }, perSubscription: { perSecond: 1, burst: 8 }, trustedProxies: ["127.0.0.1"] })
  }), { excludeTestServices: true })((it) => {
    it.effect("two senders behind one address, each signing for its own bound subscriptions, are limited apart: one past its key's limit, the other served", () =>
      Effect.gen(function*() {
        const shared = "198.51.100.7"
        const [a, b] = [yield* vapidKeys, yield* vapidKeys]
        const subsOf = (keys: VapidKeys) => Effect.all([subscribe({ key: keys.raw }), subscribe({ key: keys.raw })])
        const [subsA, subsB] = [yield* subsOf(a), yield* subsOf(b)]
        // A: 5 pushes over its two subscriptions, past the address's burst of 2; the sixth is its key's limit.
        const fromA = yield* times(5, () => signedPush(subsA[0], a, shared))
        assert.deepStrictEqual(fromA, [201, 201, 201, 201, 201], "not counted against the address")
        const refused = yield* signedPush(subsA[1], a, shared)
        assert.strictEqual(refused.status, 429)
        assert.strictEqual(refused.headers["retry-after"], "1")
        assert.deepInclude(refused.json(), { errno: 116, message: "Too many pushes from this VAPID key, retry after 1 s" })
        // B, behind the same address: served, to each of its subscriptions.
        assert.deepStrictEqual(yield* times(4, () => signedPush(subsB[0], b, shared)), [201, 201, 201, 201])
        assert.strictEqual((yield* signedPush(subsB[1], b, shared)).status, 201)
        // The address's own bucket is untouched: an unsigned push from it still has its burst.
        const unsigned = yield* subscribe()
        assert.deepStrictEqual(yield* times(3, () => push(unsigned, { "x-forwarded-for": shared })), [201, 201, 429])
        assert.strictEqual(yield* refusals("vapid_key"), 1)
      }))

    it.effect("a key the subscription is not bound to names nobody: the push counts against its address (and its key)", () =>
      Effect.gen(function*() {
        const address = "198.51.100.8"
        const keys = yield* vapidKeys
        const unbound = yield* subscribe()
        const boundToAnother = yield* subscribe({ key: (yield* vapidKeys).raw })
        assert.deepStrictEqual(yield* times(2, () => signedPush(unbound, keys, address)), [201, 201])
        const refused = yield* signedPush(unbound, keys, address)
        assert.deepInclude(refused.json(), { code: 429, errno: 116, message: "Too many pushes from this address, retry after 1 s" })
        // Credentials for another key than the binding's: counted by address, refused before its signature is checked.
        assert.deepInclude((yield* signedPush(boundToAnother, keys, address)).json(), { code: 429, message: "Too many pushes from this address, retry after 1 s" })
      }))

    it.effect("signatures that fail for a bound key count per key and address, in a bucket of their own: 401 while it lasts, then 429; the address's other senders go on", () =>
      Effect.gen(function*() {
        const address = "198.51.100.9"
        const [owner, forger, neighbour] = [yield* vapidKeys, yield* vapidKeys, yield* vapidKeys]
        const sub = yield* subscribe({ key: owner.raw })
        // The owner's public key, signed by another: a claim that fails at its signature.
        const forged = () =>
          Effect.flatMap(Effect.promise(() => forger.sign(goodClaims())), (jwt) =>
            push(sub, { authorization: `vapid t=${jwt}, k=${owner.publicKey}`, "x-forwarded-for": address }))
        assert.deepStrictEqual(yield* times(3, forged), [401, 401, 429])
        const refused = yield* forged()
        assert.deepInclude(refused.json(), { errno: 116, message: "Too many pushes for this VAPID key with a signature that does not verify from this address, retry after 1 s" })
        assert.strictEqual(refused.headers["retry-after"], "1")
        assert.strictEqual(yield* refusals("bad_signature"), 2)
        // Refused before its signature is checked: the key's pushes from this address, its owner's too.
        assert.strictEqual((yield* signedPush(sub, owner, address)).status, 429)
        assert.strictEqual((yield* signedPush(sub, owner, "198.51.100.10")).status, 201, "the key's owner, from another address")
        assert.strictEqual((yield* signedPush(yield* subscribe({ key: neighbour.raw }), neighbour, address)).status, 201, "another key, from this address")
        assert.strictEqual((yield* push(yield* subscribe(), { "x-forwarded-for": address })).status, 201, "an unsigned push from it")
      }))

    it.effect("one subscription's bucket, whoever sends: its senders together are limited, another subscription is not", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        // 8 pushes from 4 addresses, each within its own limit: the ninth, from a fifth, is the subscription's.
        const senders = ["203.0.113.40", "203.0.113.41", "203.0.113.42", "203.0.113.43"]
        for (const sender of senders) assert.deepStrictEqual(yield* times(2, () => push(sub, { "x-forwarded-for": sender })), [201, 201])
        const refused = yield* push(sub, { "x-forwarded-for": "203.0.113.44" })
        assert.strictEqual(refused.status, 429)
        assert.deepInclude(refused.json(), { errno: 116, message: "Too many pushes to this subscription, retry after 1 s" })
        assert.strictEqual((yield* push(yield* subscribe(), { "x-forwarded-for": "203.0.113.44" })).status, 201, "another subscription, the same sender")
        assert.strictEqual(yield* refusals("subscription"), 1)
      }))
  })
})
