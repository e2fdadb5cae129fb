/**
 * What a session tracks per message has a bound, and a frame costs the same whatever it holds:
 * - a client that reads its pushes and never acks holds at most `client_channel_capacity` of them
 *   (queued or sent and not acked); the router port refuses more, the endpoint stores them, and the
 *   client gets them from storage once it acks — none lost, none twice;
 * - the topics a session remembers (to skip a stored message older than one it sent) stay within
 *   two generations, and the topic of a message still unacked is never forgotten;
 * - a delivery or an ack costs the same with 20,000 messages unacked as with none;
 * - the channels a session remembers as unregistered (to refuse their deliveries) are the latest ones.
 */
import { assert, describe, it } from "@effect/vitest"
import { randomUUID } from "node:crypto"
import { Effect } from "effect"
import { TestClock } from "effect/testing"
import type { Notification } from "../../src/domain/notification.ts"
import { NO_ACKS } from "../../src/protocol/out.ts"
import { type Phase, type Session, TOPICS_GENERATION } from "../../src/protocol/phases.ts"
import { UNREGISTERED_REMEMBERED } from "../../src/protocol/session.ts"
import { makeProtocol } from "../../src/protocol/table.ts"
import { type Client, type Harness, makeHarness, pump, pushMessage, sessionOptions, TestParts } from "./harness.ts"

const NOW = Date.UTC(2026, 10, 21, 12, 0, 0)
const CHID = "eac8e1de-cddf-42d6-9919-a7b0e0f41e59"

const subscribed = (harness: Harness) =>
  Effect.gen(function*() {
    const client = yield* harness.connect()
    yield* client.frame({ messageType: "hello", use_webpush: true })
    yield* client.frame({ messageType: "register", channelID: CHID })
    return { client, uaid: client.of("hello")[0]!["uaid"] as string }
  })

const sessionOf = (client: Client): Session => {
  const phase = client.machine.phase
  if (!("session" in phase)) throw new Error(`no session in ${phase._tag}`)
  return phase.session
}

const ack = (client: Client, versions: ReadonlyArray<string>) =>
  client.frame({ messageType: "ack", updates: versions.map((version) => ({ channelID: CHID, version, code: 100 })) })

describe("unacked messages: bounded", () => {
  it.effect("a client that never acks holds client_channel_capacity messages; the rest are stored, and come once it acks", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(NOW)
      const capacity = 8
      const harness = yield* makeHarness({ clientChannelCapacity: capacity })
      const { client, uaid } = yield* subscribed(harness)
      const pushed: Array<string> = []
      const direct: Array<boolean> = []
      let most = 0
      for (let i = 0; i < 40; i++) {
        yield* TestClock.adjust(1)
        const { notification, direct: wasDirect } = yield* pushMessage(harness, uaid, CHID, { data: `m${i}` })
        pushed.push(notification.version)
        direct.push(wasDirect)
        yield* pump(client)
        most = Math.max(most, sessionOf(client).acks.unacked.size)
      }
      assert.deepStrictEqual(direct.slice(0, capacity), Array(capacity).fill(true), "the first ones go straight to the client")
      assert.deepStrictEqual(direct.slice(capacity), Array(40 - capacity).fill(false), "the rest are refused by the node and stored")
      // Stored ones come from storage a page at a time, the next page once the last is acked.
      assert.isAtMost(most, capacity + sessionOptions.pageSize, "the session holds the capacity and at most a page")
      assert.isAtLeast(harness.queueFull.count, 40 - capacity, "each refusal is counted")
      // The client acks what it has, as it gets it: everything comes, once.
      for (let round = 0; round < 20; round++) {
        const versions = client.of("notification").map((f) => f["version"] as string)
        yield* ack(client, versions.filter((v) => !client.acked.includes(v)))
        yield* pump(client)
      }
      const received = client.of("notification").map((f) => f["version"] as string)
      assert.strictEqual(new Set(received).size, received.length, "none twice")
      assert.deepStrictEqual([...received].sort(), [...pushed].sort(), "none lost")
      assert.strictEqual(sessionOf(client).acks.unacked.size, 0)
    }).pipe(Effect.provide(TestParts)))

  it.effect("TTL 0 messages are not kept once sent: a client holding its capacity still gets them", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(NOW)
      const harness = yield* makeHarness({ clientChannelCapacity: 2 })
      const { client, uaid } = yield* subscribed(harness)
      for (let i = 0; i < 2; i++) yield* pushMessage(harness, uaid, CHID, { data: `kept${i}` })
      yield* pump(client)
      const now = yield* pushMessage(harness, uaid, CHID, { data: "now", ttl: 0 })
      const later = yield* pushMessage(harness, uaid, CHID, { data: "later" })
      assert.deepStrictEqual([now.direct, later.direct], [true, false])
    }).pipe(Effect.provide(TestParts)))

  it.effect("topics: at most two generations are remembered, and an unacked message's topic is never forgotten", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(NOW)
      const harness = yield* makeHarness({ clientChannelCapacity: 10_000 })
      const { client, uaid } = yield* subscribed(harness)
      const kept = yield* pushMessage(harness, uaid, CHID, { topic: "kept", data: "kept" })
      yield* pump(client)
      const topics = 3 * TOPICS_GENERATION
      for (let i = 0; i < topics; i++) {
        yield* TestClock.adjust(1)
        const { notification } = yield* pushMessage(harness, uaid, CHID, { topic: `t${i}`, data: `t${i}` })
        yield* pump(client)
        yield* ack(client, [notification.version])
        const { young, old } = sessionOf(client).acks.newestTopic
        // A generation holds TOPICS_GENERATION topics beyond those of unacked messages (at most two here).
        assert.isAtMost(young.size + old.size, 2 * (TOPICS_GENERATION + 2))
      }
      // The unacked one is saved at the end as its topic's newest, and comes on the next connection.
      yield* client.feed({ _tag: "SocketClosed" })
      const again = yield* harness.connect()
      yield* again.frame({ messageType: "hello", uaid, use_webpush: true })
      assert.deepStrictEqual(again.of("notification").map((f) => f["version"]), [kept.notification.version])
    }).pipe(Effect.provide(TestParts)), 60_000)
})

describe("unregistered channels: bounded", () => {
  it.effect("a client unregistering made-up channels: its session remembers the latest UNREGISTERED_REMEMBERED", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(NOW)
      const harness = yield* makeHarness({ commandBurst: 10_000, commandsPerSecond: 10_000 })
      const { client } = yield* subscribed(harness)
      const channels = Array.from({ length: UNREGISTERED_REMEMBERED + 200 }, () => randomUUID())
      for (const channelID of channels) yield* client.frame({ messageType: "unregister", channelID })
      assert.strictEqual(client.of("unregister").length, channels.length, "each answered")
      const remembered = client.handle.unregistered!
      assert.strictEqual(remembered.size, UNREGISTERED_REMEMBERED)
      assert.isTrue(remembered.has(channels[channels.length - 1]!))
      assert.isFalse(remembered.has(channels[0]!))
    }).pipe(Effect.provide(TestParts)), 60_000)
})

describe("unacked messages: a frame costs the same whatever the session holds", () => {
  const protocol = makeProtocol({ ...sessionOptions, clientChannelCapacity: 1_000_000 } as typeof sessionOptions)
  const notification = (i: number): Notification => ({
    channelId: CHID,
    version: `version-${i}`,
    ttl: 600,
    topic: i % 2 === 0 ? `topic-${i}` : undefined,
    timestamp: Math.floor(NOW / 1000),
    sortkeyTimestamp: NOW + i,
    data: "ZGF0YQ",
    headers: { encoding: "aes128gcm" }
  })
  const identified = (): Phase => ({
    _tag: "Identified",
    session: {
      uaid: "0123456789abcdef0123456789abcdef",
      connectedAt: NOW - 1_000,
      table: "message",
      recorded: true,
      acks: NO_ACKS,
      keepalive: { lastActivity: NOW, pingSentAt: undefined, lastClientPing: undefined },
      budget: { tokens: 100, tokensAt: NOW, held: { length: 0, front: [], start: 0, back: undefined }, readingPaused: false },
      broadcasts: [],
      retry: undefined,
      minUrgency: undefined
    }
  })
  /** `held` deliveries never acked, then the time of 2,000 more deliveries and their acks (one frame each). */
  const cost = (held: number) => {
    let phase = identified()
    for (let i = 0; i < held; i++) phase = protocol.step(phase, { _tag: "Delivery", notification: notification(i) }, NOW).phase
    const started = performance.now()
    for (let i = held; i < held + 2_000; i++) {
      phase = protocol.step(phase, { _tag: "Delivery", notification: notification(i) }, NOW).phase
      const update = { channelID: CHID, version: `version-${i}` }
      phase = protocol.step(phase, { _tag: "Frame", message: { messageType: "ack", updates: [update] } }, NOW).phase
    }
    assert.strictEqual(phase._tag === "Identified" ? phase.session.acks.unacked.size : -1, held)
    return performance.now() - started
  }

  it("2,000 deliveries and acks with 20,000 unacked take about as long as with none", () => {
    cost(100) // warm up
    const none = cost(0)
    const many = cost(20_000)
    // A copy of what is unacked per frame made this 40,000,000 entries copied: seconds, not milliseconds.
    assert.isBelow(many, Math.max(400, 10 * none), `${none.toFixed(1)} ms with none unacked, ${many.toFixed(1)} ms with 20,000`)
  })
})
