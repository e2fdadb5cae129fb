import { assert, describe, it } from "@effect/vitest"
import { Clock, Deferred, Effect, Fiber, Layer, Logger } from "effect"
import { TestClock } from "effect/testing"
import { EndpointCrypto } from "../../src/crypto/endpoint.ts"
import { opaqueId } from "../../src/observability/opaque.ts"
import { emptySummary, foldSummary, summaryFields } from "../../src/observability/sessionSummary.ts"
import { mapStorageOperations, Storage, StorageError, type StorageService } from "../../src/storage/Storage.ts"
import { Unavailable } from "../../src/storage/failures.ts"
import { monthTableName } from "../../src/storage/tables.ts"
import { type Client, type Harness, makeHarness, pump, pushMessage, sessionOptions, setBroadcasts, TestParts, testParts } from "./harness.ts"

const NOW = Date.UTC(2026, 10, 21, 12, 0, 0)
const CHID = "eac8e1de-cddf-42d6-9919-a7b0e0f41e59"
const CHID2 = "7dbb5bdb-0845-4535-98c9-0f34a94e2e7b"
/** Three sites' subscriptions of one user: msg_limit guards many together (one counts up to half of it). */
const SITES = [CHID, CHID2, "0f4e3a52-5a1c-4d2e-9c6b-3b8f6a1d2e7c"]
const VAPID_KEY = "BKlyY43YrGTW22IHoLvkIZyrcD3nTsaQGSXe6e7iapBYFrFoaXq0MBacyF0SOIydSR8uvXoH_0WGcyMY0pzLViA="

const setup = (overrides: Parameters<typeof makeHarness>[0] = {}) =>
  Effect.gen(function*() {
    yield* TestClock.setTime(NOW)
    return yield* makeHarness(overrides)
  })

const hello = (client: Client, uaid?: string) =>
  client.frame(uaid === undefined ? { messageType: "hello", use_webpush: true } : { messageType: "hello", uaid, use_webpush: true })

/** A connected client with one registered channel; returns its uaid. */
const subscribed = (harness: Harness, channelIds: ReadonlyArray<string> = [CHID]) =>
  Effect.gen(function*() {
    const client = yield* harness.connect()
    yield* hello(client)
    for (const channelID of channelIds) yield* client.frame({ messageType: "register", channelID })
    return { client, uaid: client.of("hello")[0]!["uaid"] as string }
  })

const ackAll = (client: Client) =>
  Effect.gen(function*() {
    const pending = client.of("notification")
    yield* client.frame({
      messageType: "ack",
      updates: pending.map((f) => ({ channelID: f["channelID"] as string, version: f["version"] as string, code: 100 }))
    })
  })

describe("session: hello", () => {
  it.effect("a new client gets a fresh uaid; nothing is written until its first register", () =>
    Effect.gen(function*() {
      const harness = yield* setup()
      const client = yield* harness.connect()
      yield* hello(client)
      const reply = client.of("hello")[0]!
      assert.match(reply["uaid"] as string, /^[0-9a-f]{32}$/)
      assert.deepStrictEqual(reply, { messageType: "hello", uaid: reply["uaid"], status: 200, use_webpush: true, broadcasts: {} })
      const storage = yield* Storage
      assert.isUndefined(yield* storage.getUser(reply["uaid"] as string))
      yield* client.frame({ messageType: "register", channelID: CHID })
      const user = yield* storage.getUser(reply["uaid"] as string)
      assert.strictEqual(user?.nodeId, "http://node-a:8081")
      assert.strictEqual(user?.currentMonth, monthTableName("message", NOW))
      assert.deepStrictEqual([...(yield* storage.getChannels(user!.uaid, user!.currentMonth!))], [CHID])
    }).pipe(Effect.provide(TestParts)))

  it.effect("a known uaid in any spelling resumes; an unknown or malformed one is reassigned", () =>
    Effect.gen(function*() {
      const harness = yield* setup()
      const { uaid } = yield* subscribed(harness)
      const hyphenated = `${uaid.slice(0, 8)}-${uaid.slice(8, 12)}-${uaid.slice(12, 16)}-${uaid.slice(16, 20)}-${uaid.slice(20)}`
      const again = yield* harness.connect()
      yield* hello(again, hyphenated.toUpperCase())
      assert.strictEqual(again.of("hello")[0]!["uaid"], uaid)
      for (const claimed of ["00000000000000000000000000000001", "not-a-uuid", ""]) {
        const other = yield* harness.connect()
        yield* hello(other, claimed)
        assert.notStrictEqual(other.of("hello")[0]!["uaid"], claimed)
        assert.match(other.of("hello")[0]!["uaid"] as string, /^[0-9a-f]{32}$/)
      }
      assert.deepStrictEqual(harness.events.filter((e) => e.type === "client.hello.1").map((e) => e.data), [
        { kind: "new" },
        { kind: "existing" },
        { kind: "reassigned" },
        { kind: "new" },
        { kind: "new" }
      ])
    }).pipe(Effect.provide(TestParts)))

  it.effect("one live session per uaid: the newer one kicks the older", () =>
    Effect.gen(function*() {
      const harness = yield* setup()
      const { client: first, uaid } = yield* subscribed(harness)
      const second = yield* harness.connect()
      yield* TestClock.adjust(10)
      yield* hello(second, uaid)
      yield* pump(first)
      assert.deepStrictEqual(first.sent.closed, { code: 1011, reason: "Ghost" })
      assert.strictEqual(harness.registry.get(uaid), second.handle)
    }).pipe(Effect.provide(TestParts)))

  it.effect("a record naming another node makes that node drop its stale session", () =>
    Effect.gen(function*() {
      const harness = yield* setup()
      const { client, uaid } = yield* subscribed(harness)
      yield* client.feed({ _tag: "SocketClosed" })
      const storage = yield* Storage
      yield* storage.updateUser(uaid, { nodeId: "http://node-b:8081" })
      const again = yield* harness.connect()
      yield* TestClock.adjust(10)
      yield* hello(again, uaid)
      assert.deepInclude(harness.pokes[0] ?? {}, { kind: "disconnect", nodeId: "http://node-b:8081", uaid })
      assert.strictEqual(harness.pokes.length, 1)
    }).pipe(Effect.provide(TestParts)))
})

describe("session: a resumed session is the same as a fresh one", () => {
  /** A client's uaid, its session closed, and time passed (Firefox restarts). */
  /** A user with three subscriptions (three sites) that was connected and is away now. */
  const returning = (harness: Harness) =>
    Effect.gen(function*() {
      const { client, uaid } = yield* subscribed(harness, SITES)
      yield* client.feed({ _tag: "SocketClosed" })
      yield* TestClock.adjust(1_000)
      return uaid
    })

  it.effect("resumed after time has passed: direct delivery, unacked saved at the end, node_id cleared, and again", () =>
    Effect.gen(function*() {
      const harness = yield* setup()
      const storage = yield* Storage
      const uaid = yield* returning(harness)
      for (const round of [1, 2]) {
        const client = yield* harness.connect()
        yield* hello(client, uaid)
        assert.strictEqual(client.of("hello")[0]!["uaid"], uaid)
        const record = yield* storage.getUser(uaid)
        assert.strictEqual(record?.nodeId, sessionOptions.routerUrl)
        assert.strictEqual(client.handle.connectedAt, record?.connectedAt, "the session is the one its record names")
        yield* TestClock.adjust(250)
        const acked = yield* pushMessage(harness, uaid, CHID, { data: `acked ${round}` })
        const kept = yield* pushMessage(harness, uaid, CHID, { data: `kept ${round}` })
        assert.isTrue(acked.direct && kept.direct, `round ${round}: a resumed, connected client gets pushes directly`)
        yield* pump(client)
        assert.deepStrictEqual(client.of("notification").map((f) => f["data"]), [...(round === 2 ? ["kept 1"] : []), `acked ${round}`, `kept ${round}`])
        const versions = client.of("notification").filter((f) => f["data"] !== `kept ${round}`).map((f) => f["version"] as string)
        yield* client.frame({ messageType: "ack", updates: versions.map((version) => ({ channelID: CHID, version })) })
        yield* TestClock.adjust(5_000)
        yield* client.feed({ _tag: "SocketClosed" })
        assert.isUndefined((yield* storage.getUser(uaid))?.nodeId, `round ${round}: node_id cleared when the session ended`)
        // Offline now: a push is stored (the node is not asked for a client it no longer holds).
        if (round === 2) {
          const offline = yield* pushMessage(harness, uaid, CHID, { data: "offline" })
          assert.isFalse(offline.direct)
        }
        yield* TestClock.adjust(1_000)
      }
      const last = yield* harness.connect()
      yield* hello(last, uaid)
      assert.deepStrictEqual(last.of("notification").map((f) => f["data"]), ["kept 2", "offline"])
      const events = harness.events.filter((e) => e.type === "notification.delivered.1" && e.uaid === uaid)
      assert.deepStrictEqual(events.map((e) => e.type === "notification.delivered.1" ? e.data.source : ""), ["direct", "direct", "stored", "direct", "direct", "stored", "stored"])
    }).pipe(Effect.provide(TestParts)))

  /** The three sites' channels in turn. */
  const site = (i: number) => SITES[i % SITES.length] as string

  it.effect("a resumed session over msg_limit (three subscriptions together) gets msg_limit messages, then UaidReset, then a new uaid", () =>
    Effect.gen(function*() {
      const harness = yield* setup({ msgLimit: 20, pageSize: 25 })
      const uaid = yield* returning(harness)
      for (let i = 0; i < 21; i++) yield* pushMessage(harness, uaid, site(i), { data: `m${i}` })
      const client = yield* harness.connect()
      yield* hello(client, uaid)
      assert.strictEqual(client.of("hello")[0]!["uaid"], uaid)
      yield* TestClock.adjust(300)
      assert.strictEqual(client.of("notification").length, 20)
      yield* ackAll(client)
      assert.deepStrictEqual(client.sent.closed, { code: 1000, reason: "UaidReset" })
      const next = yield* harness.connect()
      yield* hello(next, uaid)
      assert.notStrictEqual(next.of("hello")[0]!["uaid"], uaid)
      assert.isUndefined(next.sent.closed)
    }).pipe(Effect.provide(TestParts)))

  for (const pageSize of [3, 10, 25]) {
    it.effect(`msg_limit does not depend on the page size (${pageSize}): 21 stored for three subscriptions → 20 arrive and a reset; exactly 20 → all, no reset`, () =>
      Effect.gen(function*() {
        const harness = yield* setup({ msgLimit: 20, pageSize })
        for (const stored of [21, 20]) {
          const uaid = yield* returning(harness)
          for (let i = 0; i < stored; i++) yield* pushMessage(harness, uaid, site(i), { data: `m${i}` })
          const client = yield* harness.connect()
          yield* hello(client, uaid)
          let seen = 0
          while (client.of("notification").length > seen && client.sent.closed === undefined) {
            const fresh = client.of("notification").slice(seen)
            seen += fresh.length
            yield* TestClock.adjust(20)
            yield* client.frame({ messageType: "ack", updates: fresh.map((f) => ({ channelID: f["channelID"] as string, version: f["version"] as string })) })
          }
          assert.strictEqual(seen, 20, `${stored} stored`)
          assert.deepStrictEqual(client.sent.closed, stored > 20 ? { code: 1000, reason: "UaidReset" } : undefined, `${stored} stored`)
          assert.strictEqual((yield* (yield* Storage).getUser(uaid)) === undefined, stored > 20)
        }
      }).pipe(Effect.provide(TestParts)))
  }

  it.effect("one subscription alone never resets its user: 30 stored for one site (msg_limit 20) all arrive, the other site's too, nobody is dropped", () =>
    Effect.gen(function*() {
      const harness = yield* setup({ msgLimit: 20, pageSize: 10 })
      const uaid = yield* returning(harness)
      for (let i = 0; i < 30; i++) yield* pushMessage(harness, uaid, CHID, { data: `loud ${i}` })
      for (let i = 0; i < 5; i++) yield* pushMessage(harness, uaid, CHID2, { data: `quiet ${i}` })
      const client = yield* harness.connect()
      yield* hello(client, uaid)
      while (client.of("notification").length < 35 && client.sent.closed === undefined) yield* ackAll(client)
      assert.strictEqual(client.of("notification").length, 35)
      assert.isUndefined(client.sent.closed)
      assert.isDefined(yield* (yield* Storage).getUser(uaid))
    }).pipe(Effect.provide(TestParts)))

  it.effect("what is pushed to a connected client never counts towards msg_limit: 3 × msg_limit to a client that acks are all delivered, nobody is dropped", () =>
    Effect.gen(function*() {
      const harness = yield* setup({ msgLimit: 20, pageSize: 10, clientChannelCapacity: 4 })
      const { client, uaid } = yield* subscribed(harness)
      // Beyond the connection's capacity the endpoint stores and pokes: the drain reads what it stored.
      for (let i = 0; i < 60; i++) {
        yield* pushMessage(harness, uaid, CHID, { data: `burst ${i}` })
        if (i % 7 === 6) yield* ackAll(client)
      }
      while (client.of("notification").length < 60 && client.sent.closed === undefined) {
        yield* ackAll(client)
        yield* pump(client)
      }
      assert.deepStrictEqual(client.of("notification").map((f) => f["data"]), Array.from({ length: 60 }, (_, i) => `burst ${i}`))
      assert.isUndefined(client.sent.closed)
    }).pipe(Effect.provide(TestParts)))
})

describe("session: the client's minimum urgency (RFC 8030 §5.3)", () => {
  it.effect("less urgent pushes are held in storage, not sent; sent once the minimum is lowered; the minimum survives a reconnect", () =>
    Effect.gen(function*() {
      const harness = yield* setup()
      const { client, uaid } = yield* subscribed(harness)
      const urgencyPush = (data: string, urgency?: "very-low" | "low" | "normal" | "high") =>
        pushMessage(harness, uaid, CHID, { data, ...(urgency === undefined ? {} : { urgency }) })
      yield* client.frame({ messageType: "urgency", min: "high" })
      assert.deepStrictEqual(client.of("urgency"), [{ messageType: "urgency", status: 200 }])
      const storage = yield* Storage
      assert.strictEqual((yield* storage.getUser(uaid))?.urgency, "high", "kept in the router record")
      const low = yield* urgencyPush("held", "low")
      const plain = yield* urgencyPush("held too") // no Urgency header: normal
      const high = yield* urgencyPush("now", "high")
      assert.deepStrictEqual([low.direct, plain.direct, high.direct], [false, false, true])
      yield* pump(client)
      assert.deepStrictEqual(client.of("notification").map((f) => f["data"]), ["now"])
      yield* ackAll(client)
      yield* client.frame({ messageType: "urgency", min: "low" })
      yield* pump(client)
      assert.deepStrictEqual(client.of("notification").map((f) => f["data"]), ["now", "held", "held too"])
      yield* ackAll(client)
      // Raised again, then a reconnect: the new session holds to the record's minimum.
      yield* client.frame({ messageType: "urgency", min: "normal" })
      yield* client.feed({ _tag: "SocketClosed" })
      yield* urgencyPush("waits", "very-low")
      yield* TestClock.adjust(1_000)
      const again = yield* harness.connect()
      yield* hello(again, uaid)
      const waiting = yield* urgencyPush("comes", "normal")
      assert.isTrue(waiting.direct)
      yield* pump(again)
      assert.deepStrictEqual(again.of("notification").map((f) => f["data"]), ["comes"])
      yield* again.frame({ messageType: "urgency", min: "very-low" })
      yield* pump(again)
      assert.deepStrictEqual(again.of("notification").map((f) => f["data"]), ["comes", "waits"])
    }).pipe(Effect.provide(TestParts)))
})

describe("session: register and unregister", () => {
  it.effect("v1 and v2 endpoints decode to the uaid and channel; bad input keeps the socket", () =>
    Effect.gen(function*() {
      const harness = yield* setup()
      const crypto = yield* EndpointCrypto
      const { client, uaid } = yield* subscribed(harness)
      yield* client.frame({ messageType: "register", channelID: CHID2, key: VAPID_KEY })
      const [v1, v2] = client.of("register")
      assert.strictEqual(v1!["status"], 200)
      const v1Url = new URL(v1!["pushEndpoint"] as string)
      assert.match(v1Url.pathname, /^\/wpush\/v1\//)
      const t1 = yield* crypto.parseEndpoint("v1", v1Url.pathname.split("/")[3]!)
      assert.deepStrictEqual([t1.uaid, t1.channelId], [uaid, CHID])
      const v2Url = new URL(v2!["pushEndpoint"] as string)
      const t2 = yield* crypto.parseEndpoint("v2", v2Url.pathname.split("/")[3]!)
      assert.deepStrictEqual([t2.uaid, t2.channelId], [uaid, CHID2])

      yield* client.frame({ messageType: "register", channelID: CHID.toUpperCase() })
      yield* client.frame({ messageType: "register", channelID: CHID, key: "not a key" })
      const replies = client.of("register")
      assert.deepStrictEqual(replies[2], { messageType: "register", channelID: CHID.toUpperCase(), status: 401, pushEndpoint: "" })
      assert.deepStrictEqual(replies[3], {
        messageType: "register",
        channelID: CHID,
        status: 400,
        pushEndpoint: "Failed to generate endpoint"
      })
      assert.isUndefined(client.sent.closed)
    }).pipe(Effect.provide(TestParts)))

  it.effect("unregister removes the channel and answers 200 even when it was not there", () =>
    Effect.gen(function*() {
      const harness = yield* setup()
      const { client, uaid } = yield* subscribed(harness, [CHID, CHID2])
      yield* client.frame({ messageType: "unregister", channelID: CHID, code: 200 })
      yield* client.frame({ messageType: "unregister", channelID: CHID })
      assert.deepStrictEqual(client.of("unregister").map((f) => f["status"]), [200, 200])
      const storage = yield* Storage
      assert.deepStrictEqual([...(yield* storage.getChannels(uaid, monthTableName("message", NOW)))], [CHID2])
    }).pipe(Effect.provide(TestParts)))
})

describe("session: invalid frames and timers", () => {
  const closes = [
    { name: "a frame before hello", events: [{ _tag: "Frame", message: { messageType: "ping" } }], code: 1011, reason: "ExpectedHello" },
    { name: "a bad frame", events: [{ _tag: "BadFrame", detail: "x" }], code: 1011, reason: "Json" },
    { name: "a binary frame", events: [{ _tag: "BinaryFrame" }], code: 1003, reason: "UnsupportedMessage" },
    {
      name: "a second hello",
      events: [
        { _tag: "Frame", message: { messageType: "hello" } },
        { _tag: "Frame", message: { messageType: "hello" } }
      ],
      code: 1011,
      reason: "AlreadyHello"
    }
  ] as const
  for (const c of closes) {
    it.effect(`${c.name} closes ${c.code} ${c.reason}`, () =>
      Effect.gen(function*() {
        const harness = yield* setup()
        const client = yield* harness.connect()
        for (const event of c.events) yield* client.feed(event)
        assert.deepStrictEqual(client.sent.closed, { code: c.code, reason: c.reason })
        assert.isTrue(client.machine.isClosed)
      }).pipe(Effect.provide(TestParts)))
  }

  it.effect("no hello within hello_timeout closes HandshakeTimeout", () =>
    Effect.gen(function*() {
      const harness = yield* setup()
      const client = yield* harness.connect()
      assert.strictEqual(client.handle.deadline, (yield* Clock.currentTimeMillis) + 5_000)
      yield* TestClock.adjust(4_999)
      yield* client.feed({ _tag: "Tick" })
      assert.isUndefined(client.sent.closed)
      yield* TestClock.adjust(1)
      yield* client.feed({ _tag: "Tick" })
      assert.deepStrictEqual(client.sent.closed, { code: 1011, reason: "HandshakeTimeout" })
    }).pipe(Effect.provide(TestParts)))

  it.effect("keepalive: ping after auto_ping_interval, close when no pong within auto_ping_timeout", () =>
    Effect.gen(function*() {
      const harness = yield* setup()
      const { client } = yield* subscribed(harness)
      yield* TestClock.adjust(300_000)
      yield* client.feed({ _tag: "Tick" })
      assert.strictEqual(client.sent.pings, 1)
      yield* TestClock.adjust(1_000)
      yield* client.feed({ _tag: "Pong" })
      yield* TestClock.adjust(300_000)
      yield* client.feed({ _tag: "Tick" })
      assert.strictEqual(client.sent.pings, 2)
      yield* TestClock.adjust(4_000)
      yield* client.feed({ _tag: "Tick" })
      assert.deepStrictEqual(client.sent.closed, { code: 1011, reason: "PongTimeout" })
    }).pipe(Effect.provide(TestParts)))

  it.effect("client pings are answered with {}; faster than min_ping_interval closes 4774", () =>
    Effect.gen(function*() {
      const harness = yield* setup()
      const { client } = yield* subscribed(harness)
      yield* client.frame({ messageType: "ping" })
      yield* TestClock.adjust(45_000)
      yield* client.frame({ messageType: "ping" })
      assert.strictEqual(client.sent.frames.filter((f) => Object.keys(f).length === 0).length, 2)
      yield* TestClock.adjust(44_999)
      yield* client.frame({ messageType: "ping" })
      assert.deepStrictEqual(client.sent.closed, { code: 4774, reason: "ExcessivePing" })
    }).pipe(Effect.provide(TestParts)))

  it.effect("nack gets no reply; broadcast_subscribe of an id the node lacks is answered with errors; the socket stays", () =>
    Effect.gen(function*() {
      const harness = yield* setup()
      const { client } = yield* subscribed(harness)
      const before = client.sent.frames.length
      yield* client.frame({ messageType: "nack", version: "x", code: 301 })
      assert.strictEqual(client.sent.frames.length, before)
      yield* client.frame({ messageType: "broadcast_subscribe", broadcasts: { "remote-settings/monitor_changes": "\"0\"" } })
      assert.deepStrictEqual(client.sent.frames.slice(before), [
        { messageType: "broadcast", broadcasts: { errors: { "remote-settings/monitor_changes": "Broadcast not found" } } }
      ])
      assert.isUndefined(client.sent.closed)
    }).pipe(Effect.provide(TestParts)))
})

describe("session: delivery", () => {
  it.effect("stored messages are drained after hello, deleted on ack, and never come again", () =>
    Effect.gen(function*() {
      const harness = yield* setup()
      const { client, uaid } = yield* subscribed(harness)
      yield* client.feed({ _tag: "SocketClosed" })
      for (let i = 0; i < 3; i++) {
        yield* TestClock.adjust(1)
        yield* pushMessage(harness, uaid, CHID, { data: `m${i}` })
      }
      const again = yield* harness.connect()
      yield* hello(again, uaid)
      assert.deepStrictEqual(again.of("notification").map((f) => f["data"]), ["m0", "m1", "m2"])
      yield* ackAll(again)
      yield* again.feed({ _tag: "SocketClosed" })
      const third = yield* harness.connect()
      yield* hello(third, uaid)
      assert.deepStrictEqual(third.of("notification"), [])
    }).pipe(Effect.provide(TestParts)))

  it.effect("pages: the next page is fetched once the previous one is acked", () =>
    Effect.gen(function*() {
      const harness = yield* setup()
      const { client, uaid } = yield* subscribed(harness)
      yield* client.feed({ _tag: "SocketClosed" })
      const page = sessionOptions.pageSize
      const total = page * 2 + Math.ceil(page / 5)
      for (let i = 0; i < total; i++) {
        yield* TestClock.adjust(1)
        yield* pushMessage(harness, uaid, CHID, { data: `m${i}` })
      }
      const again = yield* harness.connect()
      yield* hello(again, uaid)
      assert.strictEqual(again.of("notification").length, page)
      yield* ackAll(again)
      assert.strictEqual(again.of("notification").length, 2 * page)
      yield* ackAll(again)
      assert.deepStrictEqual(again.of("notification").map((f) => f["data"]), Array.from({ length: total }, (_, i) => `m${i}`))
    }).pipe(Effect.provide(TestParts)))

  it.effect("a client holding what it was sent unacked: a message stored for it meanwhile comes at once (its poke), not after its acks", () =>
    Effect.gen(function*() {
      const harness = yield* setup()
      const { client, uaid } = yield* subscribed(harness)
      yield* client.feed({ _tag: "SocketClosed" })
      for (let i = 0; i < 3; i++) yield* pushMessage(harness, uaid, CHID, { data: `away ${i}` })
      const again = yield* harness.connect()
      yield* hello(again, uaid)
      assert.strictEqual(again.of("notification").length, 3)
      // An endpoint with a stale record stores it and pokes the node: the client has acked nothing.
      yield* pushMessage(harness, uaid, CHID, { data: "stored now", direct: false })
      yield* pump(again)
      assert.deepStrictEqual(again.of("notification").map((f) => f["data"]), ["away 0", "away 1", "away 2", "stored now"])
      yield* ackAll(again)
      yield* pump(again)
      assert.strictEqual(again.of("notification").length, 4, "nothing twice after the acks")
    }).pipe(Effect.provide(TestParts)))

  /** Memory storage (taking the harness's time) that records the name of every operation called. */
  const countedStorage = (calls: Array<string>) =>
    Layer.effect(
      Storage,
      Effect.map(Storage, (inner) =>
        mapStorageOperations(inner, (name) => (call) => Effect.andThen(Effect.sync(() => void calls.push(name)), call), { values: false }))
    ).pipe(Layer.provideMerge(testParts()))

  it.effect("a resumed client with a stored message costs four storage operations: read the record, claim it, one page, one delete", () => {
    const calls: Array<string> = []
    return Effect.gen(function*() {
      const harness = yield* setup()
      const { client, uaid } = yield* subscribed(harness)
      yield* client.feed({ _tag: "SocketClosed" })
      yield* pushMessage(harness, uaid, CHID, { data: "stored" })
      const again = yield* harness.connect()
      calls.length = 0
      yield* hello(again, uaid)
      yield* ackAll(again)
      assert.deepStrictEqual(again.of("notification").map((f) => f["data"]), ["stored"])
      assert.deepStrictEqual(calls, ["getUser", "resumeUser", "fetchMessages", "ackMessages"])
    }).pipe(Effect.provide(countedStorage(calls)))
  })

  it.effect("topic messages come first, timestamp messages after them in order, from one read; a page of topic rows is read again", () => {
    const calls: Array<string> = []
    return Effect.gen(function*() {
      const harness = yield* setup()
      const { client, uaid } = yield* subscribed(harness, [CHID, CHID2])
      yield* client.feed({ _tag: "SocketClosed" })
      yield* pushMessage(harness, uaid, CHID, { data: "first" })
      yield* TestClock.adjust(1)
      yield* pushMessage(harness, uaid, CHID2, { topic: "news", data: "topic" })
      yield* TestClock.adjust(1)
      yield* pushMessage(harness, uaid, CHID, { data: "second" })
      const again = yield* harness.connect()
      calls.length = 0
      yield* hello(again, uaid)
      assert.deepStrictEqual(again.of("notification").map((f) => f["data"]), ["topic", "first", "second"])
      yield* ackAll(again)
      assert.deepStrictEqual(calls, ["getUser", "resumeUser", "fetchMessages", "ackMessages"])
      yield* again.feed({ _tag: "SocketClosed" })

      // More topic messages than a page: the first page holds topic rows only, read again once acked.
      const page = sessionOptions.pageSize
      for (let i = 0; i <= page; i++) yield* pushMessage(harness, uaid, CHID, { topic: `t${String(i).padStart(3, "0")}`, data: `topic ${i}` })
      yield* TestClock.adjust(1)
      yield* pushMessage(harness, uaid, CHID, { data: "after" })
      const third = yield* harness.connect()
      calls.length = 0
      yield* hello(third, uaid)
      assert.strictEqual(third.of("notification").length, page)
      yield* ackAll(third)
      const expected = [...Array.from({ length: page + 1 }, (_, i) => `topic ${i}`), "after"]
      assert.deepStrictEqual(third.of("notification").map((f) => f["data"]), expected)
      yield* ackAll(third)
      assert.deepStrictEqual(calls.filter((name) => name.startsWith("fetch")), ["fetchMessages", "fetchMessages"])
    }).pipe(Effect.provide(countedStorage(calls)))
  })

  it.effect("a topic keeps only its newest message; expired messages are never sent", () =>
    Effect.gen(function*() {
      const harness = yield* setup()
      const { client, uaid } = yield* subscribed(harness)
      yield* client.feed({ _tag: "SocketClosed" })
      yield* pushMessage(harness, uaid, CHID, { topic: "weather", data: "old" })
      yield* pushMessage(harness, uaid, CHID, { topic: "weather", data: "new" })
      yield* pushMessage(harness, uaid, CHID, { ttl: 5, data: "short" })
      yield* TestClock.adjust(5_000)
      const again = yield* harness.connect()
      yield* hello(again, uaid)
      assert.deepStrictEqual(again.of("notification").map((f) => f["data"]), ["new"])
    }).pipe(Effect.provide(TestParts)))

  it.effect("acking a topic message keeps the newer message that replaced it meanwhile", () =>
    Effect.gen(function*() {
      const harness = yield* setup()
      const { client, uaid } = yield* subscribed(harness)
      yield* client.feed({ _tag: "SocketClosed" })
      yield* pushMessage(harness, uaid, CHID, { topic: "t", data: "first" })
      const again = yield* harness.connect()
      yield* hello(again, uaid)
      yield* pushMessage(harness, uaid, CHID, { topic: "t", data: "second", direct: false })
      yield* again.frame({ messageType: "ack", updates: [{ channelID: CHID, version: again.of("notification")[0]!["version"] as string }] })
      yield* pump(again)
      assert.deepStrictEqual(again.of("notification").map((f) => f["data"]), ["first", "second"])
    }).pipe(Effect.provide(TestParts)))

  it.effect("unacked direct messages are saved on disconnect and delivered on reconnect", () =>
    Effect.gen(function*() {
      const harness = yield* setup()
      const { client, uaid } = yield* subscribed(harness)
      const a = yield* pushMessage(harness, uaid, CHID, { data: "a" })
      const b = yield* pushMessage(harness, uaid, CHID, { data: "b" })
      yield* pushMessage(harness, uaid, CHID, { data: "gone", ttl: 0 })
      assert.isTrue(a.direct && b.direct)
      yield* pump(client)
      assert.deepStrictEqual(client.of("notification").map((f) => f["data"]), ["a", "b", "gone"])
      assert.deepStrictEqual(Object.keys(client.of("notification")[0]!).sort(), ["channelID", "data", "headers", "messageType", "version"])
      yield* client.frame({ messageType: "ack", updates: [{ channelID: CHID, version: a.notification.version }] })
      yield* client.feed({ _tag: "SocketClosed" })
      const storage = yield* Storage
      assert.isUndefined((yield* storage.getUser(uaid))?.nodeId)
      const again = yield* harness.connect()
      yield* hello(again, uaid)
      assert.deepStrictEqual(again.of("notification").map((f) => f["data"]), ["b"])
      assert.strictEqual(again.of("notification")[0]!["version"], b.notification.version)
    }).pipe(Effect.provide(TestParts)))

  it.effect("an unacked direct topic message is not saved over the newer stored one of its topic", () =>
    Effect.gen(function*() {
      const harness = yield* setup()
      const { client, uaid } = yield* subscribed(harness)
      yield* pushMessage(harness, uaid, CHID, { topic: "t", data: "older-direct" })
      yield* TestClock.adjust(1)
      yield* pushMessage(harness, uaid, CHID, { topic: "t", data: "newer-stored", direct: false })
      yield* pump(client)
      assert.deepStrictEqual(client.of("notification").map((f) => f["data"]), ["older-direct", "newer-stored"])
      yield* client.feed({ _tag: "SocketClosed" })
      const again = yield* harness.connect()
      yield* hello(again, uaid)
      assert.deepStrictEqual(again.of("notification").map((f) => f["data"]), ["newer-stored"])
    }).pipe(Effect.provide(TestParts)))

  it.effect("a topic message delivered directly replaces the older stored one of its topic: a later connection does not get the older one after it", () =>
    Effect.gen(function*() {
      const harness = yield* setup()
      const { client, uaid } = yield* subscribed(harness)
      // Stored while connected (the node refused them): the poke reads timestamp rows after the page
      // the client holds unacked, not the topic row stored meanwhile.
      yield* pushMessage(harness, uaid, CHID, { data: "held", direct: false })
      yield* pump(client)
      yield* TestClock.adjust(1)
      yield* pushMessage(harness, uaid, CHID, { topic: "t", data: "older", direct: false })
      yield* pump(client)
      yield* TestClock.adjust(1)
      const newer = yield* pushMessage(harness, uaid, CHID, { topic: "t", data: "newer" })
      assert.isTrue(newer.direct)
      yield* pump(client)
      assert.deepStrictEqual(client.of("notification").map((f) => f["data"]), ["held", "newer"])
      yield* client.frame({ messageType: "ack", updates: [{ channelID: CHID, version: newer.notification.version }] })
      yield* client.feed({ _tag: "SocketClosed" })
      const again = yield* harness.connect()
      yield* hello(again, uaid)
      assert.deepStrictEqual(again.of("notification").map((f) => f["data"]), ["held"])
    }).pipe(Effect.provide(TestParts)))

  it.effect("deliveries still queued when the socket closes are saved, not dropped", () =>
    Effect.gen(function*() {
      const harness = yield* setup()
      const { client, uaid } = yield* subscribed(harness)
      const queued = yield* pushMessage(harness, uaid, CHID, { data: "queued" })
      assert.isTrue(queued.direct)
      yield* client.feed({ _tag: "SocketClosed" })
      assert.deepStrictEqual(client.of("notification"), [])
      const again = yield* harness.connect()
      yield* hello(again, uaid)
      assert.deepStrictEqual(again.of("notification").map((f) => f["data"]), ["queued"])
    }).pipe(Effect.provide(TestParts)))

  it.effect("a delivery beyond client_channel_capacity is refused so the endpoint stores it", () =>
    Effect.gen(function*() {
      const harness = yield* setup({ clientChannelCapacity: 2 })
      const { client, uaid } = yield* subscribed(harness)
      const results = []
      for (const data of ["1", "2", "3"]) results.push((yield* pushMessage(harness, uaid, CHID, { data })).direct)
      assert.deepStrictEqual(results, [true, true, false])
      assert.strictEqual(harness.queueFull.count, 1, "the refusal is counted")
      yield* pump(client)
      assert.deepStrictEqual(client.of("notification").map((f) => f["data"]), ["1", "2", "3"])
    }).pipe(Effect.provide(TestParts)))

  it.effect("more than msg_limit stored messages (for three subscriptions) drops the user and closes 1000", () =>
    Effect.gen(function*() {
      const harness = yield* setup({ msgLimit: 12 })
      const { client, uaid } = yield* subscribed(harness, SITES)
      yield* client.feed({ _tag: "SocketClosed" })
      for (let i = 0; i < 15; i++) {
        yield* TestClock.adjust(1)
        yield* pushMessage(harness, uaid, SITES[i % 3] as string, { data: `m${i}` })
      }
      const again = yield* harness.connect()
      yield* hello(again, uaid)
      yield* ackAll(again)
      assert.deepStrictEqual(again.sent.closed, { code: 1000, reason: "UaidReset" })
      const storage = yield* Storage
      assert.isUndefined(yield* storage.getUser(uaid))
      const third = yield* harness.connect()
      yield* hello(third, uaid)
      assert.notStrictEqual(third.of("hello")[0]!["uaid"], uaid)
    }).pipe(Effect.provide(TestParts)))
})

describe("session: monthly rotation", () => {
  it.effect("a user on last month's table is drained there, then moved; commands wait until then", () =>
    Effect.gen(function*() {
      const harness = yield* setup()
      const storage = yield* Storage
      const { client, uaid } = yield* subscribed(harness)
      yield* client.feed({ _tag: "SocketClosed" })
      const lastMonth = monthTableName("message", NOW)
      yield* pushMessage(harness, uaid, CHID, { data: "old-month", ttl: 2_592_000 })
      // Next month: the user's table is now last month's.
      const next = Date.UTC(2026, 11, 2, 12, 0, 0)
      yield* TestClock.setTime(next)
      yield* storage.createTables(yield* storage.activeMessageTables)
      const again = yield* harness.connect()
      yield* hello(again, uaid)
      assert.deepStrictEqual(again.of("notification").map((f) => f["data"]), ["old-month"])
      yield* again.frame({ messageType: "register", channelID: CHID2 })
      assert.deepStrictEqual(again.of("register"), [], "register waits for the month switch")
      // An endpoint that read the old record stores into the old table meanwhile: its poke has it
      // read at once, before the client acked anything.
      yield* pushMessage(harness, uaid, CHID, { data: "late", direct: false })
      yield* pump(again)
      assert.deepStrictEqual(again.of("notification").map((f) => f["data"]), ["old-month", "late"])
      assert.deepStrictEqual(again.of("register"), [], "register waits until the old month is acked")
      yield* ackAll(again)
      yield* pump(again)
      yield* ackAll(again)
      const user = yield* storage.getUser(uaid)
      const thisMonth = monthTableName("message", next)
      assert.strictEqual(user?.currentMonth, thisMonth)
      assert.deepStrictEqual([...(yield* storage.getChannels(uaid, thisMonth))].sort(), [CHID, CHID2].sort())
      assert.strictEqual(again.of("register")[0]!["status"], 200)
      assert.deepStrictEqual(again.of("notification").map((f) => f["data"]), ["old-month", "late"])
      assert.isTrue(harness.events.some((e) => e.type === "month.migrated.1" && e.data.from === lastMonth))
    }).pipe(Effect.provide(TestParts)))

  it.effect("with no_table_rotation nothing moves", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(NOW)
      const harness = yield* makeHarness({ noTableRotation: true })
      const { client, uaid } = yield* subscribed(harness)
      yield* client.feed({ _tag: "SocketClosed" })
      yield* TestClock.setTime(Date.UTC(2027, 3, 1))
      const again = yield* harness.connect()
      yield* hello(again, uaid)
      const storage = yield* Storage
      assert.strictEqual((yield* storage.getUser(uaid))?.currentMonth, "message")
    }).pipe(Effect.provide(testParts(true))))
})

describe("session: the Session record is a fold of the events", () => {
  it.effect("replaying a session's recorded events rebuilds its logged summary exactly", () => {
    const logged: Array<{ readonly message: unknown; readonly annotations: Record<string, unknown> }> = []
    const capture = Logger.layer([Logger.map(Logger.formatStructured, (entry) => void logged.push(entry))])
    return Effect.gen(function*() {
      const harness = yield* setup()
      const { client, uaid } = yield* subscribed(harness, [CHID, CHID2])
      yield* client.frame({ messageType: "unregister", channelID: CHID2 })
      const acked = yield* pushMessage(harness, uaid, CHID, { data: "acked" })
      yield* pushMessage(harness, uaid, CHID, { data: "left unacked" })
      yield* pump(client)
      yield* client.frame({ messageType: "ack", updates: [{ channelID: CHID, version: acked.notification.version }] })
      yield* client.frame({ messageType: "nack", version: acked.notification.version, code: 301 })
      yield* TestClock.adjust(2_500)
      yield* client.feed({ _tag: "SocketClosed" })

      const records = logged.filter((entry) => entry.message === "Session")
      assert.strictEqual(records.length, 1)
      const replayed = summaryFields(harness.events.filter((e) => e.uaid === uaid).reduce(foldSummary, emptySummary), opaqueId)
      assert.deepStrictEqual(records[0]!.annotations, replayed)
      // 2.5 s idle, plus the time its storage calls took.
      assert.isAtLeast(replayed["connection_time"] as number, 2_500)
      assert.isBelow(replayed["connection_time"] as number, 2_600)
      assert.deepInclude(replayed, {
        registers: 2,
        unregisters: 1,
        direct_acked: 1,
        direct_storage: 1,
        nacks: 1,
        disconnect_reason: "client"
      })
    }).pipe(Effect.provide(Layer.merge(TestParts, capture)))
  })
})

describe("session: acks in flight when we close", () => {
  it.effect("the node stops (close 1001): an ack the client sent before it answered the close is taken, the message is not saved again; what it did not ack is", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(NOW)
      const harness = yield* makeHarness({}, false)
      const { client, uaid } = yield* subscribed(harness)
      yield* pushMessage(harness, uaid, CHID, { data: "acked in flight" })
      yield* pushMessage(harness, uaid, CHID, { data: "never acked" })
      yield* pump(client)
      const [inFlight, unanswered] = client.of("notification")
      yield* client.feed({ _tag: "Kick", kind: "shutdown" })
      assert.deepStrictEqual(client.sent.closed, { code: 1001, reason: "Shutdown" })
      // The client's ack was on the wire as the close frame went out; then its close answers ours.
      yield* client.frame({ messageType: "ack", updates: [{ channelID: CHID, version: inFlight!["version"] as string }] })
      yield* client.feed({ _tag: "SocketClosed" })
      assert.isTrue(client.machine.isClosed)
      const storage = yield* Storage
      const saved = yield* storage.fetchMessages(uaid, monthTableName("message", NOW), 10)
      assert.deepStrictEqual(saved.messages.map((n) => n.version), [unanswered!["version"]])
    }).pipe(Effect.provide(TestParts)))

  it.effect("a client that never answers our close: its acks are taken for the close grace, then the save goes on", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(NOW)
      const harness = yield* makeHarness({ closeGraceMs: 1_000 }, false)
      const { client, uaid } = yield* subscribed(harness)
      yield* pushMessage(harness, uaid, CHID, { data: "late ack" })
      yield* pump(client)
      const [sent] = client.of("notification")
      yield* client.feed({ _tag: "Kick", kind: "shutdown" })
      yield* TestClock.adjust(500)
      yield* client.frame({ messageType: "ack", updates: [{ channelID: CHID, version: sent!["version"] as string }] })
      assert.isFalse(client.machine.isClosed, "still answering within the close grace")
      yield* TestClock.adjust(600)
      yield* client.feed({ _tag: "Tick" })
      assert.isTrue(client.machine.isClosed)
      const saved = yield* (yield* Storage).fetchMessages(uaid, monthTableName("message", NOW), 10)
      assert.deepStrictEqual(saved.messages, [], "acked while we waited: not saved")
    }).pipe(Effect.provide(TestParts)))
})

describe("session: the msg_limit race", () => {
  /** Memory storage whose resume writes wait, while `held` is set, until the test lets them go. */
  let held: { readonly reached: Deferred.Deferred<void>; readonly go: Deferred.Deferred<void> } | undefined
  const GatedStorage = Layer.effect(
    Storage,
    Effect.map(Storage, (inner) =>
      Storage.of({
        ...inner,
        resumeUser: (user) =>
          Effect.suspend(() => {
            const gate = held
            if (gate === undefined) return inner.resumeUser(user)
            held = undefined
            return Deferred.succeed(gate.reached, undefined).pipe(Effect.andThen(Deferred.await(gate.go)), Effect.andThen(inner.resumeUser(user)))
          })
      }))
  ).pipe(Layer.provideMerge(testParts()))

  it.effect("a hello that read the user before it was dropped for msg_limit gets a new uaid, not the dropped one", () =>
    Effect.gen(function*() {
      const harness = yield* setup({ msgLimit: 3 })
      const { client, uaid } = yield* subscribed(harness, [CHID, CHID2])
      yield* client.feed({ _tag: "SocketClosed" })
      for (let i = 0; i < 5; i++) {
        yield* TestClock.adjust(1)
        yield* pushMessage(harness, uaid, i % 2 === 0 ? CHID : CHID2, { data: `m${i}` })
      }
      // B reads the record and is about to re-claim it…
      const gate = { reached: yield* Deferred.make<void>(), go: yield* Deferred.make<void>() }
      held = gate
      const b = yield* harness.connect()
      const bHello = yield* Effect.forkChild(hello(b, uaid))
      yield* Deferred.await(gate.reached)
      // …while A connects, finds more than msg_limit messages, acks the first msg_limit and so drops the user.
      const a = yield* harness.connect()
      yield* TestClock.adjust(5)
      yield* hello(a, uaid)
      assert.strictEqual(a.of("notification").length, 3)
      yield* ackAll(a)
      assert.deepStrictEqual(a.sent.closed, { code: 1000, reason: "UaidReset" })
      yield* Deferred.succeed(gate.go, undefined)
      yield* Fiber.join(bHello)
      const bUaid = b.of("hello")[0]!["uaid"]
      assert.notStrictEqual(bUaid, uaid, "the dropped uaid came back")
      const storage = yield* Storage
      assert.isUndefined(yield* storage.getUser(uaid), "the dropped user was written back")
      assert.deepStrictEqual(b.of("notification"), [])
    }).pipe(Effect.provide(GatedStorage)))
})

describe("session: storage faults and the command budget", () => {
  /** Memory storage (taking the harness's time) whose `operation` fails its next `failures.left` calls. */
  const failingStorage = (operation: keyof StorageService, failures: { left: number }) =>
    Layer.effect(
      Storage,
      Effect.map(Storage, (inner) =>
        mapStorageOperations(inner, (name) => (call) =>
          name !== operation ? call : Effect.suspend(() => {
            if (failures.left === 0) return call
            failures.left--
            return Effect.fail(new StorageError({ operation: name, reason: new Unavailable(), cause: "injected" })) as unknown as typeof call
          })))
    ).pipe(Layer.provideMerge(testParts()))
  const failingReads = { left: 0 }

  it.effect("storage failing mid-drain keeps the socket; the drain resumes with backoff once storage is back", () =>
    Effect.gen(function*() {
      const harness = yield* setup()
      const { client, uaid } = yield* subscribed(harness)
      yield* client.feed({ _tag: "SocketClosed" })
      yield* pushMessage(harness, uaid, CHID, { data: "waiting" })
      failingReads.left = 3
      const again = yield* harness.connect()
      yield* hello(again, uaid)
      assert.deepStrictEqual(again.of("notification"), [])
      for (const wait of [250, 500, 1_000]) {
        assert.isUndefined(again.sent.closed)
        assert.strictEqual(again.handle.deadline, (yield* Clock.currentTimeMillis) + wait, "retried after a doubling backoff")
        yield* TestClock.adjust(wait)
        yield* again.feed({ _tag: "Tick" })
      }
      assert.deepStrictEqual(again.of("notification").map((f) => f["data"]), ["waiting"])
      assert.isUndefined(again.sent.closed)
    }).pipe(Effect.provide(failingStorage("fetchMessages", failingReads))))

  it.effect("the node's shutdown (the session's fiber ends) makes tombstones of acked rows whose tombstoning failed and waits for its retry", () => {
    const failingDeletes = { left: 0 }
    return Effect.gen(function*() {
      const harness = yield* setup()
      const { client, uaid } = yield* subscribed(harness)
      yield* client.feed({ _tag: "SocketClosed" })
      yield* pushMessage(harness, uaid, CHID, { data: "acked" })
      const again = yield* harness.connect()
      yield* hello(again, uaid)
      failingDeletes.left = 1
      yield* ackAll(again)
      const phase = again.machine.phase
      assert.strictEqual(phase._tag === "Identified" || phase._tag === "Draining" ? phase.session.retry?.command._tag : undefined, "TombstoneAcked")
      // Shutdown: the node interrupts the session's fiber, which ends the session as a closed socket would.
      const ending = yield* Effect.forkChild(again.machine.finish())
      yield* TestClock.adjust(5_000)
      yield* Fiber.join(ending)
      assert.isTrue(again.machine.isClosed)
      const last = yield* harness.connect()
      yield* hello(last, uaid)
      assert.deepStrictEqual(last.of("notification"), [], "an acked message came back after the shutdown")
    }).pipe(Effect.provide(failingStorage("ackMessages", failingDeletes)))
  })

  it.effect("a register that meets a missing message table is answered status 500 (the client may retry), and the log names the table and the reason", () => {
    const logged: Array<{ readonly message: unknown; readonly annotations: Record<string, unknown> }> = []
    const capture = Logger.layer([Logger.map(Logger.formatStructured, (entry) => void logged.push(entry))])
    return Effect.gen(function*() {
      const harness = yield* setup()
      const storage = yield* Storage
      const table = yield* storage.currentMessageTable
      yield* storage.dropMessageTable(table)
      const client = yield* harness.connect()
      yield* hello(client)
      yield* client.frame({ messageType: "register", channelID: CHID })
      assert.deepInclude(client.of("register")[0], { status: 500, pushEndpoint: "" })
      assert.isUndefined(client.sent.closed, "the socket stays")
      const line = logged.find((entry) => entry.message === "storage failed")
      assert.deepInclude(line?.annotations, { command: "AddChannel", table, reason: "MissingTable", cause: `table not found: ${table}` })
      // Once the table is back, the same register succeeds.
      yield* storage.createTables([table])
      yield* client.frame({ messageType: "register", channelID: CHID })
      assert.strictEqual(client.of("register")[1]?.["status"], 200)
    }).pipe(Effect.provide(Layer.merge(TestParts, capture)))
  })

  it.effect("a burst of registers beyond the budget waits, with the socket paused, and all are answered in order", () =>
    Effect.gen(function*() {
      const harness = yield* setup({ commandBurst: 10, commandsPerSecond: 10 })
      const { client } = yield* subscribed(harness, [])
      const channels = Array.from({ length: 50 }, (_, i) => `00000000-0000-4000-8000-${String(i).padStart(12, "0")}`)
      for (const channelID of channels) client.handle.mailbox.offer({ _tag: "Frame", message: { messageType: "register", channelID } })
      yield* pump(client)
      assert.strictEqual(client.of("register").length, 10, "the burst")
      assert.isTrue(client.sent.paused, "many waiting: the socket is not read")
      for (let second = 0; second < 4; second++) {
        yield* TestClock.adjust(1_000)
        yield* client.feed({ _tag: "Tick" })
      }
      assert.deepStrictEqual(client.of("register").map((f) => f["channelID"]), channels)
      assert.isTrue(client.of("register").every((f) => f["status"] === 200))
      assert.isFalse(client.sent.paused)
    }).pipe(Effect.provide(TestParts)))
})

describe("session: broadcasts", () => {
  it.effect("hello gets what the client is behind on; a change reaches a follower at its next keepalive tick, once", () =>
    Effect.gen(function*() {
      const harness = yield* setup()
      setBroadcasts(new Map([["remote-settings/monitor_changes", "\"5\""]]))
      const follower = yield* harness.connect()
      yield* follower.frame({ messageType: "hello", use_webpush: true, broadcasts: { "remote-settings/monitor_changes": "\"0\"", gone: "1" } })
      assert.deepStrictEqual(follower.of("hello")[0]!["broadcasts"], {
        "remote-settings/monitor_changes": "\"5\"",
        errors: { gone: "Broadcast not found" }
      })
      const bystander = yield* harness.connect()
      yield* bystander.frame({ messageType: "hello", use_webpush: true })

      setBroadcasts(new Map([["remote-settings/monitor_changes", "\"6\""]]))
      yield* TestClock.adjust(300_000)
      for (const client of [follower, bystander]) yield* client.feed({ _tag: "Tick" })
      assert.deepStrictEqual(follower.of("broadcast"), [{ messageType: "broadcast", broadcasts: { "remote-settings/monitor_changes": "\"6\"" } }])
      assert.strictEqual(follower.sent.pings, 0, "the broadcast went instead of the ping")
      assert.deepStrictEqual(bystander.of("broadcast"), [], "a client that follows nothing gets nothing")
      assert.strictEqual(bystander.sent.pings, 1)

      yield* TestClock.adjust(300_000)
      yield* follower.feed({ _tag: "Tick" })
      assert.strictEqual(follower.of("broadcast").length, 1, "an up-to-date client gets nothing more")
      assert.strictEqual(follower.sent.pings, 1)
      assert.deepStrictEqual(
        harness.events.filter((e) => e.type === "broadcast.delivered.1").map((e) => e.data),
        [
          { broadcasts: { "remote-settings/monitor_changes": "\"5\"" }, reason: "hello" },
          { broadcasts: { "remote-settings/monitor_changes": "\"6\"" }, reason: "change" }
        ]
      )
    }).pipe(Effect.provide(TestParts)))
})
