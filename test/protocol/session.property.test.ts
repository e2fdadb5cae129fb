/**
 * Property tests of the connection state machine over generated event sequences: connects and
 * disconnects at any point, a second session of the same uaid, pushes (direct or stored, topics,
 * TTLs), partial acks, pokes, clock jumps, a month boundary, and garbage frames. After each run a
 * final session drains everything left, and the invariants are checked:
 * - no acked message is delivered again;
 * - no stored message is lost: every message that was pushed with TTL > 0, is not acked, not expired
 *   and not replaced by a newer message of its topic, arrives in the final drain;
 * - a topic keeps only its newest message;
 * - expired messages are never delivered;
 * - at most one live session per uaid;
 * - every invalid frame has a defined outcome (a close with a code of the table).
 */
import { assert, describe, it } from "@effect/vitest"
import { Arbitrary, Clock, Effect, Schema } from "effect"
import { TestClock } from "effect/testing"
import { decodeClientFrame, isFrameError } from "../../src/protocol/messages.ts"
import { Storage } from "../../src/storage/Storage.ts"
import { type Client, makeHarness, pump, pushMessage, TestParts } from "./harness.ts"

const START = Date.UTC(2026, 10, 27, 12, 0, 0)
const CHANNELS = ["eac8e1de-cddf-42d6-9919-a7b0e0f41e59", "7dbb5bdb-0845-4535-98c9-0f34a94e2e7b"] as const

const Command = Schema.Union([
  Schema.Struct({ op: Schema.Literal("connect") }),
  Schema.Struct({ op: Schema.Literal("ghost") }),
  Schema.Struct({ op: Schema.Literal("disconnect") }),
  Schema.Struct({
    op: Schema.Literal("push"),
    channel: Schema.Literals([0, 1]),
    topic: Schema.Literals(["", "a", "b"]),
    ttl: Schema.Literals([0, 5, 60, 3600, 2_592_000]),
    direct: Schema.Boolean
  }),
  Schema.Struct({ op: Schema.Literal("ack"), count: Schema.Literals([1, 2, 3]) }),
  Schema.Struct({ op: Schema.Literal("ackAll") }),
  Schema.Struct({ op: Schema.Literal("poke") }),
  Schema.Struct({ op: Schema.Literal("wait"), seconds: Schema.Literals([1, 4, 30, 61, 3601]) }),
  Schema.Struct({ op: Schema.Literal("nextMonth") })
])
type Command = typeof Command.Type

const Commands = Arbitrary.array(Arbitrary.schema(Command), { maxLength: 40 })

interface Pushed {
  readonly version: string
  readonly key: string
  readonly topicKey: string | undefined
  readonly expiresAt: number
  readonly ttl: number
  /** Handed to a live session (true) or stored (false). */
  readonly direct: boolean
}

const runScenario = (commands: ReadonlyArray<Command>) =>
  Effect.gen(function*() {
    yield* TestClock.setTime(START)
    const harness = yield* makeHarness({ msgLimit: 10_000, pageSize: 3 })
    const storage = yield* Storage
    const pushed: Array<Pushed> = []
    const acked = new Set<string>()
    const clients: Array<Client> = []
    let pushes = 0
    let monthJumped = false

    /** Every frame a client is sent, checked as it goes out. */
    const checked = new WeakSet<Record<string, unknown>>()
    const checkNewFrames = Effect.gen(function*() {
      const nowSec = Math.floor((yield* Clock.currentTimeMillis) / 1000)
      for (const client of clients) {
        for (const frame of client.of("notification")) {
          if (checked.has(frame)) continue
          checked.add(frame)
          const version = frame["version"] as string
          assert.isFalse(acked.has(version), "an acked message was delivered again")
          const p = pushed.find((m) => m.version === version)
          assert.isDefined(p, "a delivered message was never pushed")
          if (p!.ttl > 0) assert.isBelow(nowSec, p!.expiresAt, "an expired message was delivered")
        }
      }
    })
    const pumpAll = Effect.gen(function*() {
      for (const client of clients) yield* pump(client)
      yield* checkNewFrames
      const live = clients.filter((c) => !c.machine.isClosed && c.handle.uaid !== undefined)
      const uaids = live.map((c) => c.handle.uaid)
      assert.strictEqual(new Set(uaids).size, uaids.length, "two live sessions for one uaid")
    })
    const current = () => clients.findLast((c) => !c.machine.isClosed)
    const unackedOf = (client: Client) =>
      client.of("notification").map((f) => f["version"] as string).filter((v) => !acked.has(v))
    const ack = (client: Client, versions: ReadonlyArray<string>) =>
      Effect.gen(function*() {
        if (versions.length === 0) return
        for (const v of versions) acked.add(v)
        yield* client.frame({ messageType: "ack", updates: versions.map((version) => ({ channelID: CHANNELS[0], version })) })
      })

    // The subscriber.
    const first = yield* harness.connect()
    clients.push(first)
    yield* first.frame({ messageType: "hello", use_webpush: true })
    const uaid = first.of("hello")[0]!["uaid"] as string
    for (const channelID of CHANNELS) yield* first.frame({ messageType: "register", channelID })

    for (const command of commands) {
      const live = current()
      switch (command.op) {
        case "connect":
        case "ghost": {
          // "connect" reconnects; "ghost" opens a second session beside a live one.
          if (command.op === "connect" && live !== undefined) break
          const client = yield* harness.connect()
          clients.push(client)
          yield* client.frame({ messageType: "hello", uaid, use_webpush: true })
          break
        }
        case "disconnect":
          if (live !== undefined) yield* live.feed({ _tag: "SocketClosed" })
          break
        case "push": {
          const channelId = CHANNELS[command.channel]
          const topic = command.topic === "" ? undefined : command.topic
          const user = yield* storage.getUser(uaid)
          if (user === undefined) break
          const { notification, direct } = yield* pushMessage(harness, uaid, channelId, {
            ttl: command.ttl,
            direct: command.direct,
            data: `p${pushes}`,
            ...(topic === undefined ? {} : { topic })
          })
          pushed.push({
            version: notification.version,
            key: `p${pushes}`,
            topicKey: topic === undefined ? undefined : `${channelId}:${topic}`,
            expiresAt: notification.timestamp + notification.ttl,
            ttl: notification.ttl,
            direct
          })
          pushes++
          yield* TestClock.adjust(1) // distinct sort keys
          break
        }
        case "ack":
          if (live !== undefined) yield* ack(live, unackedOf(live).slice(0, command.count))
          break
        case "ackAll":
          if (live !== undefined) yield* ack(live, unackedOf(live))
          break
        case "poke":
          live?.handle.mailbox.offer({ _tag: "CheckStorage" })
          break
        case "wait":
          yield* TestClock.adjust(command.seconds * 1000)
          break
        case "nextMonth": {
          if (monthJumped) break
          monthJumped = true
          const now = new Date(yield* Clock.currentTimeMillis)
          yield* TestClock.setTime(Date.UTC(now.getUTCFullYear(), now.getUTCMonth() + 1, 1, 0, 0, 1))
          yield* storage.createTables(yield* storage.activeMessageTables)
          break
        }
      }
      yield* pumpAll
    }

    // Final drain: a fresh session acks whatever comes until nothing more does.
    const ackedDuringRun = new Set(acked)
    const live = current()
    if (live !== undefined) yield* live.feed({ _tag: "SocketClosed" })
    const last = yield* harness.connect()
    clients.push(last)
    yield* last.frame({ messageType: "hello", uaid, use_webpush: true })
    assert.strictEqual(last.of("hello")[0]!["uaid"], uaid, "the uaid survived")
    for (let round = 0; round < 1000; round++) {
      yield* pumpAll
      const pending = unackedOf(last)
      if (pending.length === 0) break
      yield* ack(last, pending)
    }
    const finalSec = Math.floor((yield* Clock.currentTimeMillis) / 1000)
    const finalDrain = new Set(last.of("notification").map((f) => f["version"] as string))

    // A topic message is replaced by a later one of its topic that reached storage: stored at once,
    // or delivered directly and saved when its session ended unacked. TTL 0 never reaches storage.
    const replaces = (q: Pushed) => q.ttl > 0 && (!q.direct || !ackedDuringRun.has(q.version))
    for (const [i, p] of pushed.entries()) {
      const superseded = p.topicKey !== undefined && pushed.slice(i + 1).some((q) => q.topicKey === p.topicKey && replaces(q))
      if (superseded) {
        assert.isFalse(finalDrain.has(p.version), `superseded topic message ${p.key} came back`)
        continue
      }
      const mustArrive = p.ttl > 0 && !acked.has(p.version) && finalSec < p.expiresAt
      if (mustArrive && !finalDrain.has(p.version)) {
        // Delivered before and acked in this drain counts too; otherwise it was lost.
        assert.fail(`message ${p.key} was lost`)
      }
    }
  })

describe("session properties", () => {
  it.effect.prop(
    "no loss, no redelivery of acked, topics replace, expired never delivered, one session per uaid",
    [Commands],
    ([commands]) => runScenario(commands).pipe(Effect.provide(TestParts)),
    { timeout: 120_000, arbitrary: { runs: 300 } }
  )

  it.effect.prop(
    "every text frame decodes to a message or a frame error, and invalid ones close with a table code",
    [Schema.String],
    ([text]) =>
      Effect.gen(function*() {
        const decoded = decodeClientFrame(text)
        if (!isFrameError(decoded)) return
        yield* TestClock.setTime(START)
        const harness = yield* makeHarness()
        const client = yield* harness.connect()
        yield* client.frame({ messageType: "hello" })
        yield* client.feed({ _tag: "BadFrame", detail: decoded.detail })
        assert.deepStrictEqual(client.sent.closed, { code: 1011, reason: "Json" })
      }).pipe(Effect.provide(TestParts)),
    { arbitrary: { runs: 300 } }
  )

  it.effect.prop(
    "JSON-shaped garbage never throws and always gets a defined outcome",
    [Arbitrary.schema(Schema.Record(Schema.String, Schema.Union([Schema.String, Schema.Number, Schema.Null, Schema.Array(Schema.String)])))],
    ([object]) =>
      Effect.gen(function*() {
        for (const messageType of ["hello", "register", "unregister", "ack", "nack", "broadcast_subscribe", "ping", "bogus", undefined]) {
          const text = JSON.stringify(messageType === undefined ? object : { ...object, messageType })
          const decoded = decodeClientFrame(text)
          if (isFrameError(decoded)) {
            assert.oneOf(decoded.reason, ["not-json", "not-object", "unknown-type", "bad-fields"])
          } else {
            assert.oneOf(decoded.messageType, ["hello", "register", "unregister", "ack", "nack", "broadcast_subscribe", "ping"])
          }
        }
      }),
    { arbitrary: { runs: 300 } }
  )
})
