/**
 * `step` alone, driven by generated input sequences with time passing between inputs and between a
 * command and its result. A small world answers every command the way storage could (found or not,
 * written or not, pages of fresh messages, failures), and the driver does what the session fiber
 * does (results and replays first, the mailbox drained at a close). Checked on every transition,
 * against an oracle kept beside it:
 * - the table answers every reachable (phase, input): `step` never throws;
 * - the hello reply is the first frame, and comes once;
 * - a message is delivered at most once while unacked and never after its ack; an ack event names
 *   a message delivered and not yet acked;
 * - nothing is sent after the close frame, and nothing happens once closed;
 * - events carry the step's time; the budget never goes negative or past its burst;
 * - a live phase always has a deadline (its keepalive), so no connection is forgotten by the ticker;
 * - an identified connection that closes ends once (`session.ended.1`), after its close.
 */
import { assert, describe, it } from "@effect/vitest"
import { Arbitrary, Effect, Schema } from "effect"
import { type Command, type CommandResult, type Input, type Transition } from "../../src/protocol/inputs.ts"
import { isLive, type Phase, type ProtocolOptions } from "../../src/protocol/phases.ts"
import { makeProtocol } from "../../src/protocol/table.ts"
import { monthTableName } from "../../src/storage/tables.ts"
import { type Notification, type Urgency, URGENCIES, urgentEnough } from "../../src/domain/notification.ts"
import { sessionOptions } from "./harness.ts"

const START = Date.UTC(2026, 10, 27, 12, 0, 0)
const UAID = "a90359e3e4eb64f6e33d1267813bf91c"
const CHANNELS = ["eac8e1de-cddf-42d6-9919-a7b0e0f41e59", "7dbb5bdb-0845-4535-98c9-0f34a94e2e7b"] as const
const OPTIONS: ProtocolOptions = { ...sessionOptions, commandsPerSecond: 5, commandBurst: 3, msgLimit: 6, pageSize: 3 }

/** What happens to a connection after its hello (what ends it is chosen apart: most runs must live a while). */
const Op = Schema.Union([
  Schema.Struct({ op: Schema.Literal("register"), channel: Schema.Literals([0, 1]) }),
  Schema.Struct({ op: Schema.Literal("unregister"), channel: Schema.Literals([0, 1]) }),
  Schema.Struct({ op: Schema.Literal("ack"), count: Schema.Literals([1, 2, 99]) }),
  Schema.Struct({ op: Schema.Literal("ackUnknown") }),
  Schema.Struct({ op: Schema.Literal("nack") }),
  Schema.Struct({ op: Schema.Literal("ping") }),
  Schema.Struct({ op: Schema.Literal("subscribe") }),
  Schema.Struct({ op: Schema.Literal("urgency"), min: Schema.Literals(["very-low", "low", "normal", "high", "bogus"]) }),
  Schema.Struct({
    op: Schema.Literal("delivery"),
    ttl: Schema.Literals([0, 5, 60]),
    topic: Schema.Literals(["", "a"]),
    urgency: Schema.Literals(["", "very-low", "high"])
  }),
  Schema.Struct({ op: Schema.Literal("poke") }),
  Schema.Struct({ op: Schema.Literal("tick") }),
  Schema.Struct({ op: Schema.Literal("pong") }),
  Schema.Struct({ op: Schema.Literal("wait"), ms: Schema.Literals([1, 250, 4_000, 61_000, 400_000]) })
])
type Op = typeof Op.Type

/** How the world answers the next command of a kind: the first outcome that applies, in turn. */
const Outcome = Schema.Literals(["ok", "ok", "ok", "no", "fail", "stale", "newer", "full"])
type Outcome = typeof Outcome.Type

const Ops = Arbitrary.array(Arbitrary.schema(Op), { maxLength: 60 })
const Outcomes = Arbitrary.array(Arbitrary.schema(Outcome), { minLength: 1, maxLength: 12 })
const Gaps = Arbitrary.array(Arbitrary.schema(Schema.Literals([0, 1, 7, 120, 1_100])), { minLength: 1, maxLength: 6 })
/** Messages stored for the user when the run starts. */
const Stored = Arbitrary.schema(Schema.Literals([0, 1, 4, 9, 20]))
/** The hello (resuming the uaid or not), and how the connection ends. */
const Life = Arbitrary.schema(Schema.Struct({
  resume: Schema.Boolean,
  end: Schema.Literals(["close", "kick", "bad", "hello", "ping-flood"])
}))

const cycle = <A>(values: ReadonlyArray<A>) => {
  let i = 0
  return () => values[i++ % values.length] as A
}

const { step, initial, deadline } = makeProtocol(OPTIONS)

const run = (
  life: { readonly resume: boolean; readonly end: "close" | "kick" | "bad" | "hello" | "ping-flood" },
  ops: ReadonlyArray<Op>,
  outcomes: ReadonlyArray<Outcome>,
  gaps: ReadonlyArray<number>,
  storedAtStart: number
) => {
  const outcome = cycle(outcomes)
  const gap = cycle(gaps)
  let now = START
  let phase: Phase = initial(now)
  let closed = false
  let helloSent = 0
  let framesSent = 0
  let versions = 0
  let everIdentified = false
  let ended = 0
  /** Delivered and tracked, not acked yet. */
  const delivered = new Set<string>()
  /** The urgency of each stored message the world handed out. */
  const urgencyOf = new Map<string, Urgency | undefined>()
  const acked = new Set<string>()
  const lastMonth = monthTableName("message", Date.UTC(2026, 9, 15))
  /** Stored rows not read yet: pages take them (a poke stores one more), so a drain comes to an end. */
  let remaining = storedAtStart

  const check = (before: Phase, input: Input, t: Transition) => {
    for (const e of t.events) assert.strictEqual(e.time, now, "events carry the step's time")
    if (before._tag === "Closed") {
      assert.deepStrictEqual([t.phase._tag, t.frames.length, t.events.length, t.command], ["Closed", 0, 0, undefined], "nothing happens once closed")
    }
    if (closed) assert.strictEqual(t.frames.length, 0, `a frame after the close frame (${input._tag})`)
    for (const text of t.frames) {
      const frame = JSON.parse(text) as Record<string, unknown>
      if (frame["messageType"] === "hello") {
        helloSent++
        assert.strictEqual(framesSent, 0, "the hello reply is the first frame")
      }
      framesSent++
    }
    assert.isAtMost(helloSent, 1, "one hello reply")
    const tracked = isLive(t.phase) || t.phase._tag === "Closing" ? t.phase.session.acks.unacked : undefined
    for (const e of t.events) {
      if (e.type === "notification.delivered.1") {
        assert.isFalse(delivered.has(e.data.version), "delivered again while unacked")
        if (e.data.source === "stored" && isLive(t.phase)) {
          assert.isTrue(urgentEnough({ urgency: urgencyOf.get(e.data.version) }, t.phase.session.minUrgency), "a stored message less urgent than the client wants")
        }
        assert.isFalse(acked.has(e.data.version), "delivered after its ack")
        // TTL 0 direct messages are fire-and-forget: delivered, never tracked, never acked.
        if (tracked?.has(e.data.version) === true) delivered.add(e.data.version)
      }
      if (e.type === "notification.acked.1") {
        assert.isTrue(delivered.has(e.data.version), "an ack event for a message not delivered, or acked already")
        delivered.delete(e.data.version)
        acked.add(e.data.version)
      }
      if (e.type === "client.hello.1") everIdentified = true
      if (e.type === "session.ended.1") ended++
    }
    if (t.close !== undefined) closed = true
    if (isLive(t.phase)) {
      const { tokens } = t.phase.session.budget
      assert.isAtLeast(tokens, 0, "budget below zero")
      assert.isAtMost(tokens, OPTIONS.commandBurst, "budget past its burst")
      assert.isTrue(Number.isFinite(deadline(t.phase)), "a live phase has a deadline")
    }
  }

  /** What the world answers to a command. */
  const answer = (command: Command): CommandResult => {
    const o = outcome()
    const failed: CommandResult = { _tag: "CommandFailed", command }
    switch (command._tag) {
      case "MintUaid":
        return { _tag: "UaidMinted", uaid: UAID }
      case "ReadUser":
        if (o === "fail") return failed
        if (o === "no") return { _tag: "UserRead", user: undefined }
        return {
          _tag: "UserRead",
          user: {
            uaid: command.uaid,
            routerType: "webpush",
            routerData: {},
            connectedAt: o === "newer" ? now + 10 : now - 5_000,
            currentMonth: o === "stale" ? "message_2020_01" : o === "full" ? lastMonth : monthTableName("message", now),
            recordVersion: 1
          }
        }
      case "WriteUser":
        return o === "fail" ? failed : { _tag: "UserWritten", command, written: o !== "no" && o !== "newer" }
      case "DropUser":
        return o === "fail" ? failed : { _tag: "UserDropped", dropped: o !== "no" }
      case "MakeEndpoint":
        return o === "fail" ? failed : { _tag: "EndpointMade", command, endpoint: "http://e/wpush/v1/t" }
      case "AddChannel":
        return o === "fail" ? failed : { _tag: "ChannelAdded", registering: command.registering, added: o !== "full" }
      case "RemoveChannel":
        return o === "fail" ? failed : { _tag: "ChannelRemoved", command }
      case "WriteUrgency":
        return o === "fail" ? failed : { _tag: "UrgencyWritten", command }
      case "ReadPage": {
        if (o === "fail") return failed
        // A page takes what is left; one from the first row starts with a topic row when the world
        // says "full" (topic rows are rare), and has a last timestamp row only past it.
        const n = Math.min(command.limit, remaining)
        const topics = command.rows === "first" && o === "full" ? Math.min(1, n) : 0
        remaining -= n
        const messages = Array.from({ length: n }, (_, i): Notification => ({
          channelId: CHANNELS[i % 2] as string,
          version: `s${versions++}`,
          urgency: URGENCIES[(versions + i) % URGENCIES.length] as Urgency,
          ttl: 60,
          timestamp: Math.floor(now / 1000),
          sortkeyTimestamp: now - 1_000 + i,
          ...(i < topics ? { topic: "t" } : {})
        }))
        for (const m of messages) urgencyOf.set(m.version, m.urgency)
        return { _tag: "PageRead", command, messages, lastSortKey: n > topics ? now - 1_000 + n - 1 : undefined, more: n === command.limit }
      }
      case "TombstoneAcked":
        return o === "fail" ? failed : { _tag: "AckedTombstoned" }
      case "TakeMessage":
        return o === "fail" ? failed : { _tag: "MessageTaken", taken: o !== "no" }
      case "ReadChannels":
        return o === "fail" ? failed : { _tag: "ChannelsRead", channels: new Set(CHANNELS) }
      case "AddChannels":
        return o === "fail" ? failed : { _tag: "ChannelsAdded" }
      case "PointRecord":
        return o === "fail" ? failed : { _tag: "RecordPointed" }
      case "SaveMessages":
        return o === "fail" ? failed : { _tag: "MessagesSaved", saved: command.messages }
      case "ClearNodeId":
        return o === "fail" ? failed : { _tag: "NodeCleared" }
    }
  }

  /** One input and all it causes, as the session fiber does it. */
  const feed = (first: Input) => {
    const ahead: Array<Input> = [first]
    for (let input = ahead.shift(); input !== undefined; input = ahead.shift()) {
      const before = phase
      const t = step(before, input, now)
      check(before, input, t)
      phase = t.phase
      for (const signal of t.signals) {
        if (signal._tag === "Replay") for (const message of signal.messages) ahead.push({ _tag: "Frame", message, admitted: signal.admitted })
      }
      if (before._tag !== "Closing" && phase._tag === "Closing") ahead.push({ _tag: "MailboxDrained" })
      if (t.command !== undefined) {
        now += gap()
        ahead.unshift(answer(t.command))
      }
    }
  }

  const frame = (message: Record<string, unknown>) => feed({ _tag: "Frame", message: message as never })
  frame(life.resume ? { messageType: "hello", uaid: UAID, use_webpush: true } : { messageType: "hello", use_webpush: true })
  for (const op of ops) {
    now += gap()
    switch (op.op) {
      case "register":
        frame({ messageType: "register", channelID: CHANNELS[op.channel] })
        break
      case "unregister":
        frame({ messageType: "unregister", channelID: CHANNELS[op.channel] })
        break
      case "ack": {
        const versions = [...delivered.keys()].slice(0, op.count)
        frame({ messageType: "ack", updates: versions.map((version) => ({ channelID: CHANNELS[0], version, code: 100 })) })
        break
      }
      case "ackUnknown":
        frame({ messageType: "ack", updates: [{ channelID: CHANNELS[0], version: "never-sent" }] })
        break
      case "nack":
        frame({ messageType: "nack", version: "v", code: 301 })
        break
      case "ping":
        frame({ messageType: "ping" })
        break
      case "subscribe":
        frame({ messageType: "broadcast_subscribe", broadcasts: { "remote-settings/monitor_changes": "v0" } })
        break
      case "urgency":
        frame({ messageType: "urgency", min: op.min })
        break
      case "delivery":
        feed({
          _tag: "Delivery",
          notification: {
            channelId: CHANNELS[0],
            version: `d${versions++}`,
            ttl: op.ttl,
            timestamp: Math.floor(now / 1000),
            sortkeyTimestamp: now,
            ...(op.topic === "" ? {} : { topic: op.topic }),
            ...(op.urgency === "" ? {} : { urgency: op.urgency })
          }
        })
        break
      case "poke":
        remaining++
        feed({ _tag: "CheckStorage" })
        break
      case "tick":
        feed({ _tag: "Tick" })
        break
      case "pong":
        feed({ _tag: "Pong" })
        break
      case "wait":
        now += op.ms
        feed({ _tag: "Tick" })
        break
    }
  }
  // The end, as generated; then the socket goes, and the close sequence runs to its end (saves retried at ticks).
  switch (life.end) {
    case "kick":
      feed({ _tag: "Kick", kind: "ghost" })
      break
    case "bad":
      feed({ _tag: "BadFrame", detail: "not JSON" })
      break
    case "hello":
      frame({ messageType: "hello", use_webpush: true })
      break
    case "ping-flood":
      frame({ messageType: "ping" })
      frame({ messageType: "ping" })
      break
    case "close":
      break
  }
  feed({ _tag: "SocketClosed" })
  for (let i = 0; i < 50 && phase._tag === "Closing"; i++) {
    now += OPTIONS.storageRetryMaxMs
    feed({ _tag: "Tick" })
  }
  assert.strictEqual(phase._tag, "Closed", "the connection ends")
  assert.strictEqual(ended, everIdentified ? 1 : 0, "an identified connection ends once")
}

describe("step properties", () => {
  it.effect.prop(
    "generated inputs, with time passing, against the oracle of the table's invariants",
    [Life, Ops, Outcomes, Gaps, Stored],
    ([life, ops, outcomes, gaps, stored]) => Effect.sync(() => run(life, ops, outcomes, gaps, stored)),
    { arbitrary: { runs: 1_000, size: 60 } }
  )
})
