/**
 * `step` alone, one row per transition of the table: a phase, an input, and what the transition
 * must decide (next phase, frames, events, signals, command, close). No sockets, storage or clock.
 */
import { assert, describe, it } from "@effect/vitest"
import type { DomainEvent } from "../../src/domain/events.ts"
import { type Notification, sortkeyMs, type Urgency } from "../../src/domain/notification.ts"
import type { UserRecord } from "../../src/domain/user.ts"
import { type Command, type Input, inputKind, type Transition } from "../../src/protocol/inputs.ts"
import type { ClientMessage } from "../../src/protocol/messages.ts"
import {
  type ClosingStage,
  type Drain,
  HELD_COMMANDS_MAX,
  heldList,
  heldOf,
  type Phase,
  type PhaseOf,
  type ProtocolOptions,
  type Retry,
  type Session,
  type StoredUnacked,
  type Topics,
  type Unacked
} from "../../src/protocol/phases.ts"
import { Ledger } from "../../src/protocol/ledger.ts"
import { COLLECTING, unackedOf } from "../../src/protocol/out.ts"
import { newDrain } from "../../src/protocol/drain.ts"
import { makeProtocol, TRANSITIONS } from "../../src/protocol/table.ts"
import { monthTableName } from "../../src/storage/tables.ts"
import { sessionOptions } from "./harness.ts"

const NOW = Date.UTC(2026, 10, 21, 12, 0, 0)
const UAID = "a90359e3e4eb64f6e33d1267813bf91c"
const CHID = "eac8e1de-cddf-42d6-9919-a7b0e0f41e59"
const THIS_MONTH = monthTableName("message", NOW)
const LAST_MONTH = monthTableName("message", Date.UTC(2026, 9, 15))
const NODE = sessionOptions.routerUrl
const VAPID_KEY = "BKlyY43YrGTW22IHoLvkIZyrcD3nTsaQGSXe6e7iapBYFrFoaXq0MBacyF0SOIydSR8uvXoH_0WGcyMY0pzLViA="
const OPTIONS: ProtocolOptions = { ...sessionOptions, commandsPerSecond: 10, commandBurst: 3 }
const protocol = makeProtocol(OPTIONS)
const { deadline } = protocol
/** The (phase, input kind) cells the rows below step through: every cell of the table must be one. */
const covered = new Set<string>()
const step: typeof protocol.step = (phase, input, now, broadcasts) => {
  covered.add(`${phase._tag} ${inputKind(input)}`)
  return protocol.step(phase, input, now, broadcasts)
}

const user = (overrides: Partial<UserRecord> = {}): UserRecord => ({
  uaid: UAID,
  routerType: "webpush",
  routerData: {},
  connectedAt: NOW - 60_000,
  currentMonth: THIS_MONTH,
  recordVersion: 1,
  ...overrides
})

/** A session's fields, flat (as the rows name them), and the drain of the phase that has one. */
interface Flat {
  readonly uaid: string
  readonly connectedAt: number
  readonly table: string
  readonly recorded: boolean
  /** Given as a Map; read back as the session keeps it. */
  readonly unacked: ReadonlyMap<string, Unacked> | Ledger<Unacked>
  readonly ackedRows: ReadonlyArray<StoredUnacked>
  readonly newestTopic: ReadonlyMap<string, Notification> | Topics
  readonly lastActivity: number
  readonly pingSentAt: number | undefined
  readonly lastClientPing: number | undefined
  readonly tokens: number
  readonly tokensAt: number
  readonly held: ReadonlyArray<ClientMessage>
  readonly readingPaused: boolean
  readonly broadcasts: ReadonlyArray<string>
  readonly retry: Retry | undefined
  readonly drain: Drain | undefined
  readonly minUrgency: Urgency | undefined
}

/** The newest message sent per topic, by `chid:topic`, as a session remembers them. */
const topicsOf = (newest: ReadonlyMap<string, Notification>): Topics => ({
  young: Ledger.of([...newest].map(([key, n]) => [key, { key, version: n.version, ms: sortkeyMs(n) }])),
  old: Ledger.empty()
})

const session = (o: Partial<Flat> = {}): Session => ({
  uaid: o.uaid ?? UAID,
  connectedAt: o.connectedAt ?? NOW - 1_000,
  table: o.table ?? THIS_MONTH,
  recorded: o.recorded ?? true,
  acks: {
    unacked: o.unacked instanceof Ledger ? o.unacked : unackedOf(o.unacked ?? []),
    ackedRows: o.ackedRows ?? [],
    newestTopic: o.newestTopic === undefined || o.newestTopic instanceof Map ? topicsOf(o.newestTopic ?? new Map()) : o.newestTopic as Topics
  },
  keepalive: { lastActivity: o.lastActivity ?? NOW - 1_000, pingSentAt: o.pingSentAt, lastClientPing: o.lastClientPing },
  budget: { tokens: o.tokens ?? 3, tokensAt: o.tokensAt ?? NOW - 1_000, held: heldOf(o.held ?? []), readingPaused: o.readingPaused ?? false },
  broadcasts: o.broadcasts ?? [],
  retry: o.retry,
  minUrgency: o.minUrgency
})

const awaiting: Phase = { _tag: "AwaitingHello", openedAt: NOW - 100 }
const resuming = (broadcasts?: Record<string, string>): Phase => ({ _tag: "Resuming", openedAt: NOW - 100, claimed: UAID, broadcasts })
const rechecking: Phase = { _tag: "Rechecking", openedAt: NOW - 100, claimed: UAID, broadcasts: undefined }
const minting: Phase = { _tag: "Minting", openedAt: NOW - 100, claimed: undefined, broadcasts: undefined }
/** Identified, or (given a drain) Draining. */
const identified = (overrides: Partial<Flat> = {}): Phase =>
  overrides.drain === undefined ? { _tag: "Identified", session: session(overrides) } : { _tag: "Draining", session: session(overrides), drain: overrides.drain }
const draining = (overrides: Partial<Flat> = {}): Phase =>
  ({ _tag: "Draining", session: session(overrides), drain: overrides.drain ?? { tables: [THIS_MONTH], rows: "first", after: undefined, again: false, poked: false, backlog: 0, backlogByChannel: new Map() } })
const migrating = (overrides: Partial<Flat> = {}): PhaseOf<"Migrating"> => ({
  _tag: "Migrating",
  session: session({ table: LAST_MONTH, ...overrides }),
  drain: overrides.drain ?? { tables: [LAST_MONTH], rows: "first", after: undefined, again: false, poked: false, backlog: 0, backlogByChannel: new Map() },
  deferred: []
})
const moving = (deferred: ReadonlyArray<ClientMessage> = []): Phase => ({ _tag: "Moving", session: session({ table: LAST_MONTH }), to: THIS_MONTH, deferred })
const closing = (overrides: Partial<Flat> = {}, since = NOW - 10, stage: ClosingStage = { _tag: "Collecting" }, nodeStops = false): Phase => ({
  _tag: "Closing",
  session: session(overrides),
  reason: nodeStops ? "Shutdown" : "client",
  nodeStops,
  since,
  retry: undefined,
  stage,
  sweep: undefined
})

const direct = (n: Notification): Unacked => ({ _tag: "Direct", notification: n })
const stored = (n: Notification, table = THIS_MONTH): StoredUnacked => ({ _tag: "Stored", notification: n, table })

const message = (overrides: Partial<Notification> = {}): Notification => ({
  channelId: CHID,
  version: "v1",
  ttl: 60,
  timestamp: Math.floor(NOW / 1000) - 1,
  sortkeyTimestamp: NOW - 1_000,
  data: "ZGF0YQ",
  headers: { encoding: "aes128gcm" },
  ...overrides
})

const frame = (m: Record<string, unknown>): Input => ({ _tag: "Frame", message: m as never })

/** What a row expects; unnamed parts are not checked, except `close` and `command` (absent = none). */
interface Expect {
  readonly phase: Phase["_tag"]
  readonly frames?: Array<Record<string, unknown>>
  readonly events?: ReadonlyArray<DomainEvent["type"]>
  readonly signals?: ReadonlyArray<string>
  readonly command?: Partial<Command> & { readonly _tag: Command["_tag"] }
  readonly close?: string
  readonly check?: (t: Transition) => void
}

const row = (name: string, phase: Phase, input: Input, expected: Expect, now = NOW) =>
  it(name, () => {
    const t = step(phase, input, now)
    assert.strictEqual(t.phase._tag, expected.phase, "phase")
    if (expected.frames !== undefined) assert.deepStrictEqual(t.frames.map((f) => JSON.parse(f)), expected.frames, "frames")
    if (expected.events !== undefined) assert.deepStrictEqual(t.events.map((e) => e.type), expected.events, "events")
    if (expected.signals !== undefined) assert.deepStrictEqual(t.signals.map((e) => e._tag), expected.signals, "signals")
    assert.strictEqual(t.close, expected.close, "close")
    if (expected.command === undefined) assert.isUndefined(t.command, "command")
    else assert.deepInclude(t.command as object, expected.command, "command")
    for (const e of t.events) assert.strictEqual(e.time, now, "events carry the step's time")
    expected.check?.(t)
  })

/** The session of the phase a transition led to, flat, with the phase's drain (if it has one). */
const sessionOf = (t: Transition): Flat => {
  const phase = t.phase
  if (phase._tag === "AwaitingHello" || phase._tag === "Resuming" || phase._tag === "Rechecking" || phase._tag === "Minting" || phase._tag === "Closed") {
    throw new Error(`no session in ${phase._tag}`)
  }
  const s = phase.session
  return { ...s, ...s.acks, ...s.keepalive, ...s.budget, held: heldList(s.budget.held), drain: "drain" in phase ? phase.drain : undefined }
}

describe("step: AwaitingHello", () => {
  row("hello without a uaid mints one", awaiting, frame({ messageType: "hello" }), { phase: "Minting", command: { _tag: "MintUaid" } })
  row("hello with a malformed uaid mints one", awaiting, frame({ messageType: "hello", uaid: "not-a-uuid" }), {
    phase: "Minting",
    command: { _tag: "MintUaid" }
  })
  row("hello with a uaid in any spelling reads its record", awaiting, frame({ messageType: "hello", uaid: UAID.toUpperCase() }), {
    phase: "Resuming",
    command: { _tag: "ReadUser", uaid: UAID }
  })
  row("a minted uaid: hello reply, claim, hello event, nothing stored", minting, { _tag: "UaidMinted", uaid: UAID }, {
    phase: "Identified",
    frames: [{ messageType: "hello", uaid: UAID, status: 200, use_webpush: true, broadcasts: {} }],
    events: ["client.hello.1"],
    signals: ["Claim"],
    check: (t) => assert.deepStrictEqual(t.events[0]?.data, { kind: "new" })
  })
  for (const messageType of ["register", "unregister", "ack", "nack", "ping", "broadcast_subscribe", "urgency"]) {
    row(`${messageType} before hello closes ExpectedHello`, awaiting, frame({ messageType }), {
      phase: "Closed",
      close: "expected-hello",
      events: []
    })
  }
  row("a bad frame closes Json", awaiting, { _tag: "BadFrame", detail: "x" }, { phase: "Closed", close: "invalid-json" })
  row("a binary frame closes UnsupportedMessage", awaiting, { _tag: "BinaryFrame" }, { phase: "Closed", close: "binary-frame" })
  row("a tick before hello_timeout does nothing", awaiting, { _tag: "Tick" }, { phase: "AwaitingHello", frames: [] })
  row("a tick at hello_timeout closes HandshakeTimeout", awaiting, { _tag: "Tick" }, { phase: "Closed", close: "hello-timeout" }, NOW - 100 + OPTIONS.helloTimeoutMs)
  row("a kick closes with its kind", awaiting, { _tag: "Kick", kind: "shutdown" }, { phase: "Closed", close: "shutdown" })
  row("the socket closing ends it", awaiting, { _tag: "SocketClosed" }, { phase: "Closed" })
  row("a delivery is ignored", awaiting, { _tag: "Delivery", notification: message() }, { phase: "AwaitingHello", frames: [] })
})

describe("step: Resuming", () => {
  row("no record: a new uaid", resuming(), { _tag: "UserRead", user: undefined }, { phase: "Minting", command: { _tag: "MintUaid" } })
  row("a bridged record is not resumed here: a new uaid", resuming(), { _tag: "UserRead", user: user({ routerType: "fcm" }) }, {
    phase: "Minting",
    command: { _tag: "MintUaid" }
  })
  row("a minted uaid after a claim is a reassigned hello", { ...minting, claimed: UAID } as Phase, { _tag: "UaidMinted", uaid: "b".repeat(32) }, {
    phase: "Identified",
    events: ["client.hello.1"],
    check: (t) => assert.deepStrictEqual(t.events[0]?.data, { kind: "reassigned" })
  })
  row("a record connected after now closes AlreadyConnected", resuming(), { _tag: "UserRead", user: user({ connectedAt: NOW + 5 }) }, {
    phase: "Closed",
    close: "already-connected"
  })
  row("a record whose month table is no longer active is dropped", resuming(), {
    _tag: "UserRead",
    user: user({ currentMonth: "message_2020_01" })
  }, { phase: "Resuming", command: { _tag: "DropUser", uaid: UAID, reason: "stale_month" } })
  row("dropped for its month: reset event, then a new uaid", resuming(), { _tag: "UserDropped", dropped: true }, {
    phase: "Minting",
    events: ["uaid.reset.1"],
    command: { _tag: "MintUaid" }
  })
  row("not dropped (another session re-claimed it first): a new uaid all the same", resuming(), { _tag: "UserDropped", dropped: false }, {
    phase: "Minting",
    events: [],
    command: { _tag: "MintUaid" }
  })
  row("a resumable record is re-claimed: this node, connected now", resuming(), { _tag: "UserRead", user: user({ nodeId: "http://other:8081" }) }, {
    phase: "Resuming",
    command: { _tag: "WriteUser" },
    check: (t) => {
      const command = t.command as Extract<Command, { _tag: "WriteUser" }>
      assert.strictEqual(command._tag, "WriteUser")
      assert.strictEqual(command.user.nodeId, NODE)
      assert.strictEqual(command.user.connectedAt, NOW)
      assert.strictEqual(command.purpose._tag, "Resume")
    }
  })
  const written = (previous: UserRecord): Input => ({
    _tag: "UserWritten",
    command: { _tag: "WriteUser", user: { ...previous, nodeId: NODE, connectedAt: NOW }, purpose: { _tag: "Resume", previous } },
    written: true
  })
  row("resumed: hello reply, the old node told to drop its session, the drain starts", resuming(), written(user({ nodeId: "http://other:8081" })), {
    phase: "Draining",
    frames: [{ messageType: "hello", uaid: UAID, status: 200, use_webpush: true, broadcasts: {} }],
    events: ["client.hello.1"],
    signals: ["DisconnectPeer", "Claim"],
    command: { _tag: "ReadPage", table: THIS_MONTH, rows: "first" }
  })
  it("resumed after time has passed: the session is the one the record names (its connected_at)", () => {
    const later = NOW + 873 // the write took time
    const t = step(resuming(), written(user({ nodeId: "http://other:8081" })), later)
    assert.strictEqual(sessionOf(t).connectedAt, NOW)
    const claim = t.signals.find((e) => e._tag === "Claim") as Extract<Transition["signals"][number], { _tag: "Claim" }>
    assert.strictEqual(claim.connectedAt, NOW, "deliveries for the record's connected_at are taken")
    // …and every later condition on connected_at names the record's value.
    const closed = step(step(t.phase, { _tag: "SocketClosed" }, later + 5_000).phase, { _tag: "MailboxDrained" }, later + 5_000)
    // Nothing to save: this node leaves the record — the one the session wrote.
    assert.deepInclude(closed.command as object, { _tag: "ClearNodeId", connectedAt: NOW })
  })
  it("a hello whose storage failed after hello_timeout closes as a handshake timeout", () => {
    const failed = { _tag: "CommandFailed", command: { _tag: "ReadUser", uaid: UAID, attempt: 0 } } as const
    assert.strictEqual(step(resuming(), failed, NOW - 100 + OPTIONS.helloTimeoutMs).close, "hello-timeout")
    assert.strictEqual(step(resuming(), failed, NOW).close, "storage-error")
  })
  row("resumed on last month's table: migrating, draining the old month", resuming(), written(user({ currentMonth: LAST_MONTH })), {
    phase: "Migrating",
    signals: ["Claim"],
    command: { _tag: "ReadPage", table: LAST_MONTH, rows: "first" }
  })
  row("the resume write lost: read again", resuming(), {
    _tag: "UserWritten",
    command: { _tag: "WriteUser", user: user(), purpose: { _tag: "Resume", previous: user() } },
    written: false
  }, { phase: "Rechecking", command: { _tag: "ReadUser", uaid: UAID, attempt: 0 } })
  row("read again, the record is gone (dropped meanwhile): a new uaid", rechecking, { _tag: "UserRead", user: undefined }, {
    phase: "Minting",
    command: { _tag: "MintUaid" }
  })
  row("read again, the record is there (newer): AlreadyConnected", rechecking, { _tag: "UserRead", user: user() }, {
    phase: "Closed",
    close: "already-connected"
  })
  row("storage failing while resuming closes StorageError", resuming(), { _tag: "CommandFailed", command: { _tag: "ReadUser", uaid: UAID, attempt: 0 } }, {
    phase: "Closed",
    close: "storage-error"
  })
})

describe("step: broadcasts", () => {
  const SET = new Map([["remote-settings/monitor_changes", "\"17\""], ["other", "v2"]])
  const withSet = (name: string, phase: Phase, input: Input, expected: Expect, now = NOW) =>
    it(name, () => {
      const t = step(phase, input, now, SET)
      assert.strictEqual(t.phase._tag, expected.phase)
      if (expected.frames !== undefined) assert.deepStrictEqual(t.frames.map((f) => JSON.parse(f)), expected.frames)
      if (expected.events !== undefined) assert.deepStrictEqual(t.events.map((e) => e.type), expected.events)
      if (expected.signals !== undefined) assert.deepStrictEqual(t.signals.map((e) => e._tag), expected.signals)
      expected.check?.(t)
    })
  const helloWith = (broadcasts: Record<string, string>): Phase => ({ ...(minting as PhaseOf<"Minting">), broadcasts })
  withSet("hello: the versions the client is behind on, errors for unknown ids, the known ones followed", helloWith({
    "remote-settings/monitor_changes": "\"0\"",
    other: "v2",
    nope: "1"
  }), { _tag: "UaidMinted", uaid: UAID }, {
    phase: "Identified",
    frames: [{
      messageType: "hello",
      uaid: UAID,
      status: 200,
      use_webpush: true,
      broadcasts: { "remote-settings/monitor_changes": "\"17\"", errors: { nope: "Broadcast not found" } }
    }],
    events: ["client.hello.1", "broadcast.delivered.1"],
    check: (t) => assert.deepStrictEqual(sessionOf(t).broadcasts, ["remote-settings/monitor_changes", "\"17\"", "other", "v2"])
  })
  withSet("hello from an up-to-date client: broadcasts {}", helloWith({ other: "v2" }), { _tag: "UaidMinted", uaid: UAID }, {
    phase: "Identified",
    events: ["client.hello.1"],
    check: (t) => assert.deepStrictEqual(JSON.parse(t.frames[0]!).broadcasts, {})
  })
  withSet("subscribe: answered at once with what is new to the client", identified(), frame({
    messageType: "broadcast_subscribe",
    broadcasts: { "remote-settings/monitor_changes": "\"0\"", nope: "x" }
  }), {
    phase: "Identified",
    frames: [{ messageType: "broadcast", broadcasts: { "remote-settings/monitor_changes": "\"17\"", errors: { nope: "Broadcast not found" } } }],
    events: ["broadcast.delivered.1"]
  })
  withSet("subscribe while up to date: no reply", identified({ broadcasts: ["other", "v2"] }), frame({
    messageType: "broadcast_subscribe",
    broadcasts: { other: "v2" }
  }), { phase: "Identified", frames: [] })
  withSet("a followed broadcast changed: sent at the keepalive tick instead of the ping", identified({ broadcasts: ["other", "v1"] }), { _tag: "Tick" }, {
    phase: "Identified",
    frames: [{ messageType: "broadcast", broadcasts: { other: "v2" } }],
    signals: [],
    events: ["broadcast.delivered.1"],
    check: (t) => assert.deepStrictEqual(sessionOf(t).broadcasts, ["other", "v2"])
  }, NOW - 1_000 + OPTIONS.autoPingIntervalMs)
  withSet("nothing changed: the tick pings as usual", identified({ broadcasts: ["other", "v2"] }), { _tag: "Tick" }, {
    phase: "Identified",
    frames: [],
    signals: ["Ping"]
  }, NOW - 1_000 + OPTIONS.autoPingIntervalMs)
  withSet("only the first 100 ids are looked at; over-long ids are ignored", identified(), frame({
    messageType: "broadcast_subscribe",
    broadcasts: { ["x".repeat(10_000)]: "1", ...Object.fromEntries(Array.from({ length: 150 }, (_, i) => [`id${i}`, "1"])) }
  }), {
    phase: "Identified",
    check: (t) => {
      const errors = JSON.parse(t.frames[0]!).broadcasts.errors as Record<string, string>
      assert.strictEqual(Object.keys(errors).length, 99)
      assert.isFalse(Object.keys(errors).some((id) => id.length > 128))
    }
  })
})

describe("step: Identified, commands", () => {
  row("a second hello closes AlreadyHello", identified(), frame({ messageType: "hello" }), {
    phase: "Closing",
    close: "already-hello",
    events: ["session.closed.1"]
  })
  row("register with a non-canonical channel id: status 401, socket kept", identified(), frame({ messageType: "register", channelID: CHID.toUpperCase() }), {
    phase: "Identified",
    frames: [{ messageType: "register", channelID: CHID.toUpperCase(), status: 401, pushEndpoint: "" }]
  })
  row("register makes the endpoint first, bound to the decoded VAPID key", identified(), frame({ messageType: "register", channelID: CHID, key: VAPID_KEY }), {
    phase: "Identified",
    command: { _tag: "MakeEndpoint", uaid: UAID, channelId: CHID },
    check: (t) => assert.strictEqual((t.command as Extract<Command, { _tag: "MakeEndpoint" }>).rawKey?.length, 65)
  })
  row("a key that is not a VAPID public key: status 400 at once, socket kept", identified(), frame({ messageType: "register", channelID: CHID, key: "k" }), {
    phase: "Identified",
    frames: [{ messageType: "register", channelID: CHID, status: 400, pushEndpoint: "Failed to generate endpoint" }]
  })
  const made = (endpoint: string): Input => ({
    _tag: "EndpointMade",
    command: { _tag: "MakeEndpoint", uaid: UAID, channelId: CHID, rawKey: undefined },
    endpoint
  })
  row("endpoint made, user known: the channel is added", identified(), made("http://e/wpush/v1/t"), {
    phase: "Identified",
    command: { _tag: "AddChannel", uaid: UAID, table: THIS_MONTH }
  })
  row("endpoint made, new uaid: its router record is written first", identified({ recorded: false }), made("http://e/wpush/v1/t"), {
    phase: "Identified",
    command: { _tag: "WriteUser" },
    check: (t) => {
      const command = t.command as Extract<Command, { _tag: "WriteUser" }>
      assert.strictEqual(command.purpose._tag, "Register")
      assert.strictEqual(command.user.nodeId, NODE)
      assert.strictEqual(command.user.currentMonth, THIS_MONTH)
    }
  })
  const registering = { channelId: CHID, endpoint: "http://e/wpush/v1/t" }
  row("the record written: the channel is added, the session knows its record", identified({ recorded: false }), {
    _tag: "UserWritten",
    command: { _tag: "WriteUser", user: user(), purpose: { _tag: "Register", registering } },
    written: true
  }, {
    phase: "Identified",
    command: { _tag: "AddChannel" },
    check: (t) => assert.isTrue(sessionOf(t).recorded)
  })
  row("the record not written (a newer connection): status 500", identified({ recorded: false }), {
    _tag: "UserWritten",
    command: { _tag: "WriteUser", user: user(), purpose: { _tag: "Register", registering } },
    written: false
  }, { phase: "Identified", frames: [{ messageType: "register", channelID: CHID, status: 500, pushEndpoint: "" }] })
  row("channel added: status 200 with the endpoint", identified(), { _tag: "ChannelAdded", registering, added: true }, {
    phase: "Identified",
    frames: [{ messageType: "register", channelID: CHID, status: 200, pushEndpoint: registering.endpoint }],
    events: ["channel.registered.1"]
  })
  row("the user has max_channels_per_user channels: status 413, socket kept", identified(), { _tag: "ChannelAdded", registering, added: false }, {
    phase: "Identified",
    frames: [{ messageType: "register", channelID: CHID, status: 413, pushEndpoint: "" }],
    events: ["channel.refused.1"]
  })
  row("storage failing on register: status 500, socket kept", identified(), {
    _tag: "CommandFailed",
    command: { _tag: "AddChannel", uaid: UAID, table: THIS_MONTH, registering }
  }, { phase: "Identified", frames: [{ messageType: "register", channelID: CHID, status: 500, pushEndpoint: "" }] })
  row("unregister with a malformed channel id: 401", identified(), frame({ messageType: "unregister", channelID: "x" }), {
    phase: "Identified",
    frames: [{ messageType: "unregister", channelID: "x", status: 401 }]
  })
  row("unregister before any register: 200, nothing to remove", identified({ recorded: false }), frame({ messageType: "unregister", channelID: CHID }), {
    phase: "Identified",
    frames: [{ messageType: "unregister", channelID: CHID, status: 200 }],
    events: ["channel.unregistered.1"]
  })
  row("unregister removes the channel (any spelling)", identified(), frame({ messageType: "unregister", channelID: CHID.toUpperCase(), code: 201 }), {
    phase: "Identified",
    command: { _tag: "RemoveChannel", channelId: CHID, code: 201 }
  })
  row("channel removed: 200", identified(), {
    _tag: "ChannelRemoved",
    command: { _tag: "RemoveChannel", uaid: UAID, table: THIS_MONTH, channelId: CHID, code: 201 }
  }, { phase: "Identified", frames: [{ messageType: "unregister", channelID: CHID, status: 200 }], events: ["channel.unregistered.1"] })
  row("storage failing on unregister: 500", identified(), {
    _tag: "CommandFailed",
    command: { _tag: "RemoveChannel", uaid: UAID, table: THIS_MONTH, channelId: CHID, code: undefined }
  }, { phase: "Identified", frames: [{ messageType: "unregister", channelID: CHID, status: 500 }] })
  row("a first client ping is answered {}", identified(), frame({ messageType: "ping" }), { phase: "Identified", frames: [{}] })
  row("a client ping sooner than min_ping_interval closes 4774", identified({ lastClientPing: NOW - 1_000 }), frame({ messageType: "ping" }), {
    phase: "Closing",
    close: "excessive-ping"
  })
  row("nack: only an event", identified(), frame({ messageType: "nack", version: "v", code: 301 }), {
    phase: "Identified",
    frames: [],
    events: ["notification.nacked.1"]
  })
  row("broadcast_subscribe: no reply", identified(), frame({ messageType: "broadcast_subscribe", broadcasts: {} }), { phase: "Identified", frames: [] })
  row("any frame is activity: the keepalive starts over", identified({ pingSentAt: NOW - 10 }), frame({ messageType: "nack", version: "v" }), {
    phase: "Identified",
    check: (t) => {
      assert.isUndefined(sessionOf(t).pingSentAt)
      assert.strictEqual(sessionOf(t).lastActivity, NOW)
    }
  })
})

describe("step: register on a server that accepts only VAPID-signed pushes (require_vapid)", () => {
  const vapidOnly = makeProtocol({ ...OPTIONS, requireVapid: true })
  it("a register without a key: status 403 at once (UnifiedPush's VAPID_REQUIRED), no endpoint made, socket kept", () => {
    for (const message of [{ messageType: "register", channelID: CHID }, { messageType: "register", channelID: CHID, key: null }]) {
      const t = vapidOnly.step(identified(), frame(message), NOW)
      assert.strictEqual(t.phase._tag, "Identified")
      assert.isUndefined(t.command)
      assert.isUndefined(t.close)
      assert.deepStrictEqual(t.frames.map((f) => JSON.parse(f)), [{ messageType: "register", channelID: CHID, status: 403, pushEndpoint: "VAPID key required" }])
    }
  })
  it("a register with a key: the endpoint is made, bound to it", () => {
    const t = vapidOnly.step(identified(), frame({ messageType: "register", channelID: CHID, key: VAPID_KEY }), NOW)
    assert.deepInclude(t.command as object, { _tag: "MakeEndpoint", uaid: UAID, channelId: CHID })
    assert.strictEqual((t.command as Extract<Command, { _tag: "MakeEndpoint" }>).rawKey?.length, 65)
  })
  it("a malformed key is still a bad key (400), not a missing one", () => {
    const t = vapidOnly.step(identified(), frame({ messageType: "register", channelID: CHID, key: "k" }), NOW)
    assert.strictEqual(JSON.parse(t.frames[0]!).status, 400)
  })
  row("without require_vapid, a register without a key makes a keyless (v1) endpoint", identified(), frame({ messageType: "register", channelID: CHID }), {
    phase: "Identified",
    command: { _tag: "MakeEndpoint", uaid: UAID, channelId: CHID, rawKey: undefined }
  })
})

describe("step: Identified, the command budget", () => {
  const spent = { tokens: 0, tokensAt: NOW }
  row("within the burst a command runs", identified(), frame({ messageType: "register", channelID: CHID }), {
    phase: "Identified",
    command: { _tag: "MakeEndpoint" },
    check: (t) => assert.strictEqual(sessionOf(t).tokens, 2)
  })
  row("beyond it the command waits", identified(spent), frame({ messageType: "register", channelID: CHID }), {
    phase: "Identified",
    check: (t) => {
      assert.strictEqual(sessionOf(t).held.length, 1)
      assert.strictEqual(deadline(t.phase), NOW + 100, "woken when a token is back")
    }
  })
  const many = Array.from({ length: 31 }, () => ({ messageType: "register", channelID: CHID }) as never)
  row("many waiting: reading the socket pauses", identified({ ...spent, held: many }), frame({ messageType: "register", channelID: CHID }), {
    phase: "Identified",
    signals: ["PauseReading"],
    check: (t) => assert.isTrue(sessionOf(t).readingPaused)
  })
  row("a tick releases what the budget allows, in order", identified({ ...spent, held: many.slice(0, 2), readingPaused: true }), { _tag: "Tick" }, {
    phase: "Identified",
    signals: ["Replay", "ResumeReading"],
    check: (t) => assert.strictEqual(sessionOf(t).held.length, 0)
  }, NOW + 250)
  row("a released command is not charged again", identified(spent), { _tag: "Frame", message: { messageType: "register", channelID: CHID }, admitted: true }, {
    phase: "Identified",
    command: { _tag: "MakeEndpoint" }
  })
  row("acks are never held", identified(spent), frame({ messageType: "ack", updates: [] }), {
    phase: "Identified",
    check: (t) => assert.strictEqual(sessionOf(t).held.length, 0)
  })
})

describe("step: Identified, deliveries and acks", () => {
  const unacked = (entries: ReadonlyArray<[Notification, string | undefined]>) =>
    new Map(entries.map(([n, table]) => [n.version, table === undefined ? direct(n) : stored(n, table)]))
  row("a direct delivery is sent and tracked", identified(), { _tag: "Delivery", notification: message() }, {
    phase: "Identified",
    frames: [{ messageType: "notification", channelID: CHID, version: "v1", data: "ZGF0YQ", headers: { encoding: "aes128gcm" } }],
    events: ["notification.delivered.1"],
    check: (t) => assert.isTrue(sessionOf(t).unacked.has("v1"))
  })
  row("TTL 0 goes out but is not tracked", identified(), { _tag: "Delivery", notification: message({ ttl: 0 }) }, {
    phase: "Identified",
    events: ["notification.delivered.1"],
    check: (t) => assert.isFalse(sessionOf(t).unacked.has("v1"))
  })
  row("an expired delivery is dropped", identified(), { _tag: "Delivery", notification: message({ ttl: 1, timestamp: Math.floor(NOW / 1000) - 5 }) }, {
    phase: "Identified",
    frames: [],
    events: ["notification.expired.1"]
  })
  row("acking a direct message forgets it", identified({ unacked: unacked([[message(), undefined]]) }), frame({
    messageType: "ack",
    updates: [{ channelID: CHID, version: "v1" }]
  }), { phase: "Identified", events: ["notification.acked.1"], check: (t) => assert.strictEqual(sessionOf(t).unacked.size, 0) })
  row("acking an unknown version does nothing", identified(), frame({ messageType: "ack", updates: [{ channelID: CHID, version: "zz" }] }), {
    phase: "Identified",
    events: []
  })
  const paged = { tables: [THIS_MONTH], rows: "timestamp" as const, after: NOW - 5_000, again: false, poked: false, backlog: 1, backlogByChannel: new Map() }
  const ackV1 = frame({ messageType: "ack", updates: [{ channelID: CHID, version: "v1", code: 100 }] })
  row("acking the last outstanding stored message makes the page's acked rows tombstones together, before the next page", identified({
    unacked: unacked([[message(), THIS_MONTH]]),
    ackedRows: [stored(message({ version: "v0" }))],
    drain: paged
  }), ackV1, {
    phase: "Draining",
    events: ["notification.acked.1"],
    command: { _tag: "TombstoneAcked", uaid: UAID },
    check: (t) => {
      const command = t.command as Extract<Command, { _tag: "TombstoneAcked" }>
      assert.deepStrictEqual(command.messages.map((m) => m.notification.version), ["v0", "v1"])
      assert.deepStrictEqual(sessionOf(t).ackedRows, [])
    }
  })
  row("acking a stored timestamp message while others are outstanding: its row waits for the page", identified({
    unacked: unacked([[message(), THIS_MONTH], [message({ version: "v2" }), THIS_MONTH]]),
    drain: paged
  }), ackV1, {
    phase: "Draining",
    events: ["notification.acked.1"],
    check: (t) => assert.deepStrictEqual(sessionOf(t).ackedRows.map((m) => m.notification.version), ["v1"])
  })
  it("acked timestamp rows become tombstones a page at a time while others stay outstanding", () => {
    const outstanding = Array.from({ length: OPTIONS.pageSize + 1 }, (_, i) => message({ version: `w${i}`, sortkeyTimestamp: NOW - 5_000 - i }))
    const holding = identified({ unacked: unacked(outstanding.map((m) => [m, THIS_MONTH])), drain: { ...paged, rows: "read" } })
    const acked = step(holding, frame({ messageType: "ack", updates: outstanding.slice(0, OPTIONS.pageSize).map((m) => ({ channelID: CHID, version: m.version, code: 100 })) }), NOW)
    assert.strictEqual(acked.command?._tag, "TombstoneAcked")
    assert.strictEqual((acked.command as Extract<Command, { _tag: "TombstoneAcked" }>).messages.length, OPTIONS.pageSize)
    assert.strictEqual(sessionOf(acked).unacked.size, 1)
  })
  row("acking a stored topic message makes its tombstone at once (on its version), with the rows waiting", identified({
    unacked: unacked([[message({ topic: "a" }), THIS_MONTH], [message({ version: "v2" }), THIS_MONTH]]),
    ackedRows: [stored(message({ version: "v0" }))],
    drain: paged
  }), ackV1, {
    phase: "Draining",
    command: { _tag: "TombstoneAcked", uaid: UAID },
    check: (t) => assert.deepStrictEqual((t.command as Extract<Command, { _tag: "TombstoneAcked" }>).messages.map((m) => m.notification.version), ["v0", "v1"])
  })
  row("rows tombstoned, page acked: the next page is read", identified({ drain: paged }), { _tag: "AckedTombstoned" }, {
    phase: "Draining",
    command: { _tag: "ReadPage", rows: "timestamp", after: NOW - 5_000 }
  })
  row("a poke with no router record does nothing", identified({ recorded: false }), { _tag: "CheckStorage" }, { phase: "Identified" })
  row("a poke starts a drain", identified(), { _tag: "CheckStorage" }, { phase: "Draining", command: { _tag: "ReadPage", rows: "first" } })
  row("a poke mid-drain: read on now, and go again afterwards", identified({ drain: paged, unacked: unacked([[message(), THIS_MONTH]]) }), { _tag: "CheckStorage" }, {
    phase: "Draining",
    command: { _tag: "ReadPage", rows: "timestamp", after: NOW - 5_000 },
    check: (t) => assert.isTrue(sessionOf(t).drain?.again)
  })
  const tail = { ...paged, rows: "read" as const }
  row("a poke after the last page, the client holding what it was sent unacked: what was stored after that page is read at once", identified({
    drain: tail,
    unacked: unacked([[message(), THIS_MONTH]])
  }), { _tag: "CheckStorage" }, {
    phase: "Draining",
    command: { _tag: "ReadPage", rows: "timestamp", after: NOW - 5_000 },
    check: (t) => assert.deepInclude(sessionOf(t).drain ?? {}, { again: true, poked: false })
  })
  row("a poke after the last page, the client holding client_channel_capacity unacked: nothing is read until it acks", identified({
    drain: tail,
    unacked: unacked(Array.from({ length: OPTIONS.clientChannelCapacity }, (_, i) => [message({ version: `h${i}` }), THIS_MONTH] as const))
  }), { _tag: "CheckStorage" }, {
    phase: "Draining",
    check: (t) => assert.deepInclude(sessionOf(t).drain ?? {}, { again: true, poked: true })
  })
  row("no poke after the last page: nothing is read while what was sent is unacked", identified({
    drain: tail,
    unacked: unacked([[message(), THIS_MONTH], [message({ version: "v2" }), THIS_MONTH]])
  }), ackV1, { phase: "Draining", events: ["notification.acked.1"] })
  const read = (rows: "first" | "timestamp", messages: ReadonlyArray<Notification>, lastSortKey?: number, more = false): Input => ({
    _tag: "PageRead",
    command: { _tag: "ReadPage", uaid: UAID, table: THIS_MONTH, rows, after: undefined, limit: 10, attempt: 0 },
    messages,
    lastSortKey,
    more
  })
  const start = { tables: [THIS_MONTH], rows: "first" as const, after: undefined, again: false, poked: false, backlog: 0, backlogByChannel: new Map() }
  // The first page of a table reads from its first row: topic rows, then timestamp rows.
  const topic = (version: string) => message({ version, topic: version, sortkeyTimestamp: undefined })
  row("a first page with nothing in it: the table is read, the drain is over", identified({ drain: start }), read("first", []), {
    phase: "Identified",
    check: (t) => assert.isUndefined(sessionOf(t).drain)
  })
  it("a first page that was not full: topic messages, then timestamp messages, sent together; once acked and tombstoned, the drain is over", () => {
    const sent = step(identified({ drain: start }), read("first", [topic("t1"), message({ version: "s1" })], NOW - 1_000), NOW)
    assert.deepStrictEqual(sent.frames.map((f) => JSON.parse(f).version), ["t1", "s1"])
    assert.deepInclude(sessionOf(sent).drain ?? {}, { rows: "read", after: NOW - 1_000 })
    const acked = step(sent.phase, frame({ messageType: "ack", updates: ["t1", "s1"].map((version) => ({ channelID: CHID, version, code: 100 })) }), NOW)
    assert.deepStrictEqual((acked.command as Extract<Command, { _tag: "TombstoneAcked" }>).messages.map((row) => row.notification.version), ["t1", "s1"])
    const done = tombstoned(acked)
    assert.isUndefined(done.command)
    assert.isUndefined(sessionOf(done).drain)
  })
  it("a full first page that reached the timestamp rows: the next page is timestamp rows after it", () => {
    const sent = step(identified({ drain: start }), read("first", [topic("t1"), message({ version: "v1" })], NOW - 1_000, true), NOW)
    const afterAck = step(sent.phase, frame({ messageType: "ack", updates: ["t1", "v1"].map((version) => ({ channelID: CHID, version, code: 100 })) }), NOW)
    assert.deepStrictEqual(tombstoned(afterAck).command, { _tag: "ReadPage", uaid: UAID, table: THIS_MONTH, rows: "timestamp", after: NOW - 1_000, limit: OPTIONS.pageSize, attempt: 0 })
  })
  it("a full first page of topic rows only: read again from the first row once acked and tombstoned (more topic rows may follow)", () => {
    const sent = step(identified({ drain: start }), read("first", [topic("t1")], undefined, true), NOW)
    const afterAck = step(sent.phase, frame({ messageType: "ack", updates: [{ channelID: CHID, version: "t1", code: 100 }] }), NOW)
    assert.deepStrictEqual(tombstoned(afterAck).command, { _tag: "ReadPage", uaid: UAID, table: THIS_MONTH, rows: "first", after: undefined, limit: OPTIONS.pageSize, attempt: 0 })
  })
  row("a full first page of topic rows all in hand (sent directly): timestamp rows next, not the same page again", identified({
    drain: start,
    unacked: new Map([["t1", direct(topic("t1"))]])
  }), read("first", [topic("t1")], undefined, true), {
    phase: "Draining",
    frames: [],
    command: { _tag: "ReadPage", rows: "timestamp", after: undefined }
  })
  row("a full first page of expired topic rows only: timestamp rows next", identified({ drain: start }), read("first", [], undefined, true), {
    phase: "Draining",
    command: { _tag: "ReadPage", rows: "timestamp", after: undefined }
  })
  row("a full first page of expired rows that reached the timestamp rows: read on after it", identified({ drain: start }), read("first", [], NOW - 3_000, true), {
    phase: "Draining",
    command: { _tag: "ReadPage", rows: "timestamp", after: NOW - 3_000 }
  })
  row("a page: each message sent from storage", identified({ drain: { ...start, rows: "timestamp" } }), read("timestamp", [message(), message({ version: "v2" })], NOW - 1_000), {
    phase: "Draining",
    events: ["notification.delivered.1", "notification.delivered.1"],
    check: (t) => {
      assert.strictEqual(t.frames.length, 2)
      assert.strictEqual(sessionOf(t).drain?.after, NOW - 1_000)
    }
  })
  row("a full page of expired rows only: read on after it", identified({ drain: { ...start, rows: "timestamp" } }), read("timestamp", [], NOW - 3_000, true), {
    phase: "Draining",
    command: { _tag: "ReadPage", rows: "timestamp", after: NOW - 3_000 }
  })
  row("a page of expired rows that was not full: the table is read", identified({ drain: { ...start, rows: "timestamp" } }), read("timestamp", [], NOW - 3_000), {
    phase: "Identified",
    check: (t) => assert.isUndefined(sessionOf(t).drain)
  })
  const acked = (t: { readonly phase: Phase }) => step(t.phase, frame({ messageType: "ack", updates: [{ channelID: CHID, version: "v1", code: 100 }] }), NOW)
  const tombstoned = (t: { readonly phase: Phase }) => step(t.phase, { _tag: "AckedTombstoned" }, NOW)
  it("a full page, once acked and tombstoned: the next page is read after it", () => {
    const sent = step(identified({ drain: { ...start, rows: "timestamp" } }), read("timestamp", [message()], NOW - 1_000, true), NOW)
    const afterAck = acked(sent)
    assert.strictEqual(afterAck.command?._tag, "TombstoneAcked")
    assert.deepStrictEqual(tombstoned(afterAck).command, { _tag: "ReadPage", uaid: UAID, table: THIS_MONTH, rows: "timestamp", after: NOW - 1_000, limit: OPTIONS.pageSize, attempt: 0 })
  })
  it("a page that was not full, once acked and tombstoned: the table is not read again, the drain is over", () => {
    const sent = step(identified({ drain: { ...start, rows: "timestamp" } }), read("timestamp", [message()], NOW - 1_000), NOW)
    const afterTombstones = tombstoned(acked(sent))
    assert.isUndefined(afterTombstones.command)
    assert.isUndefined(sessionOf(afterTombstones).drain)
  })
  row("a stored message that expired between the read and now is not sent", identified({ drain: { ...start, rows: "timestamp" } }), read("timestamp", [
    message({ ttl: 5, timestamp: Math.floor(NOW / 1000) - 5 })
  ]), {
    phase: "Identified",
    frames: [],
    events: ["notification.expired.1"]
  })
  row("the last table read: the drain is over", identified({ drain: { ...start, rows: "timestamp" } }), read("timestamp", []), {
    phase: "Identified",
    check: (t) => assert.isUndefined(sessionOf(t).drain)
  })
  row("the client already had msg_limit messages from storage: one more drops the user, sending nothing", identified({ drain: { ...start, rows: "timestamp", backlog: OPTIONS.msgLimit } }), read("timestamp", [message()], NOW), {
    phase: "Draining",
    frames: [],
    command: { _tag: "DropUser", reason: "too_many_messages", connectedAt: NOW - 1_000 }
  })
  it("a page past msg_limit: the client gets up to msg_limit, and the user is dropped once they are acked", () => {
    const page = [message({ version: "v1", sortkeyTimestamp: NOW - 1_003 }), message({ version: "v2", sortkeyTimestamp: NOW - 1_002 }), message({ version: "v3", sortkeyTimestamp: NOW - 1_001 })]
    const sent = step(identified({ drain: { ...start, rows: "timestamp", backlog: OPTIONS.msgLimit - 2 } }), read("timestamp", page, NOW - 1_001), NOW)
    assert.deepStrictEqual(sent.frames.map((f) => JSON.parse(f).version), ["v1", "v2"])
    assert.isUndefined(sent.command, "nothing is dropped while the client has messages to ack")
    const ack = (t: Transition, version: string, now: number) =>
      step(t.phase, frame({ messageType: "ack", updates: [{ channelID: CHID, version, code: 100 }] }), now)
    const one = ack(sent, "v1", NOW + 50)
    assert.isUndefined(one.command)
    const both = ack(one, "v2", NOW + 90)
    assert.strictEqual(both.command?._tag, "TombstoneAcked")
    const drop = step(both.phase, { _tag: "AckedTombstoned" }, NOW + 120)
    assert.deepInclude(drop.command as object, { _tag: "DropUser", reason: "too_many_messages", connectedAt: NOW - 1_000 })
  })
  it("messages pushed since hello never count towards msg_limit: a backlog of msg_limit and a burst after it are all sent, nobody is dropped", () => {
    // The session began (connectedAt) at NOW - 1_000: the first msgLimit rows were there, the rest came later.
    const backlog = Array.from({ length: OPTIONS.msgLimit }, (_, i) => message({ version: `b${i}`, sortkeyTimestamp: NOW - 2_000 + i }))
    const burst = Array.from({ length: OPTIONS.msgLimit }, (_, i) => message({ version: `n${i}`, sortkeyTimestamp: NOW - 900 + i }))
    const sent = step(identified({ drain: { ...start, rows: "timestamp" } }), read("timestamp", [...backlog, ...burst], NOW - 900 + OPTIONS.msgLimit - 1), NOW)
    assert.strictEqual(sent.frames.length, 2 * OPTIONS.msgLimit)
    assert.strictEqual(sessionOf(sent).drain?.backlog, Math.ceil(OPTIONS.msgLimit / 2), "its channel counts up to half of msg_limit; the burst not at all")
    const acked = step(sent.phase, frame({ messageType: "ack", updates: [...backlog, ...burst].map((m) => ({ channelID: CHID, version: m.version, code: 100 })) }), NOW + 10)
    const done = step(acked.phase, { _tag: "AckedTombstoned" }, NOW + 20)
    assert.isUndefined(done.command)
    assert.isUndefined(sessionOf(done).drain)
  })
  it("one channel's backlog counts up to half of msg_limit, several channels' together past it: the first msg_limit are sent, then the user is dropped", () => {
    const channels = ["c0", "c1", "c2"].map((n) => `${n}c8e1de-cddf-42d6-9919-a7b0e0f41e59`)
    const page = Array.from({ length: OPTIONS.msgLimit + 3 }, (_, i) =>
      message({ version: `m${i}`, channelId: channels[i % 3] as string, sortkeyTimestamp: NOW - 5_000 + i }))
    const sent = step(identified({ drain: { ...start, rows: "timestamp" } }), read("timestamp", page, NOW - 5_000 + page.length - 1), NOW)
    assert.strictEqual(sent.frames.length, OPTIONS.msgLimit)
    const acked = step(sent.phase, frame({ messageType: "ack", updates: page.slice(0, OPTIONS.msgLimit).map((m) => ({ channelID: m.channelId, version: m.version, code: 100 })) }), NOW + 10)
    const drop = step(acked.phase, { _tag: "AckedTombstoned" }, NOW + 20)
    assert.deepInclude(drop.command as object, { _tag: "DropUser", reason: "too_many_messages" })
  })
  it("exactly msg_limit stored: all are sent and nobody is dropped", () => {
    const page = Array.from({ length: OPTIONS.msgLimit }, (_, i) => message({ version: `v${i}`, sortkeyTimestamp: NOW - 1_000 + i }))
    const sent = step(identified({ drain: { ...start, rows: "timestamp" } }), read("timestamp", page, NOW - 1_000 + OPTIONS.msgLimit - 1), NOW)
    assert.strictEqual(sent.frames.length, OPTIONS.msgLimit)
    const acked = step(sent.phase, frame({ messageType: "ack", updates: page.map((m) => ({ channelID: CHID, version: m.version, code: 100 })) }), NOW + 10)
    const done = step(acked.phase, { _tag: "AckedTombstoned" }, NOW + 20)
    assert.isUndefined(done.command)
    assert.isUndefined(sessionOf(done).drain)
  })
  row("not dropped (a newer session took over): this one goes", draining(), { _tag: "UserDropped", dropped: false }, {
    phase: "Closing",
    close: "ghost"
  })
  row("dropped: reset event, close 1000, nothing left to save", draining(), { _tag: "UserDropped", dropped: true }, {
    phase: "Closing",
    close: "uaid-reset",
    events: ["uaid.reset.1", "session.closed.1"],
    check: (t) => assert.isFalse(sessionOf(t).recorded)
  })
  row("storage failing mid-drain: the socket stays, the read is retried later", identified({ drain: start }), {
    _tag: "CommandFailed",
    command: { _tag: "ReadPage", uaid: UAID, table: THIS_MONTH, rows: "first", after: undefined, limit: 10, attempt: 2 }
  }, {
    phase: "Draining",
    check: (t) => {
      const retry = sessionOf(t).retry
      assert.strictEqual(retry?.at, NOW + OPTIONS.storageRetryMs * 4)
      assert.strictEqual(retry?.command.attempt, 3)
      assert.strictEqual(deadline(t.phase), retry?.at)
    }
  })
})

describe("step: Identified, timers and the end", () => {
  row("idle past auto_ping_interval: a ping frame", identified(), { _tag: "Tick" }, {
    phase: "Identified",
    signals: ["Ping"],
    check: (t) => assert.strictEqual(sessionOf(t).pingSentAt, NOW - 1_000 + OPTIONS.autoPingIntervalMs)
  }, NOW - 1_000 + OPTIONS.autoPingIntervalMs)
  row("no pong within auto_ping_timeout: close PongTimeout", identified({ pingSentAt: NOW - OPTIONS.autoPingTimeoutMs }), { _tag: "Tick" }, {
    phase: "Closing",
    close: "pong-timeout"
  })
  row("a pong: the keepalive starts over", identified({ pingSentAt: NOW - 10 }), { _tag: "Pong" }, {
    phase: "Identified",
    check: (t) => assert.isUndefined(sessionOf(t).pingSentAt)
  })
  const retry = {
    command: { _tag: "ReadPage" as const, uaid: UAID, table: THIS_MONTH, rows: "first" as const, after: undefined, limit: 10, attempt: 1 },
    at: NOW
  }
  row("a retry that is due runs again", identified({ retry }), { _tag: "Tick" }, {
    phase: "Identified",
    command: { _tag: "ReadPage", attempt: 1 },
    check: (t) => assert.isUndefined(sessionOf(t).retry)
  })
  row("a kick closes with its kind", identified(), { _tag: "Kick", kind: "ghost" }, {
    phase: "Closing",
    close: "ghost",
    events: ["session.closed.1"]
  })
  row("the socket closing: saving begins", identified(), { _tag: "SocketClosed" }, { phase: "Closing", events: [] })
})

describe("step: Migrating and Moving", () => {
  const register = { messageType: "register", channelID: CHID } as const
  const migratingWith = (deferred: ReadonlyArray<ClientMessage>): Phase => ({ ...migrating(), deferred })
  row("commands wait for the month switch, no budget spent yet", migrating(), frame(register), {
    phase: "Migrating",
    frames: [],
    check: (t) => {
      assert.strictEqual((t.phase as PhaseOf<"Migrating">).deferred.length, 1)
      assert.strictEqual(sessionOf(t).tokens, 3)
    }
  })
  row("beyond HELD_COMMANDS_MAX waiting, a command is answered 503 at once (the socket is still read: the move waits for acks)", migratingWith(
    Array.from({ length: HELD_COMMANDS_MAX }, () => register)
  ), frame({ messageType: "unregister", channelID: CHID }), {
    phase: "Migrating",
    frames: [{ messageType: "unregister", channelID: CHID, status: 503 }],
    events: ["channel.refused.1"],
    signals: [],
    check: (t) => assert.strictEqual((t.phase as PhaseOf<"Migrating">).deferred.length, HELD_COMMANDS_MAX)
  })
  row("while migrating, a timestamp page that was not full is not the last: the old table is read until a page is empty", migrating({
    drain: { tables: [LAST_MONTH], rows: "timestamp", after: undefined, again: false, poked: false, backlog: 0, backlogByChannel: new Map() }
  }), {
    _tag: "PageRead",
    command: { _tag: "ReadPage", uaid: UAID, table: LAST_MONTH, rows: "timestamp", after: undefined, limit: 10, attempt: 0 },
    messages: [message()],
    lastSortKey: NOW - 1_000,
    more: false
  }, { phase: "Migrating", check: (t) => assert.strictEqual(sessionOf(t).drain?.rows, "timestamp") })
  row("while migrating, a first page that was not full is not the last either: timestamp rows after it next", migrating(), {
    _tag: "PageRead",
    command: { _tag: "ReadPage", uaid: UAID, table: LAST_MONTH, rows: "first", after: undefined, limit: 10, attempt: 0 },
    messages: [message()],
    lastSortKey: NOW - 1_000,
    more: false
  }, { phase: "Migrating", check: (t) => assert.deepInclude(sessionOf(t).drain ?? {}, { rows: "timestamp", after: NOW - 1_000 }) })
  row("the old month drained: the user moves to this month", migrating({
    drain: { tables: [LAST_MONTH], rows: "timestamp", after: undefined, again: false, poked: false, backlog: 0, backlogByChannel: new Map() }
  }), {
    _tag: "PageRead",
    command: { _tag: "ReadPage", uaid: UAID, table: LAST_MONTH, rows: "timestamp", after: undefined, limit: 10, attempt: 0 },
    messages: [],
    lastSortKey: undefined,
    more: false
  }, {
    phase: "Moving",
    command: { _tag: "ReadChannels", table: LAST_MONTH },
    check: (t) => assert.strictEqual((t.phase as PhaseOf<"Moving">).to, THIS_MONTH)
  })
  row("moving: the channels read are copied into this month's table", moving(), { _tag: "ChannelsRead", channels: new Set([CHID]) }, {
    phase: "Moving",
    command: { _tag: "AddChannels", table: THIS_MONTH, channels: new Set([CHID]) }
  })
  row("moving: the channels copied, the record is pointed at this month's table", moving(), { _tag: "ChannelsAdded" }, {
    phase: "Moving",
    command: { _tag: "PointRecord", table: THIS_MONTH }
  })
  row("moving: commands still wait", moving(), frame(register), {
    phase: "Moving",
    check: (t) => assert.strictEqual((t.phase as PhaseOf<"Moving">).deferred.length, 1)
  })
  row("moving: a poke is not needed (both months are drained once moved)", moving(), { _tag: "CheckStorage" }, { phase: "Moving" })
  row("moving: the move failed, retried with backoff", moving(), {
    _tag: "CommandFailed",
    command: { _tag: "AddChannels", uaid: UAID, table: THIS_MONTH, channels: new Set([CHID]), attempt: 0 }
  }, { phase: "Moving", check: (t) => assert.strictEqual(sessionOf(t).retry?.command._tag, "AddChannels") })
  row("moved: event, the waiting commands fed again through the budget, both months drained", moving([register]), {
    _tag: "RecordPointed"
  }, {
    phase: "Draining",
    events: ["month.migrated.1"],
    signals: ["Replay"],
    command: { _tag: "ReadPage", table: LAST_MONTH },
    check: (t) => {
      const replay = t.signals[0] as Extract<Transition["signals"][number], { _tag: "Replay" }>
      assert.deepStrictEqual(replay, { _tag: "Replay", messages: [register], admitted: false })
      assert.strictEqual(sessionOf(t).table, THIS_MONTH)
      assert.deepStrictEqual(sessionOf(t).drain?.tables, [LAST_MONTH, THIS_MONTH])
    }
  })
  it("a replayed command is budgeted: beyond the burst it is held", () => {
    const moved = step(moving([register]), { _tag: "RecordPointed" }, NOW)
    const phase = moved.phase as PhaseOf<"Draining">
    const spent: Phase = { ...phase, session: { ...phase.session, budget: { ...phase.session.budget, tokens: 0, tokensAt: NOW } } }
    const replayed = step(spent, { _tag: "Frame", message: register, admitted: false }, NOW)
    assert.isUndefined(replayed.command)
    assert.strictEqual(sessionOf(replayed).held.length, 1)
  })
})

describe("step: Closing", () => {
  const sent = message({ version: "d1" })
  const answering = (overrides: Partial<Flat> = {}) => closing(overrides, NOW - 10, { _tag: "Answering", until: NOW + 990 })
  row("we closed: the close frame goes out and the client may still answer (its acks are taken until then, or the close grace)", identified(), frame({ messageType: "hello" }), {
    phase: "Closing",
    close: "already-hello",
    check: (t) => assert.deepStrictEqual((t.phase as PhaseOf<"Closing">).stage, { _tag: "Answering", until: NOW + OPTIONS.closeGraceMs })
  })
  row("an ack before the client answered our close is taken: a direct message forgotten, a stored row to make a tombstone with the save", answering({
    unacked: new Map([["d1", direct(sent)], ["s1", stored(message({ version: "s1" }))], ["s2", stored(message({ version: "s2" }))]])
  }), frame({ messageType: "ack", updates: ["d1", "s1"].map((version) => ({ channelID: CHID, version, code: 100 })) }), {
    phase: "Closing",
    events: ["notification.acked.1", "notification.acked.1"],
    check: (t) => {
      assert.deepStrictEqual([sessionOf(t).unacked.has("d1"), sessionOf(t).unacked.has("s1"), sessionOf(t).unacked.has("s2")], [false, false, true])
      assert.deepStrictEqual(sessionOf(t).ackedRows.map((row) => row.notification.version), ["s1"])
    }
  })
  row("once the client answered (collecting), an ack is not taken any more", closing({ unacked: new Map([["d1", direct(sent)]]) }), frame({
    messageType: "ack",
    updates: [{ channelID: CHID, version: "d1", code: 100 }]
  }), { phase: "Closing", events: [], check: (t) => assert.isTrue(sessionOf(t).unacked.has("d1")) })
  row("the client answered our close: what it did not ack is saved next", answering(), { _tag: "SocketClosed" }, {
    phase: "Closing",
    check: (t) => assert.strictEqual((t.phase as PhaseOf<"Closing">).stage._tag, "Collecting")
  })
  row("a tick within the close grace: still answering", answering(), { _tag: "Tick" }, { phase: "Closing", check: (t) => assert.strictEqual((t.phase as PhaseOf<"Closing">).stage._tag, "Answering") })
  it("the close grace over, a tick moves on to the save; the deadline is the grace's end", () => {
    const waiting = answering()
    assert.strictEqual(deadline(waiting), NOW + 990)
    const t = step(waiting, { _tag: "Tick" }, NOW + 990)
    assert.strictEqual((t.phase as PhaseOf<"Closing">).stage._tag, "Collecting")
  })
  row("a delivery left in the mailbox is kept", closing(), { _tag: "Delivery", notification: sent }, {
    phase: "Closing",
    check: (t) => assert.isTrue(sessionOf(t).unacked.has("d1"))
  })
  const stageOf = (t: Transition) => (t.phase as PhaseOf<"Closing">).stage
  row("mailbox drained: unacked direct messages are saved into the session's table at the key their id names (never re-stamped)", closing({
    unacked: new Map([["d1", direct(sent)], ["s1", stored(message({ version: "s1" }))]])
  }), { _tag: "MailboxDrained" }, {
    phase: "Closing",
    command: { _tag: "SaveMessages", uaid: UAID, table: THIS_MONTH },
    check: (t) => {
      const command = t.command as Extract<Command, { _tag: "SaveMessages" }>
      assert.deepStrictEqual(command.messages.map((m) => [m.version, m.sortkeyTimestamp]), [["d1", sent.sortkeyTimestamp]])
      assert.strictEqual(stageOf(t)._tag, "Saving")
    }
  })
  row("a topic message is saved only if it is still its topic's newest: nothing to save, the node leaves the record", closing({
    unacked: new Map([["t1", direct(message({ version: "t1", topic: "a" }))]]),
    newestTopic: new Map([[`${CHID}:a`, message({ version: "t2", topic: "a" })]])
  }), { _tag: "MailboxDrained" }, {
    phase: "Closing",
    command: { _tag: "ClearNodeId", uaid: UAID, connectedAt: NOW - 1_000 }
  })
  row("mailbox drained: a stored topic message the client has since had a newer one of (TTL 0, never stored) is deleted as replaced", closing({
    unacked: new Map([["s1", stored(message({ version: "s1", topic: "a" }))]]),
    newestTopic: new Map([[`${CHID}:a`, message({ version: "t0", topic: "a" })]])
  }), { _tag: "MailboxDrained" }, {
    phase: "Closing",
    command: { _tag: "TombstoneAcked" },
    check: (t) => assert.deepStrictEqual((t.command as Extract<Command, { _tag: "TombstoneAcked" }>).messages.map((m) => m.notification.version), ["s1"])
  })
  row("mailbox drained: acked rows not tombstoned yet become tombstones first", closing({
    ackedRows: [stored(message({ version: "s0" }))],
    unacked: new Map([["d1", direct(sent)]])
  }), { _tag: "MailboxDrained" }, {
    phase: "Closing",
    command: { _tag: "TombstoneAcked" },
    check: (t) => {
      assert.deepStrictEqual((t.command as Extract<Command, { _tag: "TombstoneAcked" }>).messages.map((m) => m.notification.version), ["s0"])
      assert.strictEqual(stageOf(t)._tag, "TombstoningAcked")
    }
  })
  row("acked rows tombstoned: then the save", closing({}, NOW - 10, { _tag: "TombstoningAcked", messages: [sent], strays: [] }), { _tag: "AckedTombstoned" }, {
    phase: "Closing",
    command: { _tag: "SaveMessages", table: THIS_MONTH }
  })
  row("nothing was ever written (new uaid): ended at once", closing({ recorded: false }), { _tag: "MailboxDrained" }, {
    phase: "Closed",
    events: ["session.ended.1"]
  })
  row("the record is gone after the save (the user was dropped meanwhile): what was saved is taken back", closing({}, NOW - 10, { _tag: "ReadingAfter", table: THIS_MONTH, saved: [sent] }), {
    _tag: "UserRead",
    user: undefined
  }, {
    phase: "Closing",
    command: { _tag: "TakeMessage", uaid: UAID },
    check: (t) => {
      const command = t.command as Extract<Command, { _tag: "TakeMessage" }>
      assert.deepStrictEqual([command.row.table, command.row.notification.version], [THIS_MONTH, "d1"])
    }
  })
  row("taken back (or found gone) for a dropped user: the end, nothing stored", closing({}, NOW - 10, {
    _tag: "Taking",
    table: THIS_MONTH,
    then: { _tag: "Finish", after: undefined },
    saved: [],
    left: [stored(sent)],
    undo: []
  }), { _tag: "MessageTaken", taken: false }, { phase: "Closed", events: ["session.ended.1"], signals: [] })
  row("saved: this node leaves the record (the session's connected_at)", closing({}, NOW - 10, { _tag: "Saving", table: THIS_MONTH, strays: [] }), {
    _tag: "MessagesSaved",
    saved: [sent]
  }, { phase: "Closing", command: { _tag: "ClearNodeId", connectedAt: NOW - 1_000 } })
  row("the node stops: saved, the record is read again; the session does not leave it (the node leaves them all at once)", closing({}, NOW - 10, { _tag: "Saving", table: THIS_MONTH, strays: [] }, true), {
    _tag: "MessagesSaved",
    saved: [sent]
  }, { phase: "Closing", command: { _tag: "ReadUser" }, check: (t) => assert.strictEqual(stageOf(t)._tag, "ReadingAfter") })
  row("the node stops: nothing to save, the session ends without a storage call", closing({}, NOW - 10, { _tag: "Collecting" }, true), { _tag: "MailboxDrained" }, {
    phase: "Closed",
    events: ["session.ended.1"]
  })
  row("left the record: read again, to see whether the user moved", closing({}, NOW - 10, { _tag: "Clearing", table: THIS_MONTH, saved: [sent] }), {
    _tag: "NodeCleared"
  }, { phase: "Closing", command: { _tag: "ReadUser" } })
  row("left the record with nothing saved: the end", closing({}, NOW - 10, { _tag: "Clearing", table: undefined, saved: [] }), { _tag: "NodeCleared" }, {
    phase: "Closed",
    events: ["session.ended.1"]
  })
  row("the user stayed: a stored event each, then the end", closing({}, NOW - 10, { _tag: "ReadingAfter", table: THIS_MONTH, saved: [sent] }), {
    _tag: "UserRead",
    user: user({ nodeId: undefined })
  }, { phase: "Closed", events: ["notification.stored.1", "session.ended.1"], signals: [] })
  row("the user reconnected to another node meanwhile: that node is told to check storage", closing({}, NOW - 10, {
    _tag: "ReadingAfter",
    table: THIS_MONTH,
    saved: [sent]
  }), { _tag: "UserRead", user: user({ nodeId: "http://node-b:8081", connectedAt: NOW - 5 }) }, {
    phase: "Closed",
    signals: ["NotifyPeer"],
    events: ["notification.stored.1", "session.ended.1"]
  })
  row("the user moved to a new month meanwhile: what was saved is saved into the new month first", closing({}, NOW - 10, {
    _tag: "ReadingAfter",
    table: LAST_MONTH,
    saved: [sent]
  }), { _tag: "UserRead", user: user({ currentMonth: THIS_MONTH }) }, {
    phase: "Closing",
    command: { _tag: "SaveMessages", table: THIS_MONTH },
    check: (t) => assert.deepStrictEqual((t.command as Extract<Command, { _tag: "SaveMessages" }>).messages.map((m) => m.version), ["d1"])
  })
  const after = user({ nodeId: undefined, currentMonth: THIS_MONTH })
  row("saved into the new month: then taken out of the old one, one by one", closing({}, NOW - 10, {
    _tag: "Following",
    from: LAST_MONTH,
    to: THIS_MONTH,
    after,
    saved: [sent]
  }), { _tag: "MessagesSaved", saved: [sent] }, {
    phase: "Closing",
    command: { _tag: "TakeMessage" },
    check: (t) => {
      const command = t.command as Extract<Command, { _tag: "TakeMessage" }>
      assert.deepStrictEqual([command.row.table, command.row.notification.version], [LAST_MONTH, "d1"])
    }
  })
  const takingMoved: ClosingStage = {
    _tag: "Taking",
    table: THIS_MONTH,
    then: { _tag: "Finish", after },
    saved: [sent],
    left: [stored(sent, LAST_MONTH)],
    undo: []
  }
  row("a moved message taken out of the old month: the end", closing({}, NOW - 10, takingMoved), { _tag: "MessageTaken", taken: true }, {
    phase: "Closed",
    events: ["notification.stored.1", "session.ended.1"]
  })
  row("a moved message gone from the old month (read and acked there meanwhile): its copy is taken back out of the new month", closing({}, NOW - 10, takingMoved), {
    _tag: "MessageTaken",
    taken: false
  }, {
    phase: "Closing",
    command: { _tag: "TakeMessage" },
    check: (t) => {
      const command = t.command as Extract<Command, { _tag: "TakeMessage" }>
      assert.deepStrictEqual([command.row.table, command.row.notification.version], [THIS_MONTH, "d1"])
    }
  })
  row("its copy taken back: the end, nothing stored", closing({}, NOW - 10, { ...takingMoved, saved: [], left: [], undo: [sent] }), {
    _tag: "MessageTaken",
    taken: true
  }, { phase: "Closed", events: ["session.ended.1"] })
  row("mailbox drained after a month move: an unacked row read from last month's table is saved where the user lives", closing({
    unacked: new Map([["s1", stored(message({ version: "s1" }), LAST_MONTH)], ["s2", stored(message({ version: "s2" }))]])
  }), { _tag: "MailboxDrained" }, {
    phase: "Closing",
    command: { _tag: "SaveMessages", table: THIS_MONTH },
    check: (t) => {
      const stage = stageOf(t)
      const command = t.command as Extract<Command, { _tag: "SaveMessages" }>
      assert.deepStrictEqual([command.messages.map((m) => m.version), stage._tag === "Saving" ? stage.strays.map((r) => r.table) : []], [["s1"], [LAST_MONTH]])
    }
  })
  row("saved with the strays: each stray is then taken out of the table it was read from", closing({}, NOW - 10, {
    _tag: "Saving",
    table: THIS_MONTH,
    strays: [stored(message({ version: "s1" }), LAST_MONTH)]
  }), { _tag: "MessagesSaved", saved: [sent, message({ version: "s1" })] }, {
    phase: "Closing",
    command: { _tag: "TakeMessage" },
    check: (t) => {
      const command = t.command as Extract<Command, { _tag: "TakeMessage" }>
      assert.deepStrictEqual([command.row.table, command.row.notification.version], [LAST_MONTH, "s1"])
    }
  })
  row("mailbox drained: acked rows whose tombstoning failed and waits for its retry are tombstoned too", closing({
    ackedRows: [stored(message({ version: "s0" }))],
    retry: {
      at: NOW + 1_000,
      command: { _tag: "TombstoneAcked", uaid: UAID, messages: [stored(message({ version: "p1" }))], attempt: 1 }
    }
  }), { _tag: "MailboxDrained" }, {
    phase: "Closing",
    command: { _tag: "TombstoneAcked" },
    check: (t) => assert.deepStrictEqual((t.command as Extract<Command, { _tag: "TombstoneAcked" }>).messages.map((m) => m.notification.version), ["p1", "s0"])
  })
  const save: Command = { _tag: "SaveMessages", uaid: UAID, table: THIS_MONTH, messages: [sent], attempt: 0 }
  row("a step of the end failed: retried later", closing({}, NOW - 10, { _tag: "Saving", table: THIS_MONTH, strays: [] }), { _tag: "CommandFailed", command: save }, {
    phase: "Closing",
    check: (t) => assert.strictEqual(deadline(t.phase), NOW + OPTIONS.storageRetryMs)
  })
  row("failing for save_retry: given up, the session ends", closing({}, NOW - OPTIONS.saveRetryForMs, { _tag: "Saving", table: THIS_MONTH, strays: [] }), {
    _tag: "CommandFailed",
    command: save
  }, {
    phase: "Closed",
    events: ["session.ended.1"]
  })
})

describe("step: the sweep of a month move cut short by the close", () => {
  const stageOf = (t: Transition) => (t.phase as PhaseOf<"Closing">).stage
  const sweepOf = (t: Transition) => (t.phase as PhaseOf<"Closing">).sweep
  const sent = message({ version: "d1" })
  /** A closing session that was moving its user out of last month's table. */
  const sweeping = (stage: ClosingStage, overrides: Partial<Flat> = {}, moved: number | undefined = undefined): Phase => ({
    ...(closing(overrides, NOW - 10, stage) as PhaseOf<"Closing">),
    sweep: { from: LAST_MONTH, moved }
  })
  const cases: ReadonlyArray<readonly [string, Phase, string | undefined]> = [
    ["moving", moving(), LAST_MONTH],
    ["draining last month's table after the move", draining({ drain: newDrain(LAST_MONTH, THIS_MONTH) }), LAST_MONTH],
    ["draining this month's table", draining(), undefined],
    ["migrating (the record not pointed yet)", migrating(), undefined]
  ]
  for (const [name, phase, from] of cases) {
    row(`the client leaves while ${name}: ${from === undefined ? "no sweep" : "last month's table is swept"}`, phase, { _tag: "SocketClosed" }, {
      phase: "Closing",
      check: (t) => assert.deepStrictEqual(sweepOf(t), from === undefined ? undefined : { from, moved: undefined })
    })
  }
  row("mailbox drained with a sweep due: the record is read first", sweeping(COLLECTING, { unacked: new Map([["d1", direct(sent)]]) }), { _tag: "MailboxDrained" }, {
    phase: "Closing",
    command: { _tag: "ReadUser", uaid: UAID },
    check: (t) => assert.deepStrictEqual(stageOf(t), { _tag: "Sweeping", to: undefined, moved: 0, rows: [] })
  })
  row("the record still names last month's table: nothing to sweep (the next hello moves the user), the save goes on there", sweeping({ _tag: "Sweeping", to: undefined, moved: 0, rows: [] }, {
    table: LAST_MONTH,
    unacked: new Map([["d1", direct(sent)]])
  }), { _tag: "UserRead", user: user({ currentMonth: LAST_MONTH }) }, {
    phase: "Closing",
    command: { _tag: "SaveMessages", table: LAST_MONTH },
    check: (t) => assert.deepStrictEqual(sweepOf(t), { from: LAST_MONTH, moved: 0 })
  })
  row("the record names this month's table: last month's is read from its first row, past the rows the session holds", sweeping({ _tag: "Sweeping", to: undefined, moved: 0, rows: [] }, {
    table: LAST_MONTH,
    unacked: new Map([["s1", stored(message({ version: "s1" }), LAST_MONTH)]])
  }), { _tag: "UserRead", user: user({ currentMonth: THIS_MONTH }) }, {
    phase: "Closing",
    command: { _tag: "ReadPage", table: LAST_MONTH, rows: "first", limit: OPTIONS.pageSize + 1 },
    check: (t) => assert.deepStrictEqual([stageOf(t), sessionOf(t).table], [{ _tag: "Sweeping", to: THIS_MONTH, moved: 0, rows: [] }, THIS_MONTH])
  })
  const readOld: Extract<Command, { _tag: "ReadPage" }> = { _tag: "ReadPage", uaid: UAID, table: LAST_MONTH, rows: "first", after: undefined, limit: 11, attempt: 0 }
  row("a page of last month's table: the rows the session does not hold are saved into the record's table", sweeping({ _tag: "Sweeping", to: THIS_MONTH, moved: 0, rows: [] }, {
    unacked: new Map([["s1", stored(message({ version: "s1" }), LAST_MONTH)]]),
    ackedRows: [stored(message({ version: "a1" }), LAST_MONTH)]
  }), { _tag: "PageRead", command: readOld, messages: [message({ version: "s1" }), message({ version: "a1" }), message({ version: "e1" })], lastSortKey: undefined, more: false }, {
    phase: "Closing",
    command: { _tag: "SaveMessages", table: THIS_MONTH },
    check: (t) => {
      assert.deepStrictEqual((t.command as Extract<Command, { _tag: "SaveMessages" }>).messages.map((m) => m.version), ["e1"])
      assert.deepStrictEqual(stageOf(t), { _tag: "Sweeping", to: THIS_MONTH, moved: 0, rows: [message({ version: "e1" })] })
    }
  })
  row("the swept rows saved: each is taken out of last month's table, also one the save left out (replaced or cancelled there)", sweeping({
    _tag: "Sweeping",
    to: THIS_MONTH,
    moved: 0,
    rows: [message({ version: "e1" }), message({ version: "r1", topic: "a" })]
  }), { _tag: "MessagesSaved", saved: [message({ version: "e1" })] }, {
    phase: "Closing",
    command: { _tag: "TakeMessage" },
    check: (t) => {
      const command = t.command as Extract<Command, { _tag: "TakeMessage" }>
      const stage = stageOf(t)
      assert.deepStrictEqual([command.row.table, command.row.notification.version], [LAST_MONTH, "e1"])
      assert.deepStrictEqual(stage._tag === "Taking" ? stage.left.map((row) => [row.table, row.notification.version]) : [], [[LAST_MONTH, "e1"], [LAST_MONTH, "r1"]])
    }
  })
  row("the page's rows taken out: the next page is read", sweeping({
    _tag: "Taking",
    table: THIS_MONTH,
    then: { _tag: "Sweep", moved: 0 },
    saved: [message({ version: "e1" })],
    left: [stored(message({ version: "e1" }), LAST_MONTH)],
    undo: []
  }), { _tag: "MessageTaken", taken: true }, {
    phase: "Closing",
    command: { _tag: "ReadPage", table: LAST_MONTH, rows: "first" },
    check: (t) => assert.deepStrictEqual(stageOf(t), { _tag: "Sweeping", to: THIS_MONTH, moved: 1, rows: [] })
  })
  row("an empty page: the sweep is done; nothing else to save, the node leaves the record, which is read again then", sweeping({ _tag: "Sweeping", to: THIS_MONTH, moved: 1, rows: [] }), {
    _tag: "PageRead",
    command: readOld,
    messages: [],
    lastSortKey: undefined,
    more: false
  }, {
    phase: "Closing",
    command: { _tag: "ClearNodeId" },
    check: (t) => assert.deepStrictEqual([stageOf(t), sweepOf(t)], [{ _tag: "Clearing", table: THIS_MONTH, saved: [] }, { from: LAST_MONTH, moved: 1 }])
  })
  row("read again after a sweep with nothing saved: a session of the user elsewhere is told to check storage", sweeping({ _tag: "ReadingAfter", table: THIS_MONTH, saved: [] }, {}, 1), {
    _tag: "UserRead",
    user: user({ nodeId: "http://node-b:8081", connectedAt: NOW - 5, currentMonth: THIS_MONTH })
  }, { phase: "Closed", signals: ["NotifyPeer"], events: ["session.ended.1"] })
  row("a sweep's read failed: retried later", sweeping({ _tag: "Sweeping", to: THIS_MONTH, moved: 0, rows: [] }), { _tag: "CommandFailed", command: readOld }, {
    phase: "Closing",
    check: (t) => assert.deepStrictEqual([deadline(t.phase), (t.phase as PhaseOf<"Closing">).retry?.command._tag], [NOW + OPTIONS.storageRetryMs, "ReadPage"])
  })
})

describe("step: what every live phase does alike", () => {
  const phases: ReadonlyArray<Phase> = [identified(), draining(), migrating(), moving()]
  for (const phase of phases) {
    const tag = phase._tag
    row(`${tag}: a second hello closes AlreadyHello`, phase, frame({ messageType: "hello" }), { phase: "Closing", close: "already-hello" })
    row(`${tag}: nack is an event`, phase, frame({ messageType: "nack", version: "v", code: 302 }), { phase: tag, events: ["notification.nacked.1"] })
    row(`${tag}: ping answered {}`, phase, frame({ messageType: "ping" }), { phase: tag, frames: [{}] })
    row(`${tag}: broadcast_subscribe of nothing new: no reply`, phase, frame({ messageType: "broadcast_subscribe", broadcasts: {} }), { phase: tag, frames: [] })
    row(`${tag}: urgency is kept in the record`, phase, frame({ messageType: "urgency", min: "high" }), { phase: tag, command: { _tag: "WriteUrgency", min: "high" } })
    row(`${tag}: a bad frame closes Json`, phase, { _tag: "BadFrame", detail: "x" }, { phase: "Closing", close: "invalid-json" })
    row(`${tag}: a binary frame closes UnsupportedMessage`, phase, { _tag: "BinaryFrame" }, { phase: "Closing", close: "binary-frame" })
    row(`${tag}: a pong restarts the keepalive`, { ...phase, session: session({ pingSentAt: NOW - 5 }) } as Phase, { _tag: "Pong" }, {
      phase: tag,
      check: (t) => assert.isUndefined(sessionOf(t).pingSentAt)
    })
    row(`${tag}: a delivery goes out`, phase, { _tag: "Delivery", notification: message() }, { phase: tag, events: ["notification.delivered.1"] })
    row(`${tag}: a tick past auto_ping_interval pings`, phase, { _tag: "Tick" }, { phase: tag, signals: ["Ping"] }, NOW - 1_000 + OPTIONS.autoPingIntervalMs)
    row(`${tag}: a kick closes; the node's shutdown leaves the record to the node`, phase, { _tag: "Kick", kind: "shutdown" }, {
      phase: "Closing",
      close: "shutdown",
      check: (t) => assert.isTrue(t.phase._tag === "Closing" && t.phase.nodeStops)
    })
    row(`${tag}: another node's kick closes; the session leaves the record itself`, phase, { _tag: "Kick", kind: "already-connected" }, {
      phase: "Closing",
      close: "already-connected",
      check: (t) => assert.isTrue(t.phase._tag === "Closing" && !t.phase.nodeStops)
    })
    row(`${tag}: the socket closing: saving begins`, phase, { _tag: "SocketClosed" }, { phase: "Closing", check: (t) => assert.isTrue(t.phase._tag === "Closing" && !t.phase.nodeStops) })
    row(`${tag}: acking a direct message forgets it`, { ...phase, session: session({ unacked: new Map([["v1", direct(message())]]) }) } as Phase, frame({
      messageType: "ack",
      updates: [{ channelID: CHID, version: "v1" }]
    }), {
      phase: tag,
      events: ["notification.acked.1"],
      // A reading phase with nothing stored outstanding reads its next page.
      ...(tag === "Draining" || tag === "Migrating" ? { command: { _tag: "ReadPage" } as const } : {}),
      check: (t) => assert.strictEqual(sessionOf(t).unacked.size, 0)
    })
    row(`${tag}: a failed tombstoning is retried`, phase, {
      _tag: "CommandFailed",
      command: { _tag: "TombstoneAcked", uaid: UAID, messages: [], attempt: 0 }
    }, { phase: tag, check: (t) => assert.strictEqual(sessionOf(t).retry?.at, NOW + OPTIONS.storageRetryMs) })
  }
  const registering = { channelId: CHID, endpoint: "http://e/wpush/v1/t" }
  for (const phase of [identified(), draining()]) {
    const tag = phase._tag
    row(`${tag}: unregister removes the channel`, phase, frame({ messageType: "unregister", channelID: CHID }), { phase: tag, command: { _tag: "RemoveChannel" } })
    row(`${tag}: endpoint made: the channel is added`, phase, {
      _tag: "EndpointMade",
      command: { _tag: "MakeEndpoint", uaid: UAID, channelId: CHID, rawKey: undefined },
      endpoint: registering.endpoint
    }, { phase: tag, command: { _tag: "AddChannel" } })
    row(`${tag}: a new uaid's record written: the channel is added`, { ...phase, session: session({ recorded: false }) } as Phase, {
      _tag: "UserWritten",
      command: { _tag: "WriteUser", user: user(), purpose: { _tag: "Register", registering } },
      written: true
    }, { phase: tag, command: { _tag: "AddChannel" } })
    row(`${tag}: channel added: 200`, phase, { _tag: "ChannelAdded", registering, added: true }, { phase: tag, events: ["channel.registered.1"] })
    row(`${tag}: channel removed: 200`, phase, {
      _tag: "ChannelRemoved",
      command: { _tag: "RemoveChannel", uaid: UAID, table: THIS_MONTH, channelId: CHID, code: undefined }
    }, { phase: tag, events: ["channel.unregistered.1"] })
  }
  row("Moving: unregister waits for the move", moving(), frame({ messageType: "unregister", channelID: CHID }), {
    phase: "Moving",
    check: (t) => assert.strictEqual((t.phase as PhaseOf<"Moving">).deferred.length, 1)
  })
  row("Migrating: a poke mid-drain: go again afterwards", migrating({ unacked: new Map([["v1", stored(message(), LAST_MONTH)]]) }), { _tag: "CheckStorage" }, {
    phase: "Migrating",
    check: (t) => assert.isTrue(sessionOf(t).drain?.again)
  })
  row("Migrating: rows deleted, the old table read on", migrating(), { _tag: "AckedTombstoned" }, { phase: "Migrating", command: { _tag: "ReadPage", table: LAST_MONTH } })
  row("Migrating: dropped for too many messages: close 1000", migrating(), { _tag: "UserDropped", dropped: true }, { phase: "Closing", close: "uaid-reset" })
  row("Rechecking: storage failing closes StorageError", rechecking, { _tag: "CommandFailed", command: { _tag: "ReadUser", uaid: UAID, attempt: 0 } }, {
    phase: "Closed",
    close: "storage-error"
  })
  row("Closing: a retried save that is due runs again", {
    ...(closing() as PhaseOf<"Closing">),
    retry: { command: { _tag: "SaveMessages", uaid: UAID, table: THIS_MONTH, messages: [], attempt: 1 }, at: NOW }
  }, { _tag: "Tick" }, { phase: "Closing", command: { _tag: "SaveMessages", attempt: 1 } })
})

describe("step: the client's minimum urgency (RFC 8030 §5.3)", () => {
  const written = (min: Urgency): Input => ({ _tag: "UrgencyWritten", command: { _tag: "WriteUrgency", uaid: UAID, min } })
  row("urgency: kept in the router record first", identified(), frame({ messageType: "urgency", min: "high" }), {
    phase: "Identified",
    frames: [],
    command: { _tag: "WriteUrgency", uaid: UAID, min: "high" }
  })
  row("urgency of a new uaid (no record yet): taken at once, written with the record", identified({ recorded: false }), frame({ messageType: "urgency", min: "low" }), {
    phase: "Identified",
    frames: [{ messageType: "urgency", status: 200 }],
    events: ["client.urgency.1"],
    check: (t) => assert.strictEqual(sessionOf(t).minUrgency, "low")
  })
  row("urgency that is not one of RFC 8030's four: 400, the socket kept", identified(), frame({ messageType: "urgency", min: "urgent" }), {
    phase: "Identified",
    frames: [{ messageType: "urgency", status: 400 }]
  })
  row("written: answered 200, the session takes it", identified(), written("high"), {
    phase: "Identified",
    frames: [{ messageType: "urgency", status: 200 }],
    events: ["client.urgency.1"],
    check: (t) => assert.strictEqual(sessionOf(t).minUrgency, "high")
  })
  row("lowered: what was held in storage is read again", identified({ minUrgency: "high" }), written("low"), {
    phase: "Draining",
    command: { _tag: "ReadPage", rows: "first" }
  })
  row("lowered mid-drain: read again once this pass ends", draining({ minUrgency: "high", unacked: new Map([["v1", stored(message())]]) }), written("very-low"), {
    phase: "Draining",
    check: (t) => assert.isTrue(sessionOf(t).drain?.again)
  })
  row("lowered while migrating: the same", migrating({ minUrgency: "high", unacked: new Map([["v1", stored(message(), LAST_MONTH)]]) }), written("normal"), {
    phase: "Migrating",
    check: (t) => assert.isTrue(sessionOf(t).drain?.again)
  })
  row("while moving: taken; both months are drained once moved", moving(), written("high"), { phase: "Moving", frames: [{ messageType: "urgency", status: 200 }] })
  row("the record could not be written: 500", identified(), { _tag: "CommandFailed", command: { _tag: "WriteUrgency", uaid: UAID, min: "high" } }, {
    phase: "Identified",
    frames: [{ messageType: "urgency", status: 500 }]
  })
  row("a page: messages less urgent than the client wants stay stored, the rest are sent", draining({
    minUrgency: "normal",
    drain: { tables: [THIS_MONTH], rows: "timestamp", after: undefined, again: false, poked: false, backlog: 0, backlogByChannel: new Map() }
  }), {
    _tag: "PageRead",
    command: { _tag: "ReadPage", uaid: UAID, table: THIS_MONTH, rows: "timestamp", after: undefined, limit: 10, attempt: 0 },
    messages: [message({ version: "low", urgency: "low" }), message({ version: "plain" }), message({ version: "high", urgency: "high" })],
    lastSortKey: NOW - 1_000,
    more: false
  }, {
    phase: "Draining",
    check: (t) => {
      assert.deepStrictEqual(t.frames.map((f) => JSON.parse(f).version), ["plain", "high"])
      assert.strictEqual(sessionOf(t).drain?.backlog, 2, "held messages do not count towards msg_limit")
    }
  })
  for (const phase of [draining(), migrating()]) {
    row(`${phase._tag}: urgency written`, phase, written("low"), { phase: phase._tag, events: ["client.urgency.1"] })
  }
})

describe("step: invariants of the table", () => {
  it("Closed ignores everything", () => {
    const t = step({ _tag: "Closed" }, frame({ messageType: "hello" }), NOW)
    assert.deepStrictEqual([t.phase._tag, t.frames, t.events, t.close], ["Closed", [], [], undefined])
  })
  it("a command result the phase did not ask for is a bug", () => {
    assert.throws(() => step(awaiting, { _tag: "PageRead", command: {} as never, messages: [], lastSortKey: undefined, more: false }, NOW))
  })
  it("phases are values: a step leaves its input phase as it was", () => {
    /** A phase as plain data: ledgers as what they hold, not how they hold it. */
    const plain = (value: unknown): unknown =>
      value instanceof Ledger ? value.values().map(plain)
      : Array.isArray(value) ? value.map(plain)
      : typeof value === "object" && value !== null ? Object.fromEntries(Object.entries(value).map(([k, v]) => [k, plain(v)]))
      : value
    const before = identified({
      unacked: new Map([["v0", direct(message({ version: "v0", topic: "a" }))]]),
      newestTopic: new Map([[`${CHID}:a`, message({ version: "v0", topic: "a" })]])
    })
    const copy = structuredClone(plain(before))
    const delivered = step(before, { _tag: "Delivery", notification: message({ version: "v1", topic: "b" }) }, NOW)
    const acked = step(delivered.phase, frame({ messageType: "ack", updates: [{ channelID: CHID, version: "v0" }] }), NOW)
    step(before, frame({ messageType: "register", channelID: CHID }), NOW)
    assert.deepStrictEqual(plain(before), copy)
    // Each phase reads as it was made, whichever was read last.
    assert.deepStrictEqual(sessionOf(acked).unacked.size, 1)
    assert.isTrue(sessionOf(acked).unacked.has("v1"))
    assert.isFalse(sessionOf(delivered).unacked.has("v2"))
    assert.isTrue(sessionOf(delivered).unacked.has("v0"))
    assert.deepStrictEqual(plain(before), copy)
  })
  it("every cell of the table has a row above (this file's rows run first)", () => {
    const cells = Object.entries(TRANSITIONS).flatMap(([phase, row]) => Object.keys(row).map((kind) => `${phase} ${kind}`))
    assert.deepStrictEqual(cells.filter((cell) => !covered.has(cell)), [])
  })
})
