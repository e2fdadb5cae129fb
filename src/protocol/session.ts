/**
 * One WebSocket connection: the fiber that interprets the protocol (`table.ts`). It takes inputs
 * from the connection's mailbox, asks `step` what they mean, and carries that out — frames to the
 * socket, domain events to the event log, signals to the registry and peers, commands to storage —
 * feeding each command's result back as the next input before anything else. It decides nothing.
 *
 * When a transition enters `Closing` the session leaves the node; while the client may still answer
 * our close frame (`Answering`) the mailbox stays open for its acks; then (`Collecting`) it is shut,
 * deliveries still queued in it are handed to the machine (the router port accepted them), and
 * `MailboxDrained` lets it save what is unacked.
 * Closing also runs when the node interrupts the fiber (shutdown: the node runs `finish`), so
 * messages are saved either way.
 */
import * as Cause from "effect/Cause"
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import { type DomainEvent } from "../domain/events.ts"
import { newUaid } from "../domain/ids.ts"
import { messageKeyOf, type Notification, type Urgency, urgentEnough } from "../domain/notification.ts"
import { lastConnectValue } from "../domain/user.ts"
import type { EndpointCrypto } from "../crypto/endpoint.ts"
import type { EventLogService } from "../observability/EventLog.ts"
import { opaqueId } from "../observability/opaque.ts"
import { emptySummary, foldSummary, type SessionSummary, summaryFields } from "../observability/sessionSummary.ts"
import { type AckedRow, failureText, type StorageError, type StorageService } from "../storage/Storage.ts"
import { closeFrame, type CloseKind } from "./close.ts"
import type { Command, CommandResult, Input, MailboxInput, Signal, Transition } from "./inputs.ts"
import { type Consumer, type InboxBound, Mailbox } from "./mailbox.ts"
import { directOutstanding } from "./out.ts"
import { describeFrame } from "./messages.ts"
import { type BroadcastSet, isLive, type Phase, type ProtocolOptions, type StoredUnacked } from "./phases.ts"
import { makeProtocol, type Protocol } from "./table.ts"

// ── what a session talks to ─────────────────────────────────────────────────────────────────────

/** The socket, as the session sees it. `sendClose` sends a close frame; the transport ends TCP after a grace. */
export interface Transport {
  readonly sendText: (text: string) => void
  readonly sendClose: (code: number, reason: string) => void
  /** A WebSocket-level ping frame (keepalive); the pong comes back as a `Pong` event. */
  readonly sendPing: () => void
  /** Stop / start reading the client's frames (back-pressure while its commands wait). */
  readonly pause: () => void
  readonly resume: () => void
}

export interface SessionOptions extends ProtocolOptions {
  /** The client's frames (count, bytes) waiting in the mailbox at which its socket stops being read. */
  readonly inboxFrames: number
  readonly inboxBytes: number
}

/** Live sessions of this node by uaid: one per uaid (a newer one kicks the older). */
export interface SessionRegistry {
  readonly register: (handle: SessionHandle) => void
  readonly remove: (handle: SessionHandle) => void
}

/** Other connection nodes, best-effort and in the background (failures are logged, never awaited). */
export interface Peers {
  /** `PUT {node}/notif/{uaid}`: tell that node to check storage. */
  readonly notify: (nodeId: string, uaid: string) => void
  /** `DELETE {node}/notif/{uaid}/{connectedAt}`: tell that node to drop a stale session. */
  readonly disconnect: (nodeId: string, uaid: string, connectedAt: number) => void
}

export interface SessionPorts {
  readonly storage: StorageService
  /** Push endpoint URLs: the node's endpoint crypto. */
  readonly endpoints: Pick<EndpointCrypto["Service"], "makeEndpoint">
  readonly registry: SessionRegistry
  readonly peers: Peers
  readonly events: EventLogService
  readonly options: SessionOptions
  /** The protocol for `options` (one per node). */
  readonly protocol: Protocol
  /** The node's broadcasts now. */
  readonly broadcasts: () => BroadcastSet
  /** Log every input and the frames it caused (log-safe summaries) at debug level. */
  readonly logFrames: boolean
}

/** The ports' protocol from their options. */
export const protocolFor = (options: SessionOptions): Protocol => makeProtocol(options)

/** What the node keeps of a session: its mailbox, who it is, and when its next timer is due. */
export class SessionHandle {
  uaid: string | undefined = undefined
  connectedAt = 0
  /** Ms time at which the node's ticker sends a `Tick`. */
  deadline: number
  readonly mailbox: Mailbox<MailboxInput>
  /**
   * Channels the client unregistered in this session (and did not register again), folded from
   * its events: deliveries for them are refused, so an endpoint that still knew the channel reads
   * storage again. Made on the first unregister (most sessions never have one); the last
   * `UNREGISTERED_REMEMBERED` of them (a client unregistering made-up channels does not grow it).
   */
  unregistered: Set<string> | undefined = undefined
  /** Direct messages the session sent and the client has not acked (as of its last step). */
  unackedDirect = 0
  /** The client's minimum urgency (from its record, then its `urgency` commands): less urgent messages are refused. */
  minUrgency: Urgency | undefined = undefined

  /** `inbox`: the bound of the client's frames waiting (none: counted, never paused on). */
  constructor(capacity: number, deadline: number, inbox?: InboxBound) {
    this.mailbox = new Mailbox<MailboxInput>(capacity, isDelivery, inbox, onceKind)
    this.deadline = deadline
  }

  /**
   * Queue a delivery, unless the client already holds `capacity` messages it must ack, counting those
   * queued for it and those sent and not acked (a message with a TTL is kept until acked: a client
   * that reads and never acks would otherwise make the session hold every push). Refused, the router
   * port answers so that the endpoint stores it: the client reads it from storage, a page at a time.
   * A TTL 0 message is not kept once sent: only the queue bounds it.
   */
  offerDelivery(notification: Notification): boolean {
    if (notification.ttl > 0 && this.mailbox.deliveries + this.unackedDirect >= this.mailbox.capacity) return false
    return this.mailbox.offerDelivery({ _tag: "Delivery", notification })
  }

  /**
   * Whether `notification` may be delivered here: to the session connected at `connectedAt` (when
   * given), on a channel it has not unregistered, at least as urgent as the client wants (a refused
   * one is stored by the endpoint, and sent when the client lowers its minimum).
   */
  takes(notification: Notification, connectedAt: number | undefined): boolean {
    return (connectedAt === undefined || connectedAt === this.connectedAt) &&
      this.unregistered?.has(notification.channelId) !== true &&
      urgentEnough(notification, this.minUrgency)
  }
}

/**
 * Channels unregistered in a session that its handle remembers, the latest ones (as many as a user
 * may have by default: `max_channels_per_user`). One forgotten only lets a delivery for it through,
 * which the client ignores (it has no such subscription any more).
 */
export const UNREGISTERED_REMEMBERED = 1_000

/** A session ended before its unacked messages could be saved, logged on its own. */
export const cutSession = (uaidHash: string | null): Effect.Effect<void> =>
  Effect.logError("session ended before its unacked messages could be saved").pipe(Effect.annotateLogs({ uaid_hash: uaidHash }))

/** Fold one of the session's events into the handle: unregistered channels, the minimum urgency. */
const foldIntoHandle = (handle: SessionHandle, event: DomainEvent): void => {
  if (event.type === "channel.unregistered.1") {
    const unregistered = handle.unregistered ??= new Set()
    if (unregistered.size >= UNREGISTERED_REMEMBERED) unregistered.delete(unregistered.values().next().value as string)
    unregistered.add(event.data.channelId)
  } else if (event.type === "channel.registered.1") handle.unregistered?.delete(event.data.channelId)
  else if (event.type === "client.urgency.1") handle.minUrgency = event.data.min
}

const isDelivery = (input: MailboxInput): boolean => input._tag === "Delivery"

/**
 * Inputs that mean the same however many wait, so at most one of each waits in a mailbox: a storage
 * check (the drain it starts, or restarts, reads whatever the pokes announced), a tick (it handles
 * every deadline due when it is taken), a kick (the first one closes the session).
 */
const ONCE: { readonly [T in MailboxInput["_tag"]]?: number } = { CheckStorage: 1, Tick: 2, Kick: 4 }
const onceKind = (input: MailboxInput): number => ONCE[input._tag] ?? 0

// ── the interpreter ─────────────────────────────────────────────────────────────────────────────

/**
 * A new connection's session; its fiber runs `run()` until it is closed. That fiber holds no
 * finalizer (a frame would stay on every idle fiber's stack: memory per connection): whoever ends
 * it before the session is closed (the node's shutdown interrupts it) brings the session to its end
 * with `finish` (unacked messages saved, summary logged).
 */
export const makeSession = (ports: SessionPorts, transport: Transport, handle: SessionHandle): Effect.Effect<SessionRunner> =>
  Effect.map(Clock.currentTimeMillis, (now) => new SessionRunner(ports, transport, handle, now))

/** The session fiber's state and work. Tests drive one with `feed`. */
export class SessionRunner implements Consumer<MailboxInput> {
  phase: Phase
  /** The fold of this session's events (the `Session` summary record). */
  summary: SessionSummary = emptySummary
  private readonly ports: SessionPorts
  private readonly transport: Transport
  private readonly handle: SessionHandle
  /** Inputs that go before the mailbox: command results, replayed commands, leftovers at close. */
  private front: Array<Input> | undefined = undefined

  constructor(ports: SessionPorts, transport: Transport, handle: SessionHandle, now: number) {
    this.ports = ports
    this.transport = transport
    this.handle = handle
    this.phase = ports.protocol.initial(now)
    handle.deadline = ports.protocol.deadline(this.phase)
  }

  /** `front`, made when needed and dropped once empty: an idle session has nothing ahead of the mailbox. */
  private ahead(): Array<Input> {
    return this.front ??= []
  }

  private nextAhead(): Input | undefined {
    const front = this.front
    if (front === undefined) return undefined
    const input = front.shift()
    if (front.length === 0) this.front = undefined
    return input
  }

  get isClosed(): boolean {
    return this.phase._tag === "Closed"
  }

  /**
   * The rest of the session, one input at a time until it is closed: a plain continuation loop (no
   * generator). While closing (the mailbox is shut) it waits for the machine's own deadline (a
   * retried save) instead of the mailbox.
   */
  run(): Effect.Effect<void> {
    return Effect.suspend(() => this.proceed())
  }

  private proceed(): Effect.Effect<void> {
    switch (this.phase._tag) {
      case "Closed":
        return Effect.void
      case "Closing":
        // Answering our close, the client's acks still come through the mailbox (the ticker's Tick too).
        if (this.phase.stage._tag === "Answering") return this.handle.mailbox.take(this)
        return Effect.andThen(this.untilDeadline(), this.receive({ _tag: "Tick" }))
      default:
        return this.handle.mailbox.take(this)
    }
  }

  /** An input from the mailbox (or the closing deadline), then the rest of the session. */
  receive(input: MailboxInput): Effect.Effect<void> {
    // Made for each input, not kept: an idle session holds no continuation.
    return Effect.andThen(this.feed(input), () => this.proceed())
  }

  /**
   * Bring an interrupted session to its end: as if the socket closed, with a few save attempts.
   * One that still has not saved what its client did not ack is ended without it: `cut` says so
   * (its uaid, hashed), the node deciding how to report it.
   */
  finish(cut: (uaidHash: string | null) => Effect.Effect<void> = cutSession): Effect.Effect<void> {
    if (this.isClosed) return Effect.void
    const attempt = (left: number): Effect.Effect<void> =>
      Effect.suspend(() =>
        this.phase._tag !== "Closing" || left === 0
          ? Effect.void
          : Effect.andThen(this.untilDeadline(1_000), Effect.andThen(this.feed({ _tag: "Tick" }), attempt(left - 1)))
      )
    return this.feed({ _tag: "SocketClosed" }).pipe(
      Effect.andThen(attempt(3)),
      Effect.andThen(Effect.suspend(() =>
        this.isClosed ? Effect.void : Effect.andThen(cut(this.uaidHash()), this.enter({ _tag: "Closed" }) ?? Effect.void)
      ))
    )
  }

  /** Sleep until the phase's deadline (at most `atMostMs`). */
  private untilDeadline(atMostMs = Number.POSITIVE_INFINITY): Effect.Effect<void> {
    return Effect.flatMap(Clock.currentTimeMillis, (now) => {
      const wait = Math.min(atMostMs, this.handle.deadline - now)
      return Number.isFinite(wait) ? Effect.sleep(Math.max(0, wait)) : Effect.die(new Error(`no deadline in phase ${this.phase._tag}`))
    })
  }

  /**
   * One input and everything it causes (command results, replays, the close sequence). Steps that
   * ask for no command and log nothing (a delivery, an ack: nearly all of them) follow one another
   * in a plain loop, with no Effect of their own; the loop yields for a command or a log.
   */
  feed(first: Input): Effect.Effect<void> {
    let input: Input | undefined = first
    const next = Effect.suspend(() => {
      input = this.nextAhead()
      return loop
    })
    const loop: Effect.Effect<void> = Clock.clockWith((clock) => {
      while (input !== undefined) {
        const current: Input = input
        const now = clock.currentTimeMillisUnsafe()
        const transition = this.ports.protocol.step(this.phase, current, now, this.ports.broadcasts())
        const logs = this.apply(current, transition)
        const command = transition.command
        if (command === undefined && logs === undefined) {
          input = this.nextAhead()
          continue
        }
        const rest = command === undefined ? next : Effect.andThen(this.carriedOut(command, now), next)
        return logs === undefined ? rest : Effect.andThen(logs, rest)
      }
      return Effect.void
    })
    // The boundary: a bug (a throw in `step`, a defect in a command) ends this session, never the node.
    return loop.pipe(Effect.catchCause((cause) => this.defect(cause)))
  }

  /** Carry out a transition (but its command); what it has to log, if anything. */
  private apply(input: Input, t: Transition): Effect.Effect<void> | undefined {
    const before = this.phase
    for (const text of t.frames) this.transport.sendText(text)
    for (const event of t.events) this.record(event)
    for (const signal of t.signals) this.signal(signal)
    if (t.close !== undefined) this.closeSocket(t.close)
    const frames = this.ports.logFrames ? this.logStep(input, t) : undefined
    const ended = this.enter(t.phase, before)
    return frames === undefined ? ended : ended === undefined ? frames : Effect.andThen(frames, ended)
  }

  /**
   * Move to `phase`; on entering `Closing`/`Closed`, leave the node; on entering its collecting
   * stage (or `Closed`), shut the mailbox; at `Closed`, the summary to log.
   */
  private enter(phase: Phase, before: Phase = this.phase): Effect.Effect<void> | undefined {
    this.phase = phase
    this.handle.deadline = this.ports.protocol.deadline(phase)
    this.handle.unackedDirect = isLive(phase) ? directOutstanding(phase.session.acks) : 0
    const collecting = phase._tag === "Closing" && phase.stage._tag === "Collecting" && (before._tag !== "Closing" || before.stage._tag === "Answering")
    if (before._tag === phase._tag && !collecting) return undefined
    if (phase._tag === "Closing" || phase._tag === "Closed") this.ports.registry.remove(this.handle)
    if (collecting || phase._tag === "Closed") this.handle.mailbox.close()
    if (collecting) {
      // Deliveries still queued were accepted by the router port (the endpoint did not store them).
      for (let event = this.handle.mailbox.poll(); event !== undefined; event = this.handle.mailbox.poll()) {
        if (event._tag === "Delivery") this.ahead().push(event)
      }
      this.ahead().push({ _tag: "MailboxDrained" })
    }
    if (phase._tag !== "Closed" || this.summary.uaid === undefined) return undefined
    return Effect.logInfo("Session").pipe(Effect.annotateLogs(summaryFields(this.summary, opaqueId)))
  }

  private record(event: DomainEvent): void {
    this.summary = foldSummary(this.summary, event)
    foldIntoHandle(this.handle, event)
    this.ports.events.record(event)
  }

  private signal(signal: Signal): void {
    switch (signal._tag) {
      case "Ping":
        return this.transport.sendPing()
      case "Claim":
        this.handle.uaid = signal.uaid
        this.handle.connectedAt = signal.connectedAt
        this.handle.minUrgency = signal.minUrgency
        return this.ports.registry.register(this.handle)
      case "DisconnectPeer":
        return this.ports.peers.disconnect(signal.nodeId, signal.uaid, signal.connectedAt)
      case "NotifyPeer":
        return this.ports.peers.notify(signal.nodeId, signal.uaid)
      case "Replay":
        for (const message of signal.messages) this.ahead().push({ _tag: "Frame", message, admitted: signal.admitted })
        return
      case "PauseReading":
        return this.transport.pause()
      case "ResumeReading":
        return this.transport.resume()
    }
  }

  private closeSocket(kind: CloseKind): void {
    const { code, reason } = closeFrame(kind)
    this.transport.sendClose(code, reason)
  }

  private uaidHash(): string | null {
    return this.summary.uaid === undefined ? null : opaqueId(this.summary.uaid)
  }

  /** A bug: close 1011, log it once, and still save what is unacked (the close sequence starts afresh). */
  private defect(cause: Cause.Cause<unknown>): Effect.Effect<void> {
    if (Cause.hasInterruptsOnly(cause)) return Effect.failCause(cause as Cause.Cause<never>)
    const live = isLive(this.phase) || (this.phase._tag === "Closing" && this.phase.stage._tag === "Answering")
    this.front = undefined
    this.closeSocket("internal-error")
    const log = Effect.logError("session failed").pipe(
      Effect.annotateLogs({ uaid_hash: this.uaidHash(), phase: this.phase._tag, cause: Cause.pretty(cause) })
    )
    if (live) return Effect.andThen(log, this.feed({ _tag: "SocketClosed" }))
    return Effect.andThen(log, this.enter({ _tag: "Closed" }) ?? Effect.void)
  }

  private logStep(input: Input, t: Transition): Effect.Effect<void> {
    return Effect.logDebug("session event").pipe(
      Effect.annotateLogs({
        uaid_hash: this.uaidHash(),
        event: input._tag === "Frame" ? describeFrame(input.message) : input._tag,
        sent: t.frames.map((text) => describeFrame(JSON.parse(text) as Record<string, unknown>))
      })
    )
  }

  // ── commands ──────────────────────────────────────────────────────────────────────────────────

  /**
   * A command run and its result queued as the next input. A step of the close sequence runs to its
   * end and its result is kept even when the fiber is interrupted meanwhile (the node's shutdown):
   * `finish` then goes on from that result, where an interrupt between a write and its result
   * would leave the sequence waiting for a result that never comes. Bounded: each storage
   * operation by `storage_timeout`.
   */
  private carriedOut(command: Command, now: number): Effect.Effect<void> {
    const queued = Effect.map(this.execute(command, now), (result) => void this.ahead().unshift(result))
    return this.phase._tag === "Closing" ? Effect.uninterruptible(queued) : queued
  }

  /** Run a command; storage failures become `CommandFailed` (the machine decides what follows). */
  private execute(command: Command, now: number): Effect.Effect<CommandResult> {
    return this.perform(command, now).pipe(
      Effect.catchTag("StorageError", (error) =>
        // An open breaker said so once, when it opened: its refusals are no news.
        (error.reason._tag === "BreakerOpen" ? Effect.logDebug : Effect.logWarning)("storage failed").pipe(
          Effect.annotateLogs({
            command: command._tag,
            operation: error.operation,
            ...("table" in command ? { table: command.table } : {}),
            reason: error.reason._tag,
            cause: failureText(error)
          }),
          Effect.as<CommandResult>({ _tag: "CommandFailed", command })
        ))
    )
  }

  private perform(command: Command, now: number): Effect.Effect<CommandResult, StorageError> {
    const { storage } = this.ports
    switch (command._tag) {
      case "MintUaid":
        return Effect.sync(() => ({ _tag: "UaidMinted", uaid: newUaid() }))
      case "ReadUser":
        return Effect.map(storage.getUser(command.uaid), (user) => ({ _tag: "UserRead", user }))
      case "WriteUser": {
        // `last_connect` spreads hot keys with a random part: a storage convention, stamped here.
        const stamped = { ...command, user: { ...command.user, lastConnect: lastConnectValue(now) } }
        const write = command.purpose._tag === "Resume" ? storage.resumeUser(stamped.user) : storage.registerUser(stamped.user)
        return Effect.map(write, (written) => ({ _tag: "UserWritten", command: stamped, written }))
      }
      case "DropUser":
        return Effect.map(storage.dropUser(command.uaid, { ifConnectedAt: command.connectedAt }), (dropped) => ({
          _tag: "UserDropped",
          dropped
        }))
      case "MakeEndpoint":
        return Effect.map(
          this.ports.endpoints.makeEndpoint(command.uaid, command.channelId, command.rawKey),
          (endpoint) => ({ _tag: "EndpointMade", command, endpoint })
        )
      case "AddChannel":
        return Effect.map(
          storage.addChannel(command.uaid, command.table, command.registering.channelId, this.ports.options.maxChannels),
          (added) => ({ _tag: "ChannelAdded", registering: command.registering, added })
        )
      case "RemoveChannel":
        return Effect.as(storage.removeChannel(command.uaid, command.table, command.channelId), { _tag: "ChannelRemoved", command })
      case "WriteUrgency":
        return Effect.as(storage.updateUser(command.uaid, { urgency: command.min }), { _tag: "UrgencyWritten", command })
      case "ReadPage": {
        const read = command.rows === "first"
          ? storage.fetchMessages(command.uaid, command.table, command.limit)
          : storage.fetchTimestampMessages(command.uaid, command.table, command.after, command.limit)
        return Effect.map(read, (page) => ({ _tag: "PageRead", command, messages: page.messages, lastSortKey: page.lastSortKey, more: page.more }))
      }
      case "TombstoneAcked":
        return Effect.as(this.tombstoneAcked(command.uaid, command.messages), { _tag: "AckedTombstoned" })
      case "TakeMessage": {
        const { notification: n, table } = command.row
        return Effect.map(storage.deleteMessage(command.uaid, table, messageKeyOf(n), n.version), (taken) => ({ _tag: "MessageTaken", taken }))
      }
      case "ReadChannels":
        return Effect.map(storage.getChannels(command.uaid, command.table), (channels) => ({ _tag: "ChannelsRead", channels }))
      case "AddChannels":
        return Effect.as(storage.addChannels(command.uaid, command.table, command.channels), { _tag: "ChannelsAdded" })
      case "PointRecord":
        return Effect.as(storage.updateUser(command.uaid, { currentMonth: command.table, lastConnect: lastConnectValue(now) }), { _tag: "RecordPointed" })
      case "SaveMessages":
        return Effect.map(storage.saveMessages(command.uaid, command.table, command.messages), (saved) => ({ _tag: "MessagesSaved", saved }))
      case "ClearNodeId":
        return Effect.as(storage.clearNodeId(command.uaid, this.ports.options.routerUrl, command.connectedAt), { _tag: "NodeCleared" })
    }
  }

  /**
   * Acked stored rows, per table: each becomes its tombstone if it still holds the acked version (a
   * newer message may have replaced a topic's), so that a save of it retried by another session
   * whose first answer was lost does not write it again.
   */
  private tombstoneAcked(uaid: string, rows: ReadonlyArray<StoredUnacked>): Effect.Effect<void, StorageError> {
    const { storage } = this.ports
    const byTable = new Map<string, Array<AckedRow>>()
    for (const { notification: n, table } of rows) {
      let acked = byTable.get(table)
      if (acked === undefined) byTable.set(table, acked = [])
      acked.push({ key: messageKeyOf(n), version: n.version })
    }
    return Effect.forEach(byTable, ([table, acked]) => storage.ackMessages(uaid, table, acked), { discard: true })
  }
}
