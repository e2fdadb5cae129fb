/**
 * The WebSocket push protocol as data (DESIGN.md §3): the phases of a connection, the inputs that
 * reach it, and one pure `step(phase, input, now)` that decides everything — the next phase, the
 * frames to send, the domain events, the effects to run and whether to close. The session fiber
 * (`session.ts`) only interprets what `step` returns: it sends frames, records events, runs effects
 * and feeds the result of a `command` back as the next input, before anything from the mailbox.
 *
 * `step` takes ownership of nothing: phases are immutable values, every transition builds new ones.
 * The transitions are the table `TRANSITIONS` (phase × input kind) at the end of this file; an input
 * a phase does not list is ignored, except command results, which can only answer a command the
 * phase issued (an unexpected one is a bug and throws).
 *
 * Delivery rules (protocol-notes §1.5, §1.8 with the decisions of §0):
 * - stored messages are drained after hello and after every check-storage poke, a page at a time
 *   (topic messages, then timestamp order); the next page is read once the previous one is acked and
 *   its rows deleted;
 * - an acked stored message is deleted (conditionally on its version, so a newer message that replaced
 *   a topic is kept); an acked direct message is just forgotten;
 * - unacked direct messages are saved to storage when the session ends;
 * - more than `msgLimit` messages from storage in one drain → the client gets the first `msgLimit`,
 *   then (once they are acked) the user is dropped and the socket closed 1000;
 * - storage failures inside a session never close it: reads, deletes and the month move are retried
 *   with backoff; a register or unregister that fails is answered with status 500.
 */
import type { ClientMessage } from "./messages.ts"
import { broadcastFrame, helloReply, notificationFrame, PING_REPLY, registerReply, unregisterReply } from "./messages.ts"
import { closeFrame, type CloseKind } from "./close.ts"
import { domainEvent, type DomainEvent, type DomainEventType, type EventData } from "../domain/events.ts"
import { isCanonicalChannelId, parseChannelId, parseUaid } from "../domain/ids.ts"
import { memoize } from "../domain/memo.ts"
import { isExpired, type Notification } from "../domain/notification.ts"
import { USER_RECORD_VERSION, type UserRecord } from "../domain/user.ts"
import { activeTableNames, currentTableName } from "../storage/tables.ts"

// ── options ─────────────────────────────────────────────────────────────────────────────────────

export interface ProtocolOptions {
  /** This node's router URL: the `node_id` written to router records. */
  readonly routerUrl: string
  readonly helloTimeoutMs: number
  readonly autoPingIntervalMs: number
  readonly autoPingTimeoutMs: number
  readonly minPingIntervalMs: number
  readonly msgLimit: number
  /** Messages per storage page (RS: 10). */
  readonly pageSize: number
  /** Message tables: `{prefix}_{YYYY}_{MM}`, or exactly `{prefix}` without rotation. */
  readonly messageTablePrefix: string
  readonly noTableRotation: boolean
  /** Channels a user may have; a register beyond it is answered with status 413. */
  readonly maxChannels: number
  /** Commands (register, unregister, nack, broadcast_subscribe) a client may send per second… */
  readonly commandsPerSecond: number
  /** …and in a burst; beyond it its commands wait (and its socket is not read while many wait). */
  readonly commandBurst: number
  /** First retry of a failed storage read, delete or month move; doubles up to `storageRetryMaxMs`. */
  readonly storageRetryMs: number
  readonly storageRetryMaxMs: number
  /** How long a session that ended keeps trying to save its unacked messages. */
  readonly saveRetryForMs: number
}

/** Commands waiting for a client beyond which the socket is paused (back-pressure on reading). */
export const HELD_COMMANDS_MAX = 32

/** The node's broadcasts (id → version) as of a step; a new map whenever they change. */
export type BroadcastSet = ReadonlyMap<string, string>

/** Broadcast ids of one client message that are looked at; the rest are ignored. */
export const BROADCASTS_PER_MESSAGE = 100
/** Longer ids cannot name a broadcast (the admin API refuses them): ignored, not echoed. */
export const BROADCAST_ID_MAX = 128

const NO_BROADCASTS: BroadcastSet = new Map()

// ── phases ──────────────────────────────────────────────────────────────────────────────────────

/** A message sent and not yet acked; `table` is where a stored one came from (undefined: direct). */
export interface Unacked {
  readonly notification: Notification
  readonly table: string | undefined
}

/** Where the storage drain is: tables still to read, topic or timestamp rows, position. */
export interface Drain {
  readonly tables: ReadonlyArray<string>
  /** What to read next in `tables[0]`; `read`: every row of it is sent (the last page was not full). */
  readonly rows: "topic" | "timestamp" | "read"
  /** Sort key (ms) of the last timestamp row read in `tables[0]`. */
  readonly after: number | undefined
  /** A poke arrived mid-drain: start over once this pass ends (a message may sit behind `after`). */
  readonly again: boolean
  /**
   * Messages read from storage in this drain (the `msg_limit` count). Past `msgLimit`, only the first
   * `msgLimit` were sent: once they are acked the user is dropped.
   */
  readonly sent: number
}

/** A failed command waiting for its next attempt. */
export interface Retry {
  readonly command: RetriedCommand
  readonly at: number
}

/** Everything an identified connection knows. */
export interface Session {
  readonly uaid: string
  /** When this session said hello (ms): the router record's `connected_at`. */
  readonly connectedAt: number
  /** The message table the user lives in (while migrating: the old month). */
  readonly table: string
  /** The router record, once written (a new uaid has none until its first register). */
  readonly user: UserRecord | undefined
  readonly unacked: ReadonlyMap<string, Unacked>
  /**
   * Stored timestamp messages the client acked whose rows are not deleted yet: they are deleted
   * together once no stored message is outstanding (a page at a time), or when the session ends.
   * (A timestamp row is never rewritten, and pages are read after the last row read, so nothing
   * acked is read again meanwhile; topic rows are deleted at once, on their version.)
   */
  readonly ackedRows: ReadonlyArray<Unacked>
  /** The last version sent per `chid:topic`: an older unacked topic message must not be saved over it. */
  readonly newestTopic: ReadonlyMap<string, string>
  readonly drain: Drain | undefined
  readonly retry: Retry | undefined
  readonly lastActivity: number
  /** When our keepalive ping went out, while its pong is awaited. */
  readonly pingSentAt: number | undefined
  readonly lastClientPing: number | undefined
  /** Command budget (token bucket) as of `tokensAt`, and commands waiting for it, in order. */
  readonly tokens: number
  readonly tokensAt: number
  readonly held: ReadonlyArray<ClientMessage>
  readonly readingPaused: boolean
  /**
   * Broadcasts the client follows, flat: id, version it has, id, version, … — the strings are the
   * node set's own (shared by every session), so a subscription costs two references.
   */
  readonly broadcasts: ReadonlyArray<string>
}

export type Phase =
  /** Socket open, no hello yet. */
  | { readonly _tag: "AwaitingHello"; readonly openedAt: number }
  /**
   * Hello received: the uaid it claims is being resumed (its router record read and re-claimed), or a
   * new one minted; the broadcasts it asked for are answered once the uaid is known.
   */
  | {
    readonly _tag: "Identifying"
    readonly openedAt: number
    readonly claimed: string | undefined
    /** The resume write lost: the record is read once more to tell why. */
    readonly rechecking: boolean
    readonly broadcasts: Readonly<Record<string, string>> | undefined
  }
  | { readonly _tag: "Identified"; readonly session: Session }
  /**
   * Draining last month's table before moving the user to this month's: register and unregister wait
   * in `deferred` (at most `HELD_COMMANDS_MAX`), then go through the command budget.
   */
  | { readonly _tag: "Migrating"; readonly session: Session; readonly deferred: ReadonlyArray<ClientMessage> }
  /** The socket is gone: saving what is unacked. `reason` is the close reason, or `client`. */
  | {
    readonly _tag: "Closing"
    readonly session: Session
    readonly reason: string
    readonly since: number
    readonly retry: Retry | undefined
  }
  | { readonly _tag: "Closed" }

export type PhaseTag = Phase["_tag"]
type PhaseOf<T extends PhaseTag> = Extract<Phase, { readonly _tag: T }>
type Live = PhaseOf<"Identified" | "Migrating">

// ── inputs ──────────────────────────────────────────────────────────────────────────────────────

/** What the mailbox carries: from the socket and from the node. */
export type SessionEvent =
  /** `admitted`: a command that already passed the command budget (held and released). */
  | { readonly _tag: "Frame"; readonly message: ClientMessage; readonly admitted?: boolean }
  | { readonly _tag: "BadFrame"; readonly detail: string }
  | { readonly _tag: "BinaryFrame" }
  | { readonly _tag: "Pong" }
  | { readonly _tag: "SocketClosed" }
  | { readonly _tag: "Delivery"; readonly notification: Notification }
  | { readonly _tag: "CheckStorage" }
  | { readonly _tag: "Tick" }
  | { readonly _tag: "Kick"; readonly kind: CloseKind }

/** Storage and crypto work whose result is the next input. */
export type Command =
  | { readonly _tag: "MintUaid" }
  | { readonly _tag: "ReadUser"; readonly uaid: string }
  /**
   * Write the router record, unless a newer one exists: to resume a claimed uaid (only if its record
   * still exists: a user dropped meanwhile stays dropped), or at a new uaid's first register.
   */
  | { readonly _tag: "WriteUser"; readonly user: UserRecord; readonly purpose: Resume | Register }
  | { readonly _tag: "MakeEndpoint"; readonly uaid: string; readonly channelId: string; readonly key: string | undefined }
  | { readonly _tag: "AddChannel"; readonly uaid: string; readonly table: string; readonly registering: Registering }
  | { readonly _tag: "RemoveChannel"; readonly uaid: string; readonly table: string; readonly channelId: string; readonly code: number | undefined }
  | RetriedCommand

/** Commands retried with backoff when storage fails. */
export type RetriedCommand =
  | {
    readonly _tag: "ReadPage"
    readonly uaid: string
    readonly table: string
    readonly rows: "topic" | "timestamp"
    readonly after: number | undefined
    readonly limit: number
    readonly attempt: number
  }
  | { readonly _tag: "DeleteMessages"; readonly uaid: string; readonly messages: ReadonlyArray<Unacked>; readonly attempt: number }
  | { readonly _tag: "MoveMonth"; readonly uaid: string; readonly from: string; readonly to: string; readonly attempt: number }
  /** The session ended: save these, clear our node id, poke the user's new node if it moved. */
  | {
    readonly _tag: "SaveUnacked"
    readonly uaid: string
    readonly connectedAt: number
    readonly table: string
    readonly messages: ReadonlyArray<Notification>
    /** Acked stored rows still to delete. */
    readonly acked: ReadonlyArray<Unacked>
    readonly attempt: number
  }
  /** Drop the user, unless its record was re-claimed since (its `connectedAt` changed). */
  | {
    readonly _tag: "DropUser"
    readonly uaid: string
    readonly connectedAt: number
    readonly reason: "stale_month" | "too_many_messages"
    readonly attempt: number
  }

/** A register in progress: the channel, and its endpoint once made. */
export interface Registering {
  readonly channelId: string
  readonly endpoint: string
}

interface Resume {
  readonly _tag: "Resume"
  /** The record as read: the node it names is told to drop its stale session. */
  readonly previous: UserRecord
}

interface Register {
  readonly _tag: "Register"
  readonly registering: Registering
}

/** The result of a command: the next input. */
export type CommandResult =
  | { readonly _tag: "UaidMinted"; readonly uaid: string }
  | { readonly _tag: "UserRead"; readonly user: UserRecord | undefined }
  | { readonly _tag: "UserWritten"; readonly command: Extract<Command, { _tag: "WriteUser" }>; readonly written: boolean }
  /** `dropped` false: another session re-claimed the user first. */
  | { readonly _tag: "UserDropped"; readonly dropped: boolean }
  | { readonly _tag: "EndpointMade"; readonly command: Extract<Command, { _tag: "MakeEndpoint" }>; readonly endpoint: string | undefined }
  /** `added` false: the user has `maxChannels` channels already. */
  | { readonly _tag: "ChannelAdded"; readonly registering: Registering; readonly added: boolean }
  | { readonly _tag: "ChannelRemoved"; readonly command: Extract<Command, { _tag: "RemoveChannel" }> }
  | {
    readonly _tag: "PageRead"
    readonly command: Extract<Command, { _tag: "ReadPage" }>
    readonly messages: ReadonlyArray<Notification>
    /** Timestamp pages: sort key of the last row read, expired or not. */
    readonly lastSortKey: number | undefined
    /** Timestamp pages: rows after this page may exist (it was full). */
    readonly more: boolean
  }
  | { readonly _tag: "MessagesDeleted" }
  | { readonly _tag: "MonthMoved"; readonly command: Extract<Command, { _tag: "MoveMonth" }> }
  | { readonly _tag: "UnackedSaved"; readonly saved: ReadonlyArray<Notification> }
  | { readonly _tag: "CommandFailed"; readonly command: Command }

/** After a close: the mailbox is shut and its leftover deliveries were handed over. */
export type Ended = { readonly _tag: "MailboxDrained" }

export type Input = SessionEvent | CommandResult | Ended

/** Fire-and-forget effects, run in order before the command. */
export type Signal =
  /** A WebSocket ping frame (keepalive). */
  | { readonly _tag: "Ping" }
  /** Become the uaid's live session on this node (the older one is kicked). */
  | { readonly _tag: "Claim"; readonly uaid: string; readonly connectedAt: number }
  /** Tell another node to drop its stale session of this uaid. */
  | { readonly _tag: "DisconnectPeer"; readonly nodeId: string; readonly uaid: string; readonly connectedAt: number }
  /**
   * Feed these client messages again, before the mailbox: held commands the budget now admits
   * (`admitted`), or commands deferred by a month move (through the budget now).
   */
  | { readonly _tag: "Replay"; readonly messages: ReadonlyArray<ClientMessage>; readonly admitted: boolean }
  | { readonly _tag: "PauseReading" }
  | { readonly _tag: "ResumeReading" }

export interface Transition {
  readonly phase: Phase
  readonly frames: ReadonlyArray<string>
  readonly events: ReadonlyArray<DomainEvent>
  readonly effects: ReadonlyArray<Signal>
  /** At most one command per transition: its result is the next input. */
  readonly command: Command | undefined
  readonly close: CloseKind | undefined
}

// ── the output of one transition, collected while it is decided ─────────────────────────────────

class Out {
  readonly frames: Array<string> = []
  readonly events: Array<DomainEvent> = []
  readonly effects: Array<Signal> = []
  command: Command | undefined = undefined
  close: CloseKind | undefined = undefined
  readonly now: number
  readonly o: ProtocolOptions
  /** The node's broadcasts as of this step. */
  readonly broadcasts: BroadcastSet

  constructor(now: number, options: ProtocolOptions, broadcasts: BroadcastSet) {
    this.now = now
    this.o = options
    this.broadcasts = broadcasts
  }

  frame(text: string): void {
    this.frames.push(text)
  }

  event<T extends DomainEventType>(type: T, uaid: string, data: EventData<T>): void {
    this.events.push(domainEvent(type, uaid, this.now, data))
  }

  run(command: Command): void {
    if (this.command !== undefined) throw new Error(`two commands in one transition: ${this.command._tag}, ${command._tag}`)
    this.command = command
  }

  signal(effect: Signal): void {
    this.effects.push(effect)
  }

  done(phase: Phase): Transition {
    return { phase, frames: this.frames, events: this.events, effects: this.effects, command: this.command, close: this.close }
  }
}

// ── helpers over sessions ───────────────────────────────────────────────────────────────────────

const EMPTY_UNACKED: ReadonlyMap<string, Unacked> = new Map()
const EMPTY_TOPICS: ReadonlyMap<string, string> = new Map()
const NOTHING: ReadonlyArray<never> = []

/** Table names as one string each: every session keeps its table's, built afresh or read from storage. */
const tableName = memoize(16, (name) => name)

const currentTable = (o: ProtocolOptions, now: number): string =>
  tableName(currentTableName({ routerTable: "", messageTablePrefix: o.messageTablePrefix, noTableRotation: o.noTableRotation }, now))

const activeTables = (o: ProtocolOptions, now: number): ReadonlyArray<string> =>
  activeTableNames({ routerTable: "", messageTablePrefix: o.messageTablePrefix, noTableRotation: o.noTableRotation }, now)

const storedOutstanding = (s: Session): number => {
  let n = 0
  for (const entry of s.unacked.values()) if (entry.table !== undefined) n++
  return n
}

const withSession = <P extends Live>(phase: P, session: Session): P => ({ ...phase, session })

const backoff = (o: ProtocolOptions, attempt: number): number => Math.min(o.storageRetryMaxMs, o.storageRetryMs * 2 ** attempt)

/** Track a message until it is acked. TTL 0 direct messages are fire-and-forget: nothing to save. */
const remember = (s: Session, n: Notification, table: string | undefined): Session => {
  const tracked = table !== undefined || n.ttl > 0
  const unacked = tracked ? new Map(s.unacked).set(n.version, { notification: n, table }) : s.unacked
  const newestTopic = n.topic === undefined ? s.newestTopic : new Map(s.newestTopic).set(`${n.channelId}:${n.topic}`, n.version)
  return { ...s, unacked, newestTopic }
}

/** Send one notification frame and track it. */
const send = (s: Session, n: Notification, table: string | undefined, out: Out): Session => {
  out.frame(notificationFrame(n))
  out.event("notification.delivered.1", s.uaid, {
    channelId: n.channelId,
    version: n.version,
    source: table === undefined ? "direct" : "stored",
    ...(n.traceparent === undefined ? {} : { traceparent: n.traceparent })
  })
  return remember(s, n, table)
}

const closeNow = (phase: Phase, kind: CloseKind, out: Out): Phase => {
  out.close = kind
  if (phase._tag !== "Identified" && phase._tag !== "Migrating") return { _tag: "Closed" }
  const { code, reason } = closeFrame(kind)
  out.event("session.closed.1", phase.session.uaid, { code, reason })
  return { _tag: "Closing", session: phase.session, reason, since: out.now, retry: undefined }
}

const closeWith = (kind: CloseKind) => (phase: Phase, _input: unknown, out: Out): Phase => closeNow(phase, kind, out)

// ── hello ───────────────────────────────────────────────────────────────────────────────────────

const hello = (phase: PhaseOf<"AwaitingHello">, message: HelloMessage, out: Out): Phase => {
  const claimed = typeof message.uaid === "string" ? parseUaid(message.uaid) : undefined
  out.run(claimed === undefined ? { _tag: "MintUaid" } : { _tag: "ReadUser", uaid: claimed })
  return { _tag: "Identifying", openedAt: phase.openedAt, claimed, rechecking: false, broadcasts: message.broadcasts }
}

/** The claimed uaid's record: resume it, or give a new uaid (the seed: a stale month starts over). */
const userRead = (phase: PhaseOf<"Identifying">, { user }: { readonly user: UserRecord | undefined }, out: Out): Phase => {
  if (user === undefined || user.routerType !== "webpush") {
    out.run({ _tag: "MintUaid" })
    return phase
  }
  if (phase.rechecking || user.connectedAt > out.now) return closeNow(phase, "already-connected", out)
  if (!out.o.noTableRotation && (user.currentMonth === undefined || !activeTables(out.o, out.now).includes(user.currentMonth))) {
    out.run({ _tag: "DropUser", uaid: user.uaid, connectedAt: user.connectedAt, reason: "stale_month", attempt: 0 })
    return phase
  }
  const resumed = { ...user, nodeId: out.o.routerUrl, connectedAt: out.now }
  out.run({ _tag: "WriteUser", user: resumed, purpose: { _tag: "Resume", previous: user } })
  return phase
}

const staleUserDropped = (phase: PhaseOf<"Identifying">, { dropped }: { readonly dropped: boolean }, out: Out): Phase => {
  if (dropped && phase.claimed !== undefined) out.event("uaid.reset.1", phase.claimed, { reason: "stale_month" })
  out.run({ _tag: "MintUaid" })
  return phase
}

/**
 * Resumed: the node the record named before (if another) is told to drop its stale session. A write
 * that lost means the record is gone (dropped meanwhile → a new uaid) or newer (→ close): read again.
 */
const resumed = (phase: PhaseOf<"Identifying">, input: Extract<CommandResult, { _tag: "UserWritten" }>, out: Out): Phase => {
  if (!input.written) {
    out.run({ _tag: "ReadUser", uaid: input.command.user.uaid })
    return { ...phase, rechecking: true }
  }
  const { user, purpose } = input.command
  const previous = purpose._tag === "Resume" ? purpose.previous : undefined
  if (previous?.nodeId !== undefined && previous.nodeId !== out.o.routerUrl) {
    out.signal({ _tag: "DisconnectPeer", nodeId: previous.nodeId, uaid: user.uaid, connectedAt: previous.connectedAt })
  }
  return identify(phase, user.uaid, user, "existing", out)
}

const uaidMinted = (phase: PhaseOf<"Identifying">, { uaid }: { readonly uaid: string }, out: Out): Phase =>
  identify(phase, uaid, undefined, phase.claimed === undefined ? "new" : "reassigned", out)

/**
 * The hello reply (with the broadcasts the client is behind on), and the session begins. A resumed
 * session is the one its router record names: its `connectedAt` is the value it wrote there (time
 * has passed since), which every condition on `connected_at` compares with; a new uaid's is now, and
 * its first register writes it.
 */
const identify = (
  phase: PhaseOf<"Identifying">,
  uaid: string,
  user: UserRecord | undefined,
  kind: "new" | "existing" | "reassigned",
  out: Out
): Phase => {
  const now = out.now
  const connectedAt = user?.connectedAt ?? now
  const current = currentTable(out.o, now)
  const table = user?.currentMonth === undefined ? current : tableName(user.currentMonth)
  const followed = follow(NOTHING, phase.broadcasts, out.broadcasts)
  const session: Session = {
    uaid,
    connectedAt,
    table,
    user,
    unacked: EMPTY_UNACKED,
    ackedRows: NOTHING,
    newestTopic: EMPTY_TOPICS,
    drain: undefined,
    retry: undefined,
    lastActivity: now,
    pingSentAt: undefined,
    lastClientPing: undefined,
    tokens: out.o.commandBurst,
    tokensAt: now,
    held: NOTHING,
    readingPaused: false,
    broadcasts: followed.broadcasts
  }
  out.signal({ _tag: "Claim", uaid, connectedAt })
  out.frame(helloReply(uaid, broadcastsReply(followed)))
  out.event("client.hello.1", uaid, { kind })
  if (followed.changed !== undefined) out.event("broadcast.delivered.1", uaid, { broadcasts: followed.changed, reason: "hello" })
  if (user === undefined) return { _tag: "Identified", session }
  const live: Live = !out.o.noTableRotation && table !== current
    ? { _tag: "Migrating", session, deferred: NOTHING }
    : { _tag: "Identified", session }
  return requestDrain(live, out)
}

// ── broadcasts ──────────────────────────────────────────────────────────────────────────────────

/** The id strings of a node set, to share rather than keep each client's copy (memory per connection). */
const ownIds = new WeakMap<BroadcastSet, ReadonlyMap<string, string>>()
const ownId = (set: BroadcastSet, id: string): string => {
  let ids = ownIds.get(set)
  if (ids === undefined) {
    ids = new Map(Array.from(set.keys(), (key) => [key, key]))
    ownIds.set(set, ids)
  }
  return ids.get(id) ?? id
}

interface Followed {
  /** The flat id/version list the session keeps. */
  readonly broadcasts: ReadonlyArray<string>
  /** Broadcasts whose node version the client did not have (now sent), if any. */
  readonly changed: Readonly<Record<string, string>> | undefined
  /** Requested ids the node does not have, if any. */
  readonly unknown: ReadonlyArray<string> | undefined
}

/**
 * Follow what a client asks for (hello or `broadcast_subscribe`): the ids the node has are kept with
 * the node's version (sent when the client's differs), unknown ids are answered as errors. At most
 * `BROADCASTS_PER_MESSAGE` ids are looked at; ids longer than `BROADCAST_ID_MAX` are ignored.
 */
const follow = (
  current: ReadonlyArray<string>,
  requested: Readonly<Record<string, string>> | undefined,
  set: BroadcastSet
): Followed => {
  if (requested === undefined) return { broadcasts: current, changed: undefined, unknown: undefined }
  const kept = current.slice()
  let changed: Record<string, string> | undefined
  let unknown: Array<string> | undefined
  let looked = 0
  for (const id in requested) {
    if (looked++ >= BROADCASTS_PER_MESSAGE) break
    if (id.length > BROADCAST_ID_MAX) continue
    const version = set.get(id)
    if (version === undefined) {
      ;(unknown ??= []).push(id)
      continue
    }
    if (requested[id] !== version) (changed ??= {})[id] = version
    const own = ownId(set, id)
    const at = indexOfId(kept, own)
    if (at >= 0) kept[at + 1] = version
    else kept.push(own, version)
  }
  return { broadcasts: kept.length === 0 ? NOTHING : kept, changed, unknown }
}

const indexOfId = (flat: ReadonlyArray<string>, id: string): number => {
  for (let i = 0; i < flat.length; i += 2) if (flat[i] === id) return i
  return -1
}

/** Followed broadcasts whose node version moved on: the new versions, and the list updated. */
const behind = (session: Session, set: BroadcastSet): Followed => {
  let changed: Record<string, string> | undefined
  let kept: Array<string> | undefined
  const flat = session.broadcasts
  for (let i = 0; i < flat.length; i += 2) {
    const id = flat[i] as string
    const version = set.get(id)
    if (version === undefined || version === flat[i + 1]) continue
    ;(changed ??= {})[id] = version
    ;(kept ??= flat.slice())[i + 1] = version
  }
  return { broadcasts: kept ?? flat, changed, unknown: undefined }
}

/** The wire object: changed versions, and `errors` for unknown ids. */
const broadcastsReply = ({ changed, unknown }: Followed): Record<string, unknown> => {
  const reply: Record<string, unknown> = { ...changed }
  if (unknown !== undefined) reply["errors"] = Object.fromEntries(unknown.map((id) => [id, BROADCAST_NOT_FOUND]))
  return reply
}

const BROADCAST_NOT_FOUND = "Broadcast not found"

/** Subscribe: follow more ids; anything new to the client is answered at once (nothing: no reply). */
const broadcastSubscribe = (phase: Live, message: Msg<"broadcast_subscribe">, out: Out): Phase => {
  const s = phase.session
  const pending = behind(s, out.broadcasts)
  const followed = follow(pending.broadcasts, message.broadcasts, out.broadcasts)
  const changed = pending.changed === undefined ? followed.changed : { ...pending.changed, ...followed.changed }
  const all: Followed = { ...followed, changed }
  if (changed !== undefined || followed.unknown !== undefined) out.frame(broadcastFrame(broadcastsReply(all)))
  if (changed !== undefined) out.event("broadcast.delivered.1", s.uaid, { broadcasts: changed, reason: "subscribe" })
  return withSession(phase, { ...s, broadcasts: followed.broadcasts })
}

// ── commands: the budget ────────────────────────────────────────────────────────────────────────

/** Refill the token bucket to `now`. */
const refill = (s: Session, o: ProtocolOptions, now: number): Session => {
  if (s.tokens >= o.commandBurst) return s.tokensAt === now ? s : { ...s, tokensAt: now }
  const tokens = Math.min(o.commandBurst, s.tokens + ((now - s.tokensAt) * o.commandsPerSecond) / 1000)
  return { ...s, tokens, tokensAt: now }
}

/**
 * A command that costs budget: run now when there is budget and nothing waits before it; otherwise
 * it waits (in order), and the socket stops being read while many wait.
 */
const budgeted = <M extends ClientMessage>(
  handle: (phase: Live, message: M, out: Out) => Phase
) =>
(phase: Live, message: M, out: Out, admitted: boolean): Phase => {
  if (admitted) return handle(phase, message, out)
  const s = refill(phase.session, out.o, out.now)
  if (s.held.length === 0 && s.tokens >= 1) return handle(withSession(phase, { ...s, tokens: s.tokens - 1 }), message, out)
  const held = [...s.held, message]
  const pause = held.length >= HELD_COMMANDS_MAX && !s.readingPaused
  if (pause) out.signal({ _tag: "PauseReading" })
  return withSession(phase, { ...s, held, readingPaused: s.readingPaused || pause })
}

/** Release waiting commands the budget now allows (at a tick). */
const releaseHeld = (phase: Live, out: Out): Live => {
  const s = refill(phase.session, out.o, out.now)
  if (s.held.length === 0) return withSession(phase, s)
  const n = Math.min(s.held.length, Math.floor(s.tokens))
  if (n === 0) return withSession(phase, s)
  const held = s.held.slice(n)
  out.signal({ _tag: "Replay", messages: s.held.slice(0, n), admitted: true })
  const resume = s.readingPaused && held.length === 0
  if (resume) out.signal({ _tag: "ResumeReading" })
  return withSession(phase, { ...s, tokens: s.tokens - n, held, readingPaused: s.readingPaused && !resume })
}

// ── register / unregister ───────────────────────────────────────────────────────────────────────

type Msg<T extends ClientMessage["messageType"]> = Extract<ClientMessage, { readonly messageType: T }>
type HelloMessage = Msg<"hello">

const register = (phase: Live, message: Msg<"register">, out: Out): Phase => {
  const s = phase.session
  if (!isCanonicalChannelId(message.channelID)) {
    out.frame(registerReply(message.channelID, 401, ""))
    return phase
  }
  out.run({ _tag: "MakeEndpoint", uaid: s.uaid, channelId: message.channelID, key: message.key ?? undefined })
  return phase
}

const endpointMade = (phase: Live, input: Extract<CommandResult, { _tag: "EndpointMade" }>, out: Out): Phase => {
  const s = phase.session
  const { channelId } = input.command
  if (input.endpoint === undefined) {
    out.frame(registerReply(channelId, 400, "Failed to generate endpoint"))
    return phase
  }
  const registering: Registering = { channelId, endpoint: input.endpoint }
  if (s.user !== undefined) {
    out.run({ _tag: "AddChannel", uaid: s.uaid, table: s.table, registering })
    return phase
  }
  const user: UserRecord = {
    uaid: s.uaid,
    routerType: "webpush",
    routerData: {},
    connectedAt: s.connectedAt,
    nodeId: out.o.routerUrl,
    currentMonth: s.table,
    recordVersion: USER_RECORD_VERSION
  }
  out.run({ _tag: "WriteUser", user, purpose: { _tag: "Register", registering } })
  return phase
}

/** The first register of a new uaid wrote its router record. */
const userWritten = (phase: Live, input: Extract<CommandResult, { _tag: "UserWritten" }>, out: Out): Phase => {
  const purpose = input.command.purpose
  if (purpose._tag !== "Register") throw new Error("a resume write answered in an identified phase")
  const registering = purpose.registering
  if (!input.written) {
    out.frame(registerReply(registering.channelId, 500, ""))
    return phase
  }
  out.run({ _tag: "AddChannel", uaid: phase.session.uaid, table: phase.session.table, registering })
  return withSession(phase, { ...phase.session, user: input.command.user })
}

const channelAdded = (phase: Live, { registering, added }: { readonly registering: Registering; readonly added: boolean }, out: Out): Phase => {
  if (!added) {
    out.frame(registerReply(registering.channelId, 413, ""))
    return phase
  }
  out.event("channel.registered.1", phase.session.uaid, { channelId: registering.channelId })
  out.frame(registerReply(registering.channelId, 200, registering.endpoint))
  return phase
}

const unregister = (phase: Live, message: Msg<"unregister">, out: Out): Phase => {
  const s = phase.session
  const channelId = parseChannelId(message.channelID)
  if (channelId === undefined) {
    out.frame(unregisterReply(message.channelID, 401))
    return phase
  }
  if (s.user === undefined) {
    out.event("channel.unregistered.1", s.uaid, { channelId, code: message.code })
    out.frame(unregisterReply(channelId, 200))
    return phase
  }
  out.run({ _tag: "RemoveChannel", uaid: s.uaid, table: s.table, channelId, code: message.code })
  return phase
}

/**
 * While migrating, register and unregister wait until the user lives in this month's table (the
 * seed), at most `HELD_COMMANDS_MAX` of them; beyond, one is answered 503 at once (the socket must
 * go on being read: the move waits for the client's acks).
 */
const deferred = (phase: PhaseOf<"Migrating">, message: Msg<"register" | "unregister">, out: Out): Phase => {
  if (phase.deferred.length < HELD_COMMANDS_MAX) return { ...phase, deferred: [...phase.deferred, message] }
  out.frame(message.messageType === "register" ? registerReply(message.channelID, 503, "") : unregisterReply(message.channelID, 503))
  return phase
}

const channelRemoved = (phase: Live, { command }: Extract<CommandResult, { _tag: "ChannelRemoved" }>, out: Out): Phase => {
  out.event("channel.unregistered.1", phase.session.uaid, { channelId: command.channelId, code: command.code })
  out.frame(unregisterReply(command.channelId, 200))
  return phase
}

// ── acks, pings, nacks ──────────────────────────────────────────────────────────────────────────

const ack = (phase: Live, message: Msg<"ack">, out: Out): Phase => {
  const before = phase.session
  let unacked: Map<string, Unacked> | undefined
  let topicRows = false
  const ackedRows: Array<Unacked> = [...before.ackedRows]
  for (const update of message.updates) {
    const entry = (unacked ?? before.unacked).get(update.version)
    if (entry === undefined) continue
    ;(unacked ??= new Map(before.unacked)).delete(update.version)
    if (entry.table !== undefined) {
      ackedRows.push(entry)
      if (entry.notification.topic !== undefined) topicRows = true
    }
    out.event("notification.acked.1", before.uaid, {
      version: update.version,
      code: update.code ?? 100,
      source: entry.table === undefined ? "direct" : "stored"
    })
  }
  const s = unacked === undefined ? before : { ...before, unacked }
  // Rows are deleted before the next page is read (a topic page would otherwise show them again),
  // together: when a topic row was acked, or no stored message is outstanding any more.
  if (!topicRows && storedOutstanding(s) > 0) return withSession(phase, { ...s, ackedRows })
  const deletes = ackedRows
  if (deletes.length === 0) return continueDrain(withSession(phase, s), out)
  if (s.retry?.command._tag === "DeleteMessages") {
    const pending = s.retry.command
    return withSession(phase, { ...s, ackedRows: NOTHING, retry: { ...s.retry, command: { ...pending, messages: [...pending.messages, ...deletes] } } })
  }
  out.run({ _tag: "DeleteMessages", uaid: s.uaid, messages: deletes, attempt: 0 })
  return withSession(phase, { ...s, ackedRows: NOTHING })
}

const messagesDeleted = (phase: Live, _input: unknown, out: Out): Phase => continueDrain(phase, out)

const ping = (phase: Live, _message: unknown, out: Out): Phase => {
  const s = phase.session
  if (s.lastClientPing !== undefined && out.now - s.lastClientPing < out.o.minPingIntervalMs) {
    return closeNow(phase, "excessive-ping", out)
  }
  out.frame(PING_REPLY)
  return withSession(phase, { ...s, lastClientPing: out.now })
}

const nack = (phase: Live, message: Msg<"nack">, out: Out): Phase => {
  out.event("notification.nacked.1", phase.session.uaid, { version: message.version, code: message.code ?? 0 })
  return phase
}

// ── deliveries and the storage drain ────────────────────────────────────────────────────────────

const delivery = (phase: Live, { notification: n }: { readonly notification: Notification }, out: Out): Phase => {
  const s = phase.session
  // TTL 0 means "only if connected now": it is now, so it goes out.
  if (n.ttl > 0 && isExpired(n, Math.floor(out.now / 1000))) {
    out.event("notification.expired.1", s.uaid, { version: n.version })
    return phase
  }
  return withSession(phase, send(s, n, undefined, out))
}

/** A reason to look at storage: start a drain, or remember to go again if one is running. */
const requestDrain = (phase: Live, out: Out): Phase => {
  const s = phase.session
  if (s.user === undefined) return phase
  if (s.drain !== undefined) return withSession(phase, { ...s, drain: { ...s.drain, again: true } })
  const drain: Drain = { tables: [s.table], rows: "topic", after: undefined, again: false, sent: 0 }
  return continueDrain(withSession(phase, { ...s, drain }), out)
}

/**
 * Read the next page when the previous one is fully acked and nothing is pending; when every table
 * is read, finish the drain (and, migrating, move the user to this month).
 */
const continueDrain = (phase: Live, out: Out): Phase => {
  const s = phase.session
  const drain = s.drain
  if (drain === undefined || s.retry !== undefined || out.command !== undefined || storedOutstanding(s) > 0) return phase
  if (drain.sent > out.o.msgLimit) {
    out.run({ _tag: "DropUser", uaid: s.uaid, connectedAt: s.connectedAt, reason: "too_many_messages", attempt: 0 })
    return phase
  }
  const table = drain.tables[0]
  if (table !== undefined) {
    if (drain.rows === "read") return continueDrain(withSession(phase, { ...s, drain: nextTable(drain) }), out)
    out.run({ _tag: "ReadPage", uaid: s.uaid, table, rows: drain.rows, after: drain.after, limit: out.o.pageSize, attempt: 0 })
    return phase
  }
  if (drain.again) {
    const again: Drain = { tables: [s.table], rows: "topic", after: undefined, again: false, sent: drain.sent }
    return continueDrain(withSession(phase, { ...s, drain: again }), out)
  }
  const done = withSession(phase, { ...s, drain: undefined })
  if (done._tag === "Migrating") out.run({ _tag: "MoveMonth", uaid: s.uaid, from: s.table, to: currentTable(out.o, out.now), attempt: 0 })
  return done
}

/** The drain goes on with the next table (from its topic rows). */
const nextTable = (drain: Drain): Drain => ({ ...drain, tables: drain.tables.slice(1), rows: "topic", after: undefined })

const pageRead = (phase: Live, input: Extract<CommandResult, { _tag: "PageRead" }>, out: Out): Phase => {
  const s = phase.session
  const drain = s.drain as Drain
  const { command } = input
  // Storage filtered expired rows when it read them; time has passed since: what expired on the way is not sent.
  const nowSec = Math.floor(out.now / 1000)
  const messages = input.messages.filter((n) => {
    if (!isExpired(n, nowSec)) return true
    out.event("notification.expired.1", s.uaid, { version: n.version })
    return false
  })
  if (messages.length === 0) {
    const next: Drain = command.rows === "topic"
      ? { ...drain, rows: "timestamp" }
      : input.lastSortKey !== undefined && input.more
      ? { ...drain, after: input.lastSortKey } // a page of expired rows only: keep reading after it
      : nextTable(drain)
    return continueDrain(withSession(phase, { ...s, drain: next }), out)
  }
  const sent = drain.sent + messages.length
  // The client gets `msgLimit` messages of a drain whatever the page size; the rest of a page that
  // goes past it is not sent (the user is dropped once what was sent is acked: continueDrain).
  const page = sent > out.o.msgLimit ? messages.slice(0, Math.max(0, out.o.msgLimit - drain.sent)) : messages
  // A timestamp page that was not full is the last of its table — but while migrating, endpoints
  // that read the old record may still store into the old table: it is read until a page is empty.
  const last = command.rows === "timestamp" && !input.more && phase._tag === "Identified"
  let next: Session = {
    ...s,
    drain: command.rows === "timestamp"
      ? { ...drain, sent, after: input.lastSortKey, rows: last ? "read" : "timestamp" }
      : { ...drain, sent }
  }
  let fresh = 0
  for (const n of page) {
    if (next.unacked.has(n.version)) continue
    next = send(next, n, command.table, out)
    fresh++
  }
  // Topic rows already in hand (sent directly, unacked) would be read again and again: move on.
  if (fresh === 0 && command.rows === "topic") next = { ...next, drain: { ...(next.drain as Drain), rows: "timestamp" } }
  return continueDrain(withSession(phase, next), out)
}

/**
 * Too many stored messages: the user is gone; the next hello gets a new uaid. Not dropped: a newer
 * session of the user took over meanwhile (it drains, and counts, for itself), so this one goes.
 */
const tooManyDropped = (phase: Live, { dropped }: { readonly dropped: boolean }, out: Out): Phase => {
  const s = phase.session
  if (!dropped) return closeNow(phase, "ghost", out)
  out.event("uaid.reset.1", s.uaid, { reason: "too_many_messages" })
  return closeNow(withSession(phase, { ...s, user: undefined, unacked: EMPTY_UNACKED, drain: undefined }), "uaid-reset", out)
}

/**
 * The old month is drained and the user moved: the commands that waited are fed again, through the
 * command budget; both months are drained.
 */
const monthMoved = (phase: PhaseOf<"Migrating">, { command }: Extract<CommandResult, { _tag: "MonthMoved" }>, out: Out): Phase => {
  const s = phase.session
  out.event("month.migrated.1", s.uaid, { from: command.from, to: command.to })
  if (phase.deferred.length > 0) out.signal({ _tag: "Replay", messages: phase.deferred, admitted: false })
  const session: Session = {
    ...s,
    table: command.to,
    user: s.user === undefined ? undefined : { ...s.user, currentMonth: command.to },
    // An endpoint that read the old record may have stored into the old table meanwhile.
    drain: { tables: [command.from, command.to], rows: "topic", after: undefined, again: false, sent: 0 }
  }
  return continueDrain({ _tag: "Identified", session }, out)
}

// ── failures ────────────────────────────────────────────────────────────────────────────────────

/**
 * Storage failed for a command (or did not answer within `storage_timeout`): a hello closes (as a
 * handshake timeout once `hello_timeout` has passed); register/unregister answer 500; the rest retries.
 */
const commandFailed = (phase: PhaseOf<"Identifying" | "Identified" | "Migrating" | "Closing">, { command }: Extract<CommandResult, { _tag: "CommandFailed" }>, out: Out): Phase => {
  if (phase._tag === "Identifying") {
    return closeNow(phase, out.now >= phase.openedAt + out.o.helloTimeoutMs ? "hello-timeout" : "storage-error", out)
  }
  switch (command._tag) {
    case "MintUaid":
    case "ReadUser":
      throw new Error(`${command._tag} failed in phase ${phase._tag}`)
    case "WriteUser":
      if (command.purpose._tag === "Resume") throw new Error(`a resume write failed in phase ${phase._tag}`)
      out.frame(registerReply(command.purpose.registering.channelId, 500, ""))
      return phase
    case "MakeEndpoint":
      out.frame(registerReply(command.channelId, 500, ""))
      return phase
    case "AddChannel":
      out.frame(registerReply(command.registering.channelId, 500, ""))
      return phase
    case "RemoveChannel":
      out.frame(unregisterReply(command.channelId, 500))
      return phase
  }
  if (phase._tag === "Closing" && out.now - phase.since >= out.o.saveRetryForMs) return giveUp(phase, out)
  const retry: Retry = { command: { ...command, attempt: command.attempt + 1 }, at: out.now + backoff(out.o, command.attempt) }
  return phase._tag === "Closing" ? { ...phase, retry } : withSession(phase, { ...phase.session, retry })
}

// ── timers ──────────────────────────────────────────────────────────────────────────────────────

const helloTick = (phase: PhaseOf<"AwaitingHello">, _input: unknown, out: Out): Phase =>
  out.now >= phase.openedAt + out.o.helloTimeoutMs ? closeNow(phase, "hello-timeout", out) : phase

const liveTick = (phase: Live, _input: unknown, out: Out): Phase => {
  let s = phase.session
  const now = out.now
  if (s.pingSentAt !== undefined && now >= s.pingSentAt + out.o.autoPingTimeoutMs) return closeNow(phase, "pong-timeout", out)
  if (s.pingSentAt === undefined && now >= s.lastActivity + out.o.autoPingIntervalMs) {
    // A change of a followed broadcast goes out instead of the ping (it keeps the connection alive too).
    const update = behind(s, out.broadcasts)
    if (update.changed !== undefined) {
      out.frame(broadcastFrame(update.changed))
      out.event("broadcast.delivered.1", s.uaid, { broadcasts: update.changed, reason: "change" })
      s = { ...s, broadcasts: update.broadcasts, lastActivity: now }
    } else {
      out.signal({ _tag: "Ping" })
      s = { ...s, pingSentAt: now }
    }
  }
  if (s.retry !== undefined && now >= s.retry.at) {
    out.run(s.retry.command)
    s = { ...s, retry: undefined }
  }
  return releaseHeld(withSession(phase, s), out)
}

const closingTick = (phase: PhaseOf<"Closing">, _input: unknown, out: Out): Phase => {
  if (phase.retry === undefined || out.now < phase.retry.at) return phase
  out.run(phase.retry.command)
  return { ...phase, retry: undefined }
}

/** Activity from the client: the keepalive starts over. */
const active = (phase: Live, now: number): Live =>
  withSession(phase, { ...phase.session, lastActivity: now, pingSentAt: undefined })

const pong = (phase: Live, _input: unknown, out: Out): Phase => active(phase, out.now)

/** When the node's ticker must wake this session next (ms), or Infinity. */
export const deadlineOf = (phase: Phase, o: ProtocolOptions): number => {
  switch (phase._tag) {
    case "AwaitingHello":
    case "Identifying":
      return phase.openedAt + o.helloTimeoutMs
    case "Identified":
    case "Migrating": {
      const s = phase.session
      let at = s.pingSentAt !== undefined ? s.pingSentAt + o.autoPingTimeoutMs : s.lastActivity + o.autoPingIntervalMs
      if (s.retry !== undefined) at = Math.min(at, s.retry.at)
      if (s.held.length > 0) at = Math.min(at, s.tokensAt + Math.ceil((1 - s.tokens) * 1000 / o.commandsPerSecond))
      return at
    }
    case "Closing":
      return phase.retry?.at ?? Number.POSITIVE_INFINITY
    case "Closed":
      return Number.POSITIVE_INFINITY
  }
}

// ── the end ─────────────────────────────────────────────────────────────────────────────────────

const socketClosed = (phase: Phase, _input: unknown, out: Out): Phase =>
  phase._tag === "Identified" || phase._tag === "Migrating"
    ? { _tag: "Closing", session: phase.session, reason: "client", since: out.now, retry: undefined }
    : { _tag: "Closed" }

/** A delivery still queued when the socket closed: the router port accepted it, so it is kept. */
const leftover = (phase: PhaseOf<"Closing">, { notification }: { readonly notification: Notification }): Phase => ({
  ...phase,
  session: remember(phase.session, notification, undefined)
})

/**
 * What to save of an ended session: unacked direct messages, unexpired, re-stamped so they sort after
 * what is stored and do not collide; a topic message only if it is still the newest of its topic.
 */
const mailboxDrained = (phase: PhaseOf<"Closing">, _input: unknown, out: Out): Phase => {
  const s = phase.session
  if (s.user === undefined) return ended(phase, [], out)
  const nowSec = Math.floor(out.now / 1000)
  const messages: Array<Notification> = []
  // Stored topic messages the client has since had a newer message of (a TTL 0 one, sent and never
  // stored) were replaced: their rows go, as acked ones do.
  const replaced: Array<Unacked> = []
  for (const entry of s.unacked.values()) {
    const { notification: n, table } = entry
    const newest = n.topic === undefined || s.newestTopic.get(`${n.channelId}:${n.topic}`) === n.version
    if (table !== undefined) {
      if (!newest) replaced.push(entry)
      continue
    }
    if (isExpired(n, nowSec)) continue
    if (n.topic === undefined) messages.push({ ...n, sortkeyTimestamp: out.now + messages.length })
    else if (newest) messages.push(n)
  }
  const acked = replaced.length === 0 ? s.ackedRows : [...s.ackedRows, ...replaced]
  out.run({ _tag: "SaveUnacked", uaid: s.uaid, connectedAt: s.connectedAt, table: s.table, messages, acked, attempt: 0 })
  return phase
}

const unackedSaved = (phase: PhaseOf<"Closing">, { saved }: { readonly saved: ReadonlyArray<Notification> }, out: Out): Phase =>
  ended(phase, saved, out)

const ended = (phase: PhaseOf<"Closing">, saved: ReadonlyArray<Notification>, out: Out): Phase => {
  const uaid = phase.session.uaid
  for (const n of saved) out.event("notification.stored.1", uaid, { channelId: n.channelId, version: n.version, reason: "disconnect" })
  out.event("session.ended.1", uaid, { reason: phase.reason })
  return { _tag: "Closed" }
}

/** Storage stayed down for `saveRetryForMs`: the session ends without its unacked messages. */
const giveUp = (phase: PhaseOf<"Closing">, out: Out): Phase => ended(phase, [], out)

// ── the table ───────────────────────────────────────────────────────────────────────────────────

/** Input kinds: client frames by `messageType`, everything else by `_tag`. */
export type InputKind = ClientMessage["messageType"] | Exclude<Input["_tag"], "Frame">
type InputOf<K extends InputKind> = K extends ClientMessage["messageType"] ? Msg<K> : Extract<Input, { readonly _tag: K }>
type Transitions = {
  readonly [P in PhaseTag]: {
    readonly [K in InputKind]?: (phase: PhaseOf<P>, input: InputOf<K>, out: Out, admitted: boolean) => Phase
  }
}

const notYet = closeWith("expected-hello")
const kicked = (phase: Phase, input: { readonly kind: CloseKind }, out: Out) => closeNow(phase, input.kind, out)
const live = {
  hello: closeWith("already-hello"),
  ack,
  nack: budgeted(nack),
  ping,
  broadcast_subscribe: budgeted(broadcastSubscribe),
  BadFrame: closeWith("invalid-json"),
  BinaryFrame: closeWith("binary-frame"),
  Pong: pong,
  Delivery: delivery,
  CheckStorage: (phase: Live, _input: unknown, out: Out) => requestDrain(phase, out),
  Tick: liveTick,
  Kick: kicked,
  SocketClosed: socketClosed,
  PageRead: pageRead,
  MessagesDeleted: messagesDeleted,
  UserDropped: tooManyDropped,
  CommandFailed: commandFailed,
  EndpointMade: endpointMade,
  UserWritten: userWritten,
  ChannelAdded: channelAdded,
  ChannelRemoved: channelRemoved
} as const

const TRANSITIONS: Transitions = {
  AwaitingHello: {
    hello,
    register: notYet,
    unregister: notYet,
    ack: notYet,
    nack: notYet,
    ping: notYet,
    broadcast_subscribe: notYet,
    BadFrame: closeWith("invalid-json"),
    BinaryFrame: closeWith("binary-frame"),
    Tick: helloTick,
    Kick: kicked,
    SocketClosed: socketClosed
  },
  Identifying: {
    UserRead: userRead,
    UserDropped: staleUserDropped,
    UserWritten: resumed,
    UaidMinted: uaidMinted,
    CommandFailed: commandFailed
  },
  Identified: { ...live, register: budgeted(register), unregister: budgeted(unregister) },
  Migrating: { ...live, register: deferred, unregister: deferred, MonthMoved: monthMoved },
  Closing: {
    Delivery: leftover,
    MailboxDrained: mailboxDrained,
    UnackedSaved: unackedSaved,
    CommandFailed: commandFailed,
    Tick: closingTick
  },
  Closed: {}
}

const RESULTS: ReadonlySet<string> = new Set<CommandResult["_tag"]>([
  "UaidMinted",
  "UserRead",
  "UserWritten",
  "UserDropped",
  "EndpointMade",
  "ChannelAdded",
  "ChannelRemoved",
  "PageRead",
  "MessagesDeleted",
  "MonthMoved",
  "UnackedSaved",
  "CommandFailed"
])

export const inputKind = (input: Input): InputKind => (input._tag === "Frame" ? input.message.messageType : input._tag)

/** The protocol for a node's options: `step` and the phase a new connection starts in. */
export const makeProtocol = (options: ProtocolOptions) => {
  /** `broadcasts`: the node's broadcast set as of `now` (read on hello, subscribe and keepalive ticks). */
  const step = (phase: Phase, input: Input, now: number, broadcasts: BroadcastSet = NO_BROADCASTS): Transition => {
    const out = new Out(now, options, broadcasts)
    const kind = inputKind(input)
    const handler = (TRANSITIONS[phase._tag] as Record<string, Function | undefined>)[kind]
    if (handler === undefined) {
      if (RESULTS.has(kind)) throw new Error(`${kind} in phase ${phase._tag}`)
      return out.done(phase)
    }
    // Any client frame is activity (keepalive), even one that waits for budget.
    const from = input._tag === "Frame" && (phase._tag === "Identified" || phase._tag === "Migrating") && input.admitted !== true
      ? active(phase, now)
      : phase
    const argument = input._tag === "Frame" ? input.message : input
    const admitted = input._tag === "Frame" && input.admitted === true
    return out.done(handler(from, argument, out, admitted) as Phase)
  }
  return {
    step,
    initial: (now: number): Phase => ({ _tag: "AwaitingHello", openedAt: now }),
    deadline: (phase: Phase): number => deadlineOf(phase, options)
  }
}

export type Protocol = ReturnType<typeof makeProtocol>
