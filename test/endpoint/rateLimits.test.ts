/**
 * Per-sender rate limits: the token bucket's arithmetic, the client address (X-Forwarded-For only
 * from a listed proxy, the rightmost hop that is not one; IPv6 by /64; the loopback not limited),
 * and through the endpoint: 429/116 with Retry-After by address and by VAPID key, other senders
 * untouched, the bucket refilled after a second; the other routes that read a body, a credential or
 * storage take a token of the address's bucket too.
 */
import { assert, describe, it, layer } from "@effect/vitest"
import { Effect } from "effect"
import { clientAddress, makeTokenBuckets, trustedProxies } from "../../src/endpoint/rateLimits.ts"
import { endpointWith, FakeNodeClient, goodClaims, options, push, request, subscribe, vapidKeys } from "./harness.ts"

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

describe("through the endpoint", () => {
  layer(endpointWith(FakeNodeClient, { ...options, rateLimits: { perAddress: slow, perVapidKey: off, trustedProxies: ["127.0.0.1"] } }), {
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

  layer(endpointWith(FakeNodeClient, { ...options, rateLimits: { perAddress: slow, perVapidKey: slow, trustedProxies: [] } }), {
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
