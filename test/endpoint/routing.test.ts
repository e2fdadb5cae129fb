/**
 * Routing an accepted POST through fake connection nodes: direct delivery,
 * fall-through to storage, clearing a dead node, TTL 0, storage failures, the re-read and the
 * `/notif` poke; plus what is stored and the message ids handed out.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Effect } from "effect"
import { EndpointCrypto, TEST_ENDPOINT_URL } from "../../src/crypto/endpoint.ts"
import { MORE_INFO } from "../../src/domain/errors.ts"
import { messageKeyOf } from "../../src/domain/notification.ts"
import { EventLogMemory } from "../../src/observability/EventLog.ts"
import { Storage } from "../../src/storage/Storage.ts"
import {
  endpointWith,
  FakeNodeClient,
  fakeNode,
  messagesOf,
  nodeCalls,
  options,
  push,
  StorageFaults,
  subscribe,
  TestEndpoint,
  withStorageFaults
} from "./harness.ts"

const BODY = Buffer.from("0123456789abcdef-pretend-ciphertext")

/** The message id of a 201's `Location`. */
const messageIdOf = (location: string | undefined) => {
  const prefix = `${TEST_ENDPOINT_URL}/m/`
  assert.isTrue(location?.startsWith(prefix), `Location ${location}`)
  return (location ?? "").slice(prefix.length)
}

describe("routing", () => {
  layer(TestEndpoint, { excludeTestServices: true })((it) => {
    it.effect("direct: the node takes it (200) → 201, nothing stored, no poke", () =>
      Effect.gen(function*() {
        const nodeId = yield* fakeNode(200)
        const sub = yield* subscribe({ nodeId })
        const reply = yield* push(sub, { ttl: 120, "content-encoding": "aes128gcm" }, BODY)
        assert.strictEqual(reply.status, 201)
        assert.strictEqual(reply.text, "")
        assert.strictEqual(reply.headers["ttl"], "120")
        const id = messageIdOf(reply.headers["location"])
        const calls = yield* nodeCalls(sub.uaid)
        assert.deepStrictEqual(calls.map((c) => [c.kind, c.nodeId]), [["push", nodeId]])
        const sent = calls[0]?.notification
        assert.deepStrictEqual(sent, {
          channelId: sub.channelId,
          version: id,
          ttl: 120,
          timestamp: sent?.timestamp ?? 0,
          sortkeyTimestamp: sent?.sortkeyTimestamp ?? 0,
          data: BODY.toString("base64url"),
          headers: { encoding: "aes128gcm" }
        })
        assert.approximately(sent?.timestamp ?? 0, Date.now() / 1000, 5)
        assert.deepStrictEqual(yield* messagesOf(sub), [])
      }))

    it.effect("node answers 404 → stored, re-read, node poked with /notif", () =>
      Effect.gen(function*() {
        const nodeId = yield* fakeNode(404)
        const sub = yield* subscribe({ nodeId })
        const reply = yield* push(sub, { ttl: 60 })
        assert.strictEqual(reply.status, 201)
        const id = messageIdOf(reply.headers["location"])
        const calls = yield* nodeCalls(sub.uaid)
        assert.deepStrictEqual(calls.map((c) => [c.kind, c.nodeId]), [["push", nodeId], ["notify", nodeId]])
        const stored = yield* messagesOf(sub)
        assert.strictEqual(stored.length, 1)
        assert.strictEqual(stored[0]?.version, id)
        assert.strictEqual(stored[0]?.ttl, 60)
        assert.isUndefined(stored[0]?.data)
        assert.isUndefined(stored[0]?.headers)
        assert.strictEqual((yield* (yield* Storage).getUser(sub.uaid))?.nodeId, nodeId, "node_id kept on 404")
      }))

    it.effect("node unreachable → node_id cleared, stored, no poke", () =>
      Effect.gen(function*() {
        const nodeId = yield* fakeNode("down")
        const sub = yield* subscribe({ nodeId })
        const reply = yield* push(sub)
        assert.strictEqual(reply.status, 201)
        assert.deepStrictEqual((yield* nodeCalls(sub.uaid)).map((c) => c.kind), ["push"])
        assert.isUndefined((yield* (yield* Storage).getUser(sub.uaid))?.nodeId)
        assert.strictEqual((yield* messagesOf(sub)).length, 1)
      }))

    it.effect("node_id is not cleared when the client reconnected meanwhile (connected_at changed)", () =>
      Effect.gen(function*() {
        const storage = yield* Storage
        let uaid = ""
        const nodeId = yield* fakeNode((call) =>
          call.kind === "push"
            ? storage.updateUser(uaid, { connectedAt: Date.now() + 1000 }).pipe(Effect.orDie, Effect.as("down" as const))
            : Effect.succeed(200)
        )
        const sub = yield* subscribe({ nodeId })
        uaid = sub.uaid
        assert.strictEqual((yield* push(sub)).status, 201)
        assert.strictEqual((yield* storage.getUser(sub.uaid))?.nodeId, nodeId)
      }))

    it.effect("no node: stored, nobody called", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        assert.strictEqual((yield* push(sub)).status, 201)
        assert.deepStrictEqual(yield* nodeCalls(sub.uaid), [])
        assert.strictEqual((yield* messagesOf(sub)).length, 1)
      }))

    it.effect("TTL 0: tried directly, never stored (201 either way)", () =>
      Effect.gen(function*() {
        const offline = yield* subscribe({ nodeId: yield* fakeNode(404) })
        const reply = yield* push(offline, { ttl: 0 })
        assert.strictEqual(reply.status, 201)
        assert.strictEqual(reply.headers["ttl"], "0")
        assert.deepStrictEqual((yield* nodeCalls(offline.uaid)).map((c) => c.kind), ["push"])
        assert.deepStrictEqual(yield* messagesOf(offline), [])

        const nobody = yield* subscribe()
        assert.strictEqual((yield* push(nobody, { ttl: 0 })).status, 201)
        assert.deepStrictEqual(yield* messagesOf(nobody), [])

        const online = yield* subscribe({ nodeId: yield* fakeNode(200) })
        assert.strictEqual((yield* push(online, { ttl: 0 })).status, 201)
        assert.strictEqual((yield* nodeCalls(online.uaid))[0]?.notification?.ttl, 0)
      }))

    it.effect("TTL above max_notification_ttl is capped", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        const reply = yield* push(sub, { ttl: 99_999_999 })
        assert.strictEqual(reply.status, 201)
        assert.strictEqual(reply.headers["ttl"], "2592000")
        assert.strictEqual((yield* messagesOf(sub))[0]?.ttl, 2_592_000)
      }))

    it.effect("storage failure while saving → 503/201 with Retry-After", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe({ nodeId: yield* fakeNode(404) })
        const reply = yield* withStorageFaults(["saveMessage"], push(sub))
        assert.strictEqual(reply.status, 503)
        assert.strictEqual(reply.headers["retry-after"], "120")
        assert.deepStrictEqual(reply.json(), {
          code: 503,
          errno: 201,
          error: "Service Unavailable",
          message: "A database error occurred, retry later",
          more_info: MORE_INFO
        })
      }))

    it.effect("storage failure reading the user → 503/201", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        const reply = yield* withStorageFaults(["getUser"], push(sub))
        assert.strictEqual(reply.status, 503)
        assert.strictEqual(reply.json().errno, 201)
      }))

    it.effect("re-read finds the client on another node → that node is poked", () =>
      Effect.gen(function*() {
        const storage = yield* Storage
        const newNode = yield* fakeNode(200)
        let uaid = ""
        const oldNode = yield* fakeNode(() =>
          storage.updateUser(uaid, { nodeId: newNode, connectedAt: Date.now() + 1 }).pipe(Effect.orDie, Effect.as(404))
        )
        const sub = yield* subscribe({ nodeId: oldNode })
        uaid = sub.uaid
        assert.strictEqual((yield* push(sub)).status, 201)
        assert.deepStrictEqual((yield* nodeCalls(sub.uaid)).map((c) => [c.kind, c.nodeId]), [["push", oldNode], [
          "notify",
          newNode
        ]])
        assert.strictEqual((yield* messagesOf(sub)).length, 1)
      }))

    it.effect("poke fails (node gone) → node_id cleared, still 201", () =>
      Effect.gen(function*() {
        const nodeId = yield* fakeNode((call) => Effect.succeed(call.kind === "push" ? 404 : "down"))
        const sub = yield* subscribe({ nodeId })
        assert.strictEqual((yield* push(sub)).status, 201)
        assert.deepStrictEqual((yield* nodeCalls(sub.uaid)).map((c) => c.kind), ["push", "notify"])
        assert.isUndefined((yield* (yield* Storage).getUser(sub.uaid))?.nodeId)
      }))

    it.effect("re-read fails → still 201 (stored)", () =>
      Effect.gen(function*() {
        const faults = yield* StorageFaults
        const nodeId = yield* fakeNode(() => Effect.sync(() => faults.set("getUser", "fail")).pipe(Effect.as(404)))
        const sub = yield* subscribe({ nodeId })
        const reply = yield* push(sub).pipe(Effect.ensuring(Effect.sync(() => faults.clear())))
        assert.strictEqual(reply.status, 201)
        assert.strictEqual((yield* messagesOf(sub)).length, 1)
      }))

    it.effect("user deleted while routing → 410/105", () =>
      Effect.gen(function*() {
        const storage = yield* Storage
        let uaid = ""
        const nodeId = yield* fakeNode(() => storage.dropUser(uaid).pipe(Effect.orDie, Effect.as(404)))
        const sub = yield* subscribe({ nodeId })
        uaid = sub.uaid
        const reply = yield* push(sub)
        assert.strictEqual(reply.status, 410)
        assert.strictEqual(reply.headers["cache-control"], "max-age=86400")
        assert.deepStrictEqual(reply.json(), {
          code: 410,
          errno: 105,
          error: "Gone",
          message: "User was deleted during routing",
          more_info: MORE_INFO
        })
      }))

    it.effect("message ids: 02:{sortkey ms} without topic, 01:{topic} with one; a topic replaces", () =>
      Effect.gen(function*() {
        const crypto = yield* EndpointCrypto
        const sub = yield* subscribe()
        const before = Date.now()
        const plain = messageIdOf((yield* push(sub)).headers["location"])
        const parsed = yield* crypto.parseMessageId(plain)
        assert.strictEqual(parsed.kind, "timestamp")
        assert.strictEqual(parsed.uaid, sub.uaid)
        assert.strictEqual(parsed.channelId, sub.channelId)
        if (parsed.kind === "timestamp") assert.approximately(parsed.sortkeyTimestamp, before, 2000)

        const first = messageIdOf((yield* push(sub, { topic: "weather" })).headers["location"])
        const second = messageIdOf((yield* push(sub, { topic: "weather" })).headers["location"])
        assert.notStrictEqual(first, second)
        assert.deepStrictEqual(yield* crypto.parseMessageId(second), {
          kind: "topic",
          uaid: sub.uaid,
          channelId: sub.channelId,
          topic: "weather"
        })
        const stored = yield* messagesOf(sub)
        assert.deepStrictEqual(stored.map((m) => [m.version, m.topic]).sort(), [[plain, undefined], [second, "weather"]].sort())
      }))

    it.effect("stored form: data base64url, encryption headers normalised; empty body keeps no headers", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        yield* push(sub, {
          "content-encoding": "aesgcm",
          encryption: "salt=\"c2FsdHNhbHQ=\"",
          "crypto-key": "dh=\"ZGhkaGRo==\";p256ecdsa=cDI1Ng=="
        }, BODY)
        yield* push(sub, { topic: "empty", "content-encoding": "aesgcm", encryption: "salt=abc" })
        const stored = yield* messagesOf(sub)
        const withBody = stored.find((m) => m.topic === undefined)
        assert.strictEqual(withBody?.data, BODY.toString("base64url"))
        assert.deepStrictEqual(withBody?.headers, {
          encoding: "aesgcm",
          encryption: "salt=c2FsdHNhbHQ",
          crypto_key: "dh=ZGhkaGRo;p256ecdsa=cDI1Ng"
        })
        const empty = stored.find((m) => m.topic === "empty")
        assert.isDefined(empty)
        assert.isUndefined(empty?.data)
        assert.isUndefined(empty?.headers)
      }))

    it.effect("domain events: accepted, then stored or expired", () =>
      Effect.gen(function*() {
        const { events } = yield* EventLogMemory
        const sub = yield* subscribe()
        const id = messageIdOf((yield* push(sub, { ttl: 30 })).headers["location"])
        const zero = messageIdOf((yield* push(sub, { ttl: 0 })).headers["location"])
        const routed = (version: string, outcome: string) => ({
          type: "notification.routed.1",
          uaid: sub.uaid,
          data: { channelId: sub.channelId, version, outcome }
        })
        assert.deepStrictEqual(
          events.filter((e) => e.uaid === sub.uaid).map(({ time: _, ...e }) =>
            e.type === "notification.routed.1" ? { ...e, data: { ...e.data, durationMs: undefined } } : e
          ).map((e) => JSON.parse(JSON.stringify(e))),
          [
            { type: "notification.accepted.1", uaid: sub.uaid, data: { channelId: sub.channelId, version: id, ttl: 30 } },
            routed(id, "stored"),
            {
              type: "notification.stored.1",
              uaid: sub.uaid,
              data: { channelId: sub.channelId, version: id, reason: "offline" }
            },
            { type: "notification.accepted.1", uaid: sub.uaid, data: { channelId: sub.channelId, version: zero, ttl: 0 } },
            routed(zero, "dropped"),
            { type: "notification.expired.1", uaid: sub.uaid, data: { version: zero } }
          ]
        )
      }))
  })
})

describe("routing with the router cache (router_cache_ttl)", () => {
  const cached = endpointWith(FakeNodeClient, { ...options, routerCache: { ttlMs: 60_000, entries: 100 } })
  const headers = { ttl: 60, "content-encoding": "aes128gcm" }

  layer(cached, { excludeTestServices: true })((it) => {
    it.effect("a connected client's record is reused: a later push goes to the node it named, without reading the record", () =>
      Effect.gen(function*() {
        const storage = yield* Storage
        const first = yield* fakeNode(200)
        const second = yield* fakeNode(200)
        const sub = yield* subscribe({ nodeId: first })
        assert.strictEqual((yield* push(sub, headers, BODY)).status, 201)
        // The client moved; the cached record still names the first node, which still takes it.
        yield* storage.updateUser(sub.uaid, { nodeId: second })
        assert.strictEqual((yield* push(sub, headers, BODY)).status, 201)
        assert.deepStrictEqual((yield* nodeCalls(sub.uaid)).map((c) => [c.kind, c.nodeId]), [["push", first], ["push", first]])
      }))

    it.effect("a node that does not take it: the record is read again and the message routed on it", () =>
      Effect.gen(function*() {
        const storage = yield* Storage
        const gone = yield* fakeNode(404)
        const current = yield* fakeNode(200)
        const sub = yield* subscribe({ nodeId: gone })
        assert.strictEqual((yield* push(sub, headers, BODY)).status, 201) // 404 → stored, read again
        yield* storage.updateUser(sub.uaid, { nodeId: current })
        assert.strictEqual((yield* push(sub, headers, BODY)).status, 201)
        const calls = (yield* nodeCalls(sub.uaid)).map((c) => [c.kind, c.nodeId])
        // The second push read the record again (a 404 is never cached as good): straight to the current node.
        assert.deepStrictEqual(calls.slice(-1), [["push", current]])
      }))

    it.effect("a stale cached node: the fresh record is used for the same push", () =>
      Effect.gen(function*() {
        const storage = yield* Storage
        let firstTakes = true
        const first = yield* fakeNode(() => Effect.succeed(firstTakes ? 200 : 404))
        const second = yield* fakeNode(200)
        const sub = yield* subscribe({ nodeId: first })
        assert.strictEqual((yield* push(sub, headers, BODY)).status, 201)
        yield* storage.updateUser(sub.uaid, { nodeId: second })
        firstTakes = false
        assert.strictEqual((yield* push(sub, headers, BODY)).status, 201)
        assert.deepStrictEqual((yield* nodeCalls(sub.uaid)).map((c) => [c.kind, c.nodeId]), [["push", first], ["push", first], ["push", second]])
        assert.deepStrictEqual(yield* messagesOf(sub), [])
      }))

    it.effect("a push to a known channel of a connected client reads nothing: it goes to the session the record named", () =>
      Effect.gen(function*() {
        const storage = yield* Storage
        const node = yield* fakeNode(200)
        const sub = yield* subscribe({ nodeId: node })
        const user = yield* storage.getUser(sub.uaid)
        assert.strictEqual((yield* push(sub, headers, BODY)).status, 201)
        // Were storage read, these pushes would fail (503).
        yield* withStorageFaults(["getUser", "hasChannel"], Effect.gen(function*() {
          for (let i = 0; i < 3; i++) assert.strictEqual((yield* push(sub, headers, BODY)).status, 201)
        }))
        const calls = yield* nodeCalls(sub.uaid)
        assert.deepStrictEqual(calls.map((c) => [c.kind, c.connectedAt]), Array(4).fill(["push", user?.connectedAt]))
      }))

    it.effect("an unsubscribed channel is refused at once: the node does not take it, the fresh read finds no channel → 410", () =>
      Effect.gen(function*() {
        const storage = yield* Storage
        let subscribed = true
        // As a connection node: it refuses a channel its session unregistered.
        const node = yield* fakeNode(() => Effect.succeed(subscribed ? 200 : 404))
        const sub = yield* subscribe({ nodeId: node })
        assert.strictEqual((yield* push(sub, headers, BODY)).status, 201)
        yield* storage.removeChannel(sub.uaid, sub.table, sub.channelId)
        subscribed = false
        const refused = yield* push(sub, headers, BODY)
        assert.strictEqual(refused.status, 410)
        assert.strictEqual(JSON.parse(refused.text).errno, 106)
      }))

    // ── a client that was offline: its record is used to store, the re-read after the store checks it ──

    /** The client came back (a new session: `connected_at` moves on), with `patch`. */
    const cameBack = (sub: { readonly uaid: string }, patch: { readonly nodeId?: string } = {}) =>
      Effect.gen(function*() {
        const storage = yield* Storage
        const before = yield* storage.getUser(sub.uaid)
        yield* storage.updateUser(sub.uaid, { ...patch, connectedAt: (before?.connectedAt ?? 0) + 1 })
      })

    it.effect("offline: a later push costs the store and the re-read, no check of the channel", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        assert.strictEqual((yield* push(sub, headers, BODY)).status, 201)
        yield* withStorageFaults(["hasChannel"], Effect.gen(function*() {
          for (let i = 0; i < 3; i++) assert.strictEqual((yield* push(sub, headers, BODY)).status, 201)
        }))
        assert.strictEqual((yield* messagesOf(sub)).length, 4)
      }))

    it.effect("offline: a user dropped meanwhile is found by the re-read (410/105), then refused on a fresh read (410/106)", () =>
      Effect.gen(function*() {
        const storage = yield* Storage
        const sub = yield* subscribe()
        assert.strictEqual((yield* push(sub, headers, BODY)).status, 201)
        yield* storage.dropUser(sub.uaid)
        const during = yield* push(sub, headers, BODY)
        assert.deepStrictEqual([during.status, JSON.parse(during.text).errno], [410, 105])
        const after = yield* push(sub, headers, BODY)
        assert.deepStrictEqual([after.status, JSON.parse(after.text).errno], [410, 106])
      }))

    it.effect("offline: a client that came back gets the first push through storage (its node poked), the next directly", () =>
      Effect.gen(function*() {
        const node = yield* fakeNode(200)
        const sub = yield* subscribe()
        assert.strictEqual((yield* push(sub, headers, BODY)).status, 201)
        yield* cameBack(sub, { nodeId: node })
        assert.strictEqual((yield* push(sub, headers, BODY)).status, 201)
        assert.strictEqual((yield* push(sub, headers, BODY)).status, 201)
        assert.deepStrictEqual((yield* nodeCalls(sub.uaid)).map((c) => c.kind), ["notify", "push"])
        assert.strictEqual((yield* messagesOf(sub)).length, 2, "the first two stored, the third delivered")
      }))

    it.effect("offline: a channel unregistered in a session since is answered 201 once more, then 410", () =>
      Effect.gen(function*() {
        const storage = yield* Storage
        const sub = yield* subscribe()
        assert.strictEqual((yield* push(sub, headers, BODY)).status, 201)
        // The client came back, unregistered the channel, and left again.
        yield* cameBack(sub)
        yield* storage.removeChannel(sub.uaid, sub.table, sub.channelId)
        assert.strictEqual((yield* push(sub, headers, BODY)).status, 201)
        assert.strictEqual((yield* push(sub, headers, BODY)).status, 410)
      }))

    it.effect("offline: TTL 0 is never dropped on a cached record (the client may be back)", () =>
      Effect.gen(function*() {
        const node = yield* fakeNode(200)
        const sub = yield* subscribe()
        assert.strictEqual((yield* push(sub, headers, BODY)).status, 201)
        yield* cameBack(sub, { nodeId: node })
        assert.strictEqual((yield* push(sub, { ...headers, ttl: 0 }, BODY)).status, 201)
        assert.deepStrictEqual((yield* nodeCalls(sub.uaid)).map((c) => c.kind), ["push"])
      }))

    it.effect("offline on last month's table: the client came back and moved to this month's; a push on the cached record is stored where it lives now", () =>
      Effect.gen(function*() {
        const storage = yield* Storage
        const [lastMonth, thisMonth] = (yield* storage.activeMessageTables) as [string, string]
        const node = yield* fakeNode(404)
        const sub = yield* subscribe({ currentMonth: lastMonth })
        assert.strictEqual((yield* push(sub, headers, BODY)).status, 201)
        // Its session drained last month's table and moved the user (channels, then the record).
        yield* storage.ackMessages(sub.uaid, lastMonth, (yield* messagesOf(sub)).map((n) => ({ key: messageKeyOf(n), version: n.version })))
        yield* storage.addChannels(sub.uaid, thisMonth, [sub.channelId])
        yield* cameBack(sub, { nodeId: node })
        yield* storage.updateUser(sub.uaid, { currentMonth: thisMonth })
        const reply = yield* push(sub, headers, BODY)
        assert.strictEqual(reply.status, 201)
        const id = messageIdOf(reply.headers["location"])
        assert.deepStrictEqual((yield* messagesOf(sub)).map((n) => n.version), [], "nothing left in last month's table")
        assert.deepStrictEqual((yield* messagesOf({ uaid: sub.uaid, table: thisMonth })).map((n) => n.version), [id])
        assert.deepStrictEqual((yield* nodeCalls(sub.uaid)).map((c) => [c.kind, c.nodeId]), [["notify", node]])
      }))

    it.effect("a topic message moved to the user's new month does not replace a newer one of its topic there", () =>
      Effect.gen(function*() {
        const storage = yield* Storage
        const [lastMonth, thisMonth] = (yield* storage.activeMessageTables) as [string, string]
        const sub = yield* subscribe({ currentMonth: lastMonth })
        assert.strictEqual((yield* push(sub, headers, BODY)).status, 201)
        yield* storage.ackMessages(sub.uaid, lastMonth, (yield* messagesOf(sub)).map((n) => ({ key: messageKeyOf(n), version: n.version })))
        yield* storage.addChannels(sub.uaid, thisMonth, [sub.channelId])
        yield* cameBack(sub)
        yield* storage.updateUser(sub.uaid, { currentMonth: thisMonth })
        // A newer message of the topic is in the new month already (sent through a fresh record).
        const crypto = yield* EndpointCrypto
        const now = Date.now() + 60_000
        const newer = { channelId: sub.channelId, topic: "t", ttl: 60, timestamp: Math.floor(now / 1000), sortkeyTimestamp: now }
        const version = yield* crypto.makeMessageId({ kind: "topic", uaid: sub.uaid, channelId: sub.channelId, topic: "t", receipt: undefined })
        yield* storage.saveMessage(sub.uaid, thisMonth, { ...newer, version })
        assert.strictEqual((yield* push(sub, { ...headers, topic: "t" }, BODY)).status, 201)
        assert.deepStrictEqual((yield* messagesOf({ uaid: sub.uaid, table: thisMonth })).map((n) => n.version), [version])
        assert.deepStrictEqual(yield* messagesOf(sub), [], "nor is it left in last month's table")
      }))

    it.effect("the re-read fails after a store into last month's table → 503/201 (the user may have moved), never 201", () =>
      Effect.gen(function*() {
        const storage = yield* Storage
        const [lastMonth] = (yield* storage.activeMessageTables) as [string]
        const faults = yield* StorageFaults
        const nodeId = yield* fakeNode(() => Effect.sync(() => faults.set("getUser", "fail")).pipe(Effect.as(404)))
        const sub = yield* subscribe({ nodeId, currentMonth: lastMonth })
        const reply = yield* push(sub).pipe(Effect.ensuring(Effect.sync(() => faults.clear())))
        assert.strictEqual(reply.status, 503)
        assert.strictEqual(JSON.parse(reply.text).errno, 201)
      }))

    it.effect("a user dropped meanwhile: its node does not know it, the fresh read finds nobody → 410", () =>
      Effect.gen(function*() {
        const storage = yield* Storage
        let known = true
        const node = yield* fakeNode(() => Effect.succeed(known ? 200 : 404))
        const sub = yield* subscribe({ nodeId: node })
        assert.strictEqual((yield* push(sub, headers, BODY)).status, 201)
        yield* storage.dropUser(sub.uaid)
        known = false
        assert.strictEqual((yield* push(sub, headers, BODY)).status, 410)
      }))
  })
})

describe("routing with the router cache, to a node that does not check sessions", () => {
  // An older node, or another implementation, ignores the session a push names and takes it.
  const cached = endpointWith(FakeNodeClient, { ...options, routerCache: { ttlMs: 300, entries: 100 } })
  const headers = { ttl: 60, "content-encoding": "aes128gcm" }

  layer(cached, { excludeTestServices: true })((it) => {
    it.effect("an unsubscribed channel is refused once router_cache_ttl has passed", () =>
      Effect.gen(function*() {
        const storage = yield* Storage
        const node = yield* fakeNode(200)
        const sub = yield* subscribe({ nodeId: node })
        assert.strictEqual((yield* push(sub, headers, BODY)).status, 201)
        yield* storage.removeChannel(sub.uaid, sub.table, sub.channelId)
        yield* Effect.sleep("350 millis")
        assert.strictEqual((yield* push(sub, headers, BODY)).status, 410)
      }))
  })
})
