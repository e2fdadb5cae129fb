import { assert, describe, it } from "@effect/vitest"
import type { UserRecord } from "../../src/domain/user.ts"
import { RouterCache } from "../../src/endpoint/routerCache.ts"

const user = (uaid: string, fields: Partial<UserRecord> = {}): UserRecord => ({
  uaid,
  routerType: "webpush",
  routerData: {},
  connectedAt: 1,
  nodeId: "http://node:8081",
  currentMonth: "message_2026_11",
  ...fields
})

describe("RouterCache", () => {
  it("keeps WebPush users, connected or not, until the ttl; not bridged ones", () => {
    const cache = new RouterCache({ ttlMs: 1_000, entries: 10 })
    cache.remember(user("a"), "c1", 0)
    cache.remember(user("offline", { nodeId: undefined }), "c1", 0)
    cache.remember(user("bridged", { routerType: "fcm" }), "c1", 0)
    cache.remember(user("nowhere", { currentMonth: undefined }), "c1", 0)
    assert.strictEqual(cache.get("a", 999)?.user.uaid, "a")
    assert.deepStrictEqual([...cache.get("a", 999)?.channels ?? []], ["c1"])
    assert.isUndefined(cache.get("offline", 999)?.user.nodeId)
    assert.strictEqual(cache.get("offline", 999)?.user.uaid, "offline")
    assert.isUndefined(cache.get("bridged", 0))
    assert.isUndefined(cache.get("nowhere", 0))
    assert.isUndefined(cache.get("a", 1_000))
    assert.isUndefined(cache.get("offline", 1_000))
    assert.strictEqual(cache.size, 0)
  })

  it("a newer read replaces the record with its own channels; forget removes it", () => {
    const cache = new RouterCache({ ttlMs: 1_000, entries: 10 })
    cache.remember(user("a"), "c1", 0)
    cache.remember(user("a", { nodeId: "http://other:8081" }), "c2", 10)
    assert.strictEqual(cache.get("a", 20)?.user.nodeId, "http://other:8081")
    assert.deepStrictEqual([...cache.get("a", 20)?.channels ?? []], ["c2"], "the channels known go with the record they were read with")
    cache.remember(user("a", { nodeId: undefined }), "c3", 30)
    assert.isUndefined(cache.get("a", 40)?.user.nodeId)
    assert.deepStrictEqual([...cache.get("a", 40)?.channels ?? []], ["c3"])
    cache.remember(user("b"), "c1", 0)
    cache.forget("b")
    assert.isUndefined(cache.get("b", 1))
  })

  it("holds at most `entries`, the oldest going first; a ttl of 0 keeps nothing", () => {
    const cache = new RouterCache({ ttlMs: 1_000, entries: 2 })
    for (const uaid of ["a", "b", "c"]) cache.remember(user(uaid), "c1", 0)
    assert.deepStrictEqual(["a", "b", "c"].map((uaid) => cache.get(uaid, 1) !== undefined), [false, true, true])
    const off = new RouterCache({ ttlMs: 0, entries: 2 })
    off.remember(user("a"), "c1", 0)
    assert.strictEqual(off.size, 0)
  })
})
