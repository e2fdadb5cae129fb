/**
 * Property tests of the connection protocol over generated client/server interleavings: connects
 * and disconnects at any point, a second session of the same uaid, pushes (direct or stored, topics,
 * TTLs), partial acks, pokes, clock jumps, a month boundary, and garbage frames. Time passes as in
 * the world: every storage operation takes a generated time (so a command's result comes later than
 * the command), and a generated gap separates inputs. Pushes go through the endpoint's router. While
 * the run goes on:
 * - a push the node may take, to a uaid with a live identified session, is delivered directly —
 *   resumed sessions included;
 * - once a session ended and no other is live, the router record names no node.
 * After each run a final session drains everything left, and the invariants are checked on the
 * sessions' domain events (each session's events are those its feeds recorded):
 * - a message is delivered to at most one live session at a time;
 * - nothing is delivered after its ack, nor after it expired;
 * - every accepted message ends acked, expired, replaced by a newer one of its topic, or dropped
 *   (TTL 0 with nobody connected) — none is lost; a replaced topic message never comes back;
 * - per channel, messages come in push order (direct ones, and stored ones: by the endpoint, or
 *   saved unacked at a disconnect);
 * - a session's summary agrees with what crossed its socket: registers answered 200, and acks of
 *   messages it was sent;
 * - at most one live session per uaid;
 * - every invalid frame has a defined outcome (a close with a code of the table).
 */
import { assert, describe, it } from "@effect/vitest"
import { Arbitrary, Clock, Deferred, Effect, Fiber, Layer, Schema } from "effect"
import { TestClock } from "effect/testing"
import type { DomainEvent } from "../../src/domain/events.ts"
import { textFrame } from "../../src/protocol/inputs.ts"
import { type ClientMessage, decodeClientFrame, isFrameError } from "../../src/protocol/messages.ts"
import { closeFrame, type CloseKind } from "../../src/protocol/close.ts"
import { EndpointCrypto } from "../../src/crypto/endpoint.ts"
import { EventLog } from "../../src/observability/EventLog.ts"
import { layerMemory } from "../../src/storage/memory/layer.ts"
import { mapStorageOperations, Storage } from "../../src/storage/Storage.ts"
import { type Client, makeHarness, pump, pushMessage, TestParts, testParts } from "./harness.ts"

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

/** Every close the table defines, as `code reason`. */
const KNOWN_CLOSES = (["uaid-reset", "invalid-json", "binary-frame", "expected-hello", "already-hello", "already-connected", "ghost", "excessive-ping", "storage-error", "hello-timeout", "pong-timeout", "shutdown"] satisfies ReadonlyArray<CloseKind>)
  .map((kind) => `${closeFrame(kind).code} ${closeFrame(kind).reason}`)

const Commands = Arbitrary.array(Arbitrary.schema(Command), { maxLength: 40 })
/** Times (ms) that storage operations take and that pass between inputs, used in turn. */
const Latencies = Arbitrary.array(Arbitrary.schema(Schema.Literals([0, 1, 3, 17, 120, 1_100])), { minLength: 1, maxLength: 8 })

/** The generated times in turn, forever. */
const cycle = (times: ReadonlyArray<number>) => {
  let i = 0
  return () => times[i++ % times.length] as number
}

interface Pushed {
  readonly version: string
  readonly key: string
  readonly channelId: string
  readonly topicKey: string | undefined
  readonly expiresAt: number
  readonly ttl: number
  /** Handed to a live session (true) or stored (false). */
  readonly direct: boolean
  /** The receipt subscription it was pushed with. */
  readonly receipt: string | undefined
}

/** The events of a message that name its receipt (what the receipt recorder folds). */
const RECEIPTED: ReadonlySet<string> = new Set([
  "notification.delivered.1",
  "notification.stored.1",
  "notification.acked.1",
  "notification.nacked.1",
  "notification.expired.1"
])

/** Per session: its events (attributed by which client's feed recorded them) and its runner. */
interface Recorded {
  readonly client: Client
  readonly events: Array<DomainEvent>
}

const runScenario = (commands: ReadonlyArray<Command>, gap: () => number) =>
  Effect.gen(function*() {
    yield* TestClock.setTime(START)
    const harness = yield* makeHarness({ msgLimit: 10_000, pageSize: 3 })
    const storage = yield* Storage
    const pushed: Array<Pushed> = []
    const sessions: Array<Recorded> = []
    let pushes = 0
    let monthJumped = false

    /** Feed a client and attribute the events recorded meanwhile to its session. */
    const attributed = (recorded: Recorded, effect: Effect.Effect<void>) =>
      Effect.gen(function*() {
        const before = harness.events.length
        yield* effect
        recorded.events.push(...harness.events.slice(before))
      })
    const connect = Effect.gen(function*() {
      const recorded: Recorded = { client: yield* harness.connect(), events: [] }
      sessions.push(recorded)
      return recorded
    })
    const frame = (recorded: Recorded, message: ClientMessage) => attributed(recorded, recorded.client.frame(message))
    const feed = (recorded: Recorded, event: Parameters<Client["feed"]>[0]) => attributed(recorded, recorded.client.feed(event))
    const pumpAll = Effect.gen(function*() {
      for (const recorded of sessions) yield* attributed(recorded, pump(recorded.client))
      const live = sessions.filter((r) => !r.client.machine.isClosed && r.client.handle.uaid !== undefined)
      const uaids = live.map((r) => r.client.handle.uaid)
      assert.strictEqual(new Set(uaids).size, uaids.length, "two live sessions for one uaid")
    })
    const current = () => sessions.findLast((r) => !r.client.machine.isClosed)
    const ackedAll = () => new Set(sessions.flatMap((r) => r.events.flatMap((e) => e.type === "notification.acked.1" ? [e.data.version] : [])))
    const unackedOf = (recorded: Recorded) => {
      const acked = ackedAll()
      return recorded.events.flatMap((e) => e.type === "notification.delivered.1" && !acked.has(e.data.version) ? [e.data.version] : [])
    }
    const ack = (recorded: Recorded, versions: ReadonlyArray<string>) =>
      versions.length === 0
        ? Effect.void
        : frame(recorded, { messageType: "ack", updates: versions.map((version) => ({ channelID: CHANNELS[0], version })) })

    // The subscriber.
    const first = yield* connect
    yield* frame(first, { messageType: "hello", use_webpush: true })
    const uaid = first.client.of("hello")[0]!["uaid"] as string
    for (const channelID of CHANNELS) yield* frame(first, { messageType: "register", channelID })

    for (const command of commands) {
      const live = current()
      switch (command.op) {
        case "connect":
        case "ghost": {
          // "connect" reconnects; "ghost" opens a second session beside a live one.
          if (command.op === "connect" && live !== undefined) break
          const recorded = yield* connect
          yield* frame(recorded, { messageType: "hello", uaid, use_webpush: true })
          break
        }
        case "disconnect":
          if (live !== undefined) {
            yield* feed(live, { _tag: "SocketClosed" })
            if (current() === undefined) {
              assert.isUndefined((yield* storage.getUser(uaid))?.nodeId, "the router record still names a node after its session ended")
            }
          }
          break
        case "push": {
          const channelId = CHANNELS[command.channel]
          const topic = command.topic === "" ? undefined : command.topic
          const user = yield* storage.getUser(uaid)
          if (user === undefined) break
          // Every other push asks for a receipt: its events must name it wherever the message goes.
          const receipt = pushes % 2 === 0 ? `rs${pushes}` : undefined
          const { notification, direct } = yield* pushMessage(harness, uaid, channelId, {
            ttl: command.ttl,
            direct: command.direct,
            data: `p${pushes}`,
            ...(topic === undefined ? {} : { topic }),
            ...(receipt === undefined ? {} : { receipt })
          })
          // A live identified session of the uaid (fresh or resumed) gets what the node may take directly.
          const holder = current()
          if (command.direct && holder !== undefined && holder.client.handle.uaid === uaid && harness.registry.get(uaid) === holder.client.handle) {
            assert.isTrue(direct, "a push to a connected client was not delivered directly")
          }
          pushed.push({
            version: notification.version,
            key: `p${pushes}`,
            channelId,
            topicKey: topic === undefined ? undefined : `${channelId}:${topic}`,
            expiresAt: notification.timestamp + notification.ttl,
            ttl: notification.ttl,
            direct,
            receipt
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
          live?.client.handle.mailbox.offer({ _tag: "CheckStorage" })
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
      yield* TestClock.adjust(gap())
    }

    // Final drain: a fresh session acks whatever comes until nothing more does.
    const live = current()
    if (live !== undefined) yield* feed(live, { _tag: "SocketClosed" })
    const last = yield* connect
    yield* frame(last, { messageType: "hello", uaid, use_webpush: true })
    assert.strictEqual(last.client.of("hello")[0]!["uaid"], uaid, "the uaid survived")
    for (let round = 0; round < 1000; round++) {
      yield* pumpAll
      const pending = unackedOf(last)
      if (pending.length === 0) break
      yield* ack(last, pending)
    }
    yield* feed(last, { _tag: "SocketClosed" })

    // ── invariants, on the event streams ──────────────────────────────────────────────────────
    const byVersion = new Map(pushed.map((p, index) => [p.version, { ...p, index }]))
    const acked = new Set<string>()
    /**
     * Per live session, the versions delivered to it and not acked. A session is live from its hello
     * until it closes or a newer session of its uaid says hello (it is then superseded).
     */
    const holding = new Map<Recorded, Set<string>>()
    const superseded = new Set<Recorded>()
    // Replay the sessions' events in the order they were recorded (one shared log).
    const order = new Map(harness.events.map((e, i) => [e, i]))
    const timeline = sessions.flatMap((r) => r.events.map((e) => ({ r, e }))).sort((a, b) => order.get(a.e)! - order.get(b.e)!)
    for (const { r, e } of timeline) {
      // The receipt a message was pushed with travels with it: direct, stored, saved at a close, drained.
      if (RECEIPTED.has(e.type)) {
        const version = (e.data as { readonly version: string }).version
        assert.strictEqual((e.data as { readonly receipt?: string }).receipt, byVersion.get(version)?.receipt, `${e.type} of a message names its receipt`)
      }
      switch (e.type) {
        case "client.hello.1":
          for (const other of holding.keys()) {
            if (other === r) continue
            holding.delete(other)
            superseded.add(other)
          }
          holding.set(r, new Set())
          break
        case "notification.delivered.1": {
          assert.isFalse(superseded.has(r), "a superseded session delivered a message")
          const p = byVersion.get(e.data.version)
          assert.isDefined(p, "a delivered message was never pushed")
          assert.isFalse(acked.has(e.data.version), "a message was delivered after its ack")
          if (p!.ttl > 0) assert.isBelow(Math.floor(e.time / 1000), p!.expiresAt, "an expired message was delivered")
          for (const [other, versions] of holding) {
            if (other !== r) assert.isFalse(versions.has(e.data.version), "a message was delivered to two live sessions")
          }
          let mine = holding.get(r)
          if (mine === undefined) holding.set(r, mine = new Set())
          mine.add(e.data.version)
          break
        }
        case "notification.acked.1":
          acked.add(e.data.version)
          holding.get(r)?.delete(e.data.version)
          break
        case "session.closed.1":
        case "session.ended.1":
          holding.delete(r)
          break
      }
    }

    // Per channel and session, messages the endpoint stored come from storage in push order, and
    // direct deliveries arrive in push order.
    for (const r of sessions) {
      for (const source of ["stored", "direct"] as const) {
        for (const channelId of CHANNELS) {
          const indexes = r.events.flatMap((e) => {
            if (e.type !== "notification.delivered.1" || e.data.source !== source || e.data.channelId !== channelId) return []
            const p = byVersion.get(e.data.version)!
            // Timestamp messages keep their push-time sort key wherever they are stored (the key their
            // id names: saved at a disconnect too); topic rows sort by topic.
            return source === "stored" && p.topicKey !== undefined ? [] : [p.index]
          })
          assert.deepStrictEqual(indexes, [...indexes].sort((a, b) => a - b), `${source} messages out of order on a channel`)
        }
      }
    }

    // Every session's summary agrees with the wire: the registers answered 200, and the acks the client
    // sent for messages it had been sent (TTL 0 ones are fire-and-forget: not acked). The summary is
    // folded from the events: this checks the events against what crossed the socket.
    const fireAndForget = new Set(pushed.flatMap((p) => (p.ttl === 0 ? [p.version] : [])))
    for (const r of sessions) {
      const { counts } = r.client.machine.summary
      const received = new Set(r.client.of("notification").map((f) => f["version"] as string))
      const acked = new Set(r.client.acked.filter((v) => received.has(v) && !fireAndForget.has(v)))
      assert.strictEqual(counts.registers, r.client.of("register").filter((f) => f["status"] === 200).length, "registers")
      assert.strictEqual(counts.directAcked + counts.storedAcked, acked.size, "acks")
    }

    // Every accepted message ends acked, expired, replaced by a newer one of its topic, or (TTL 0)
    // dropped; none is left behind. A topic message is replaced by a later one of its topic that
    // reached storage or the client (handed to its session, acked or not, TTL 0 or not): only a TTL 0
    // one nobody was connected for replaces nothing.
    const finalSec = Math.floor((yield* Clock.currentTimeMillis) / 1000)
    const replaces = (q: Pushed) => q.direct || q.ttl > 0
    for (const [i, p] of pushed.entries()) {
      const superseded = p.topicKey !== undefined && pushed.slice(i + 1).some((q) => q.topicKey === p.topicKey && replaces(q))
      if (superseded) {
        assert.isFalse(last.events.some((e) => e.type === "notification.delivered.1" && e.data.version === p.version), `superseded topic message ${p.key} came back`)
        continue
      }
      const ended = acked.has(p.version) || p.ttl === 0 || finalSec >= p.expiresAt
      assert.isTrue(ended, `message ${p.key} was lost`)
    }
  })

describe("session properties", () => {
  it.effect.prop(
    "no loss, no redelivery of acked, topics replace, expired never delivered, one session per uaid, direct to resumed sessions",
    [Commands, Latencies, Latencies],
    ([commands, latencies, gaps]) => runScenario(commands, cycle(gaps)).pipe(Effect.provide(testParts(false, cycle(latencies)))),
    { timeout: 120_000, arbitrary: { runs: 300 } }
  )

  it.effect.prop(
    "any text frame, as the node hands it to a session, is answered or closed with a code of the table, never an internal error",
    [Schema.String],
    ([text]) =>
      Effect.gen(function*() {
        yield* TestClock.setTime(START)
        const harness = yield* makeHarness()
        for (const identified of [false, true]) {
          const client = yield* harness.connect()
          if (identified) yield* client.frame({ messageType: "hello" })
          const event = textFrame(text)
          yield* client.feed(event)
          yield* pump(client)
          const closed = client.sent.closed
          if (event._tag === "BadFrame") {
            assert.deepStrictEqual(closed, closeFrame("invalid-json"), "a frame that is not a message closes Json")
            continue
          }
          if (closed === undefined) continue
          assert.notStrictEqual(closed.reason, closeFrame("internal-error").reason, "a frame broke the session")
          assert.include(KNOWN_CLOSES, `${closed.code} ${closed.reason}`)
        }
      }).pipe(Effect.provide(TestParts)),
    { arbitrary: { runs: 300 } }
  )

  it.effect.prop(
    "JSON-shaped garbage of every message type: decoded as the type it names or refused, and an identified session answers or closes with a code of the table, never fails",
    [Arbitrary.schema(Schema.Record(Schema.String, Schema.Union([Schema.String, Schema.Number, Schema.Null, Schema.Array(Schema.String)])))],
    ([object]) =>
      Effect.gen(function*() {
        yield* TestClock.setTime(START)
        const harness = yield* makeHarness()
        for (const messageType of ["hello", "register", "unregister", "ack", "nack", "broadcast_subscribe", "ping", "bogus", undefined]) {
          const text = JSON.stringify(messageType === undefined ? object : { ...object, messageType })
          const decoded = decodeClientFrame(text)
          if (!isFrameError(decoded) && messageType !== undefined && messageType !== "bogus") {
            assert.strictEqual(decoded.messageType, messageType, "decoded as another type than it names")
          }
          const client = yield* harness.connect()
          yield* client.frame({ messageType: "hello" })
          yield* client.feed(isFrameError(decoded) ? { _tag: "BadFrame", detail: decoded.detail } : { _tag: "Frame", message: decoded })
          yield* pump(client)
          if (client.sent.closed !== undefined) {
            assert.notStrictEqual(client.sent.closed.reason, closeFrame("internal-error").reason, "a frame broke the session")
            assert.include(KNOWN_CLOSES, `${client.sent.closed.code} ${client.sent.closed.reason}`)
          }
        }
      }).pipe(Effect.provide(TestParts)),
    { arbitrary: { runs: 100 } }
  )
})

describe("the close sequence, interrupted (the node stops)", () => {
  /** Storage whose `saveMessages` waits until `gate` is opened. */
  const gate = { open: undefined as Deferred.Deferred<void> | undefined, reached: undefined as Deferred.Deferred<void> | undefined }
  const GatedParts = Layer.mergeAll(
    Layer.effect(
      Storage,
      Effect.map(Storage, (inner) =>
        mapStorageOperations(inner, (name) => (operation) =>
          name !== "saveMessages" || gate.open === undefined ? operation : Effect.gen(function*() {
            yield* Deferred.succeed(gate.reached!, undefined)
            yield* Deferred.await(gate.open!)
            return yield* operation
          })))
    ).pipe(Layer.provide(layerMemory({ routerTable: "router", messageTablePrefix: "message", noTableRotation: false }))),
    EndpointCrypto.layerTest,
    EventLog.layerMemory
  )

  it.effect("a save in flight when the session's fiber is interrupted completes, and `finish` goes on from its result", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(START)
      const harness = yield* makeHarness()
      const client = yield* harness.connect()
      yield* client.frame({ messageType: "hello", use_webpush: true })
      yield* client.frame({ messageType: "register", channelID: CHANNELS[0] })
      const uaid = client.of("hello")[0]!["uaid"] as string
      const { notification, direct } = yield* pushMessage(harness, uaid, CHANNELS[0])
      assert.isTrue(direct)
      yield* pump(client)
      gate.open = yield* Deferred.make<void>()
      gate.reached = yield* Deferred.make<void>()
      // The client leaves; the node stops while the save of its unacked message is in flight.
      const closing = yield* Effect.forkChild(client.feed({ _tag: "SocketClosed" }), { startImmediately: true })
      yield* Deferred.await(gate.reached)
      const interrupted = yield* Effect.forkChild(Fiber.interrupt(closing), { startImmediately: true })
      yield* Deferred.succeed(gate.open, undefined)
      yield* Fiber.join(interrupted)
      gate.open = undefined
      // What the node does with a session whose fiber ended before it closed (a few attempts, a second apart).
      const finishing = yield* Effect.forkChild(client.machine.finish(), { startImmediately: true })
      yield* TestClock.adjust(10_000)
      yield* Fiber.join(finishing)
      assert.isTrue(client.machine.isClosed)
      assert.deepInclude(harness.events.find((e) => e.type === "notification.stored.1")?.data ?? {}, { version: notification.version, reason: "disconnect" })
      const again = yield* harness.connect()
      yield* again.frame({ messageType: "hello", uaid, use_webpush: true })
      assert.deepStrictEqual(again.of("notification").map((f) => f["version"]), [notification.version])
    }).pipe(Effect.provide(GatedParts)))
})
