/**
 * One WebSocket connection as an explicit state machine, run by one fiber that folds the events of
 * its mailbox into its state: AwaitingHello → Identified (→ Migrating month) → Closed.
 *
 * Delivery rules (protocol-notes §1.5, §1.8 with the decisions of §0):
 * - stored messages are drained after hello and after every check-storage poke, a page at a time
 *   (topic messages, then timestamp order); the next page is fetched once the previous one is acked;
 * - an acked stored message is deleted (conditionally on its version, so a newer message that replaced
 *   a topic is kept); an acked direct message is just forgotten;
 * - unacked direct messages are saved to storage when the session ends, then the user is re-read and
 *   its new node (if it reconnected elsewhere) is poked;
 * - more than `msgLimit` messages from storage in one drain → the user is dropped, close 1000.
 */
import { Clock, Effect, Schedule } from "effect"
import type { DomainEvent } from "../domain/events.ts"
import { isCanonicalChannelId, newUaid, parseChannelId, parseUaid } from "../domain/ids.ts"
import { chidMessageId, isExpired, type Notification } from "../domain/notification.ts"
import { lastConnectValue, USER_RECORD_VERSION, type UserRecord } from "../domain/user.ts"
import type { EventLogService } from "../observability/EventLog.ts"
import type { StorageError, StorageService } from "../storage/Storage.ts"
import { closeFrame, type CloseKind, SessionClose } from "./close.ts"
import { Mailbox } from "./mailbox.ts"
import { opaqueId } from "../observability/opaque.ts"
import {
  type ClientMessage,
  describeFrame,
  helloReply,
  notificationFrame,
  PING_REPLY,
  registerReply,
  unregisterReply
} from "./messages.ts"

// ── what a session talks to ─────────────────────────────────────────────────────────────────────

/** The socket, as the session sees it. `close` sends a close frame; the transport ends TCP after a grace. */
export interface Transport {
  readonly send: (text: string) => void
  readonly close: (code: number, reason: string) => void
  /** A WebSocket-level ping frame (keepalive); the pong comes back as a `Pong` event. */
  readonly ping: () => void
}

export type SessionEvent =
  | { readonly _tag: "Frame"; readonly message: ClientMessage }
  | { readonly _tag: "BadFrame"; readonly detail: string }
  | { readonly _tag: "BinaryFrame" }
  | { readonly _tag: "Delivery"; readonly notification: Notification }
  | { readonly _tag: "CheckStorage" }
  | { readonly _tag: "Tick" }
  | { readonly _tag: "Pong" }
  | { readonly _tag: "Kick"; readonly kind: "ghost" | "shutdown" }
  | { readonly _tag: "SocketClosed" }

export interface SessionOptions {
  /** This node's router URL: the `node_id` written to router records. */
  readonly routerUrl: string
  readonly helloTimeoutMs: number
  readonly autoPingIntervalMs: number
  readonly autoPingTimeoutMs: number
  readonly minPingIntervalMs: number
  readonly msgLimit: number
  readonly clientChannelCapacity: number
  readonly noTableRotation: boolean
  /** Messages per storage page (RS: 10). */
  readonly pageSize: number
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

export interface EndpointMaker {
  /** The push endpoint URL for a channel, bound to the VAPID key when given; undefined for a bad key. */
  readonly makeEndpoint: (uaid: string, channelId: string, key: string | undefined) => Effect.Effect<string | undefined>
}

export interface SessionPorts {
  readonly storage: StorageService
  readonly endpoints: EndpointMaker
  readonly registry: SessionRegistry
  readonly peers: Peers
  readonly events: EventLogService
  readonly options: SessionOptions
  /** Log every frame in and out (log-safe summaries) at debug level. */
  readonly logFrames: boolean
}

/** What the node keeps of a session: its mailbox, who it is, and when its next timer is due. */
export class SessionHandle {
  uaid: string | undefined = undefined
  connectedAt = 0
  /** Ms time at which the node's ticker sends a `Tick`. */
  deadline: number
  readonly mailbox: Mailbox<SessionEvent>

  constructor(capacity: number, deadline: number) {
    this.mailbox = new Mailbox<SessionEvent>(capacity, isDelivery)
    this.deadline = deadline
  }
}

const isDelivery = (event: SessionEvent): boolean => event._tag === "Delivery"

// ── state ───────────────────────────────────────────────────────────────────────────────────────

interface Unacked {
  readonly notification: Notification
  /** The table a stored message came from; undefined for direct messages. */
  readonly table: string | undefined
}

/** Where the storage drain is: tables still to read, topic or timestamp phase, position. */
interface Drain {
  tables: Array<string>
  phase: "topic" | "timestamp"
  after: number | undefined
  /** A poke arrived mid-drain: start over once this pass ends (a message may sit behind `after`). */
  again: boolean
  sentFromStorage: number
}

type Phase = "awaiting-hello" | "identified" | "migrating" | "closed"

class State {
  phase: Phase = "awaiting-hello"
  readonly createdAt: number
  uaid = ""
  connectedAt = 0
  /** The router record once written; undefined for a new uaid until its first register. */
  user: UserRecord | undefined = undefined
  /** The message table the user lives in now. */
  table = ""
  // Allocated on first use: an idle connection carries none of these (memory per connection).
  private unackedMap: Map<string, Unacked> | undefined = undefined
  private newestTopicMap: Map<string, string> | undefined = undefined
  get unacked(): Map<string, Unacked> {
    return (this.unackedMap ??= new Map())
  }
  /** The last version sent per `chid:topic`: an older unacked topic message must not be saved over it. */
  get newestTopic(): Map<string, string> {
    return (this.newestTopicMap ??= new Map())
  }
  storedOutstanding = 0
  drain: Drain | undefined = undefined
  /** Set while migrating: the month we come from; commands wait in `deferred` until it is done. */
  migrateFrom: string | undefined = undefined
  deferred: Array<ClientMessage> | undefined = undefined
  lastActivity: number
  lastClientPing: number | undefined = undefined
  // The per-session summary logged at disconnect.
  directAcked = 0
  directStored = 0
  storedRetrieved = 0
  storedAcked = 0
  nacks = 0
  registers = 0
  unregisters = 0
  closeReason = "client"
  pingSentAt: number | undefined = undefined

  constructor(now: number) {
    this.createdAt = now
    this.lastActivity = now
  }
}

type Step = Effect.Effect<void, SessionClose | StorageError>

const close = (kind: CloseKind) => Effect.fail(new SessionClose({ kind }))

// ── the machine ─────────────────────────────────────────────────────────────────────────────────

/**
 * Run a session until it closes: the connection's fiber. Cleanup also runs when the node interrupts
 * the fiber (shutdown), so unacked messages are saved either way.
 */
export const runSession = (ports: SessionPorts, transport: Transport, handle: SessionHandle) =>
  Effect.flatMap(Clock.currentTimeMillis, (now) => {
    const machine = makeSessionMachine(ports, transport, handle, now)
    return machine.run().pipe(Effect.ensuring(Effect.suspend(() => machine.cleanup())))
  })

/** The machine without its loop: tests feed it events one at a time. */
export const makeSessionMachine = (ports: SessionPorts, transport: Transport, handle: SessionHandle, now: number) => {
  handle.deadline = now + ports.options.helloTimeoutMs
  return new Machine(ports, transport, handle, new State(now))
}

export type SessionMachine = ReturnType<typeof makeSessionMachine>

class Machine {
  private readonly ports: SessionPorts
  private readonly transport: Transport
  private readonly handle: SessionHandle
  private readonly s: State
  /** Frames sent during the current step, when `logFrames`. */
  private sent: Array<unknown> | undefined = undefined

  constructor(ports: SessionPorts, transport: Transport, handle: SessionHandle, state: State) {
    this.ports = ports
    this.transport = transport
    this.handle = handle
    this.s = state
  }

  /**
   * Fold mailbox events into the state until the session is closed. A plain continuation loop rather
   * than a generator: an idle connection's fiber then holds only its pending `take`.
   */
  run(): Effect.Effect<void> {
    const next: Effect.Effect<void> = Effect.suspend(() =>
      this.s.phase === "closed"
        ? Effect.void
        : Effect.flatMap(this.handle.mailbox.take(), (event) =>
          Effect.flatMap(Clock.currentTimeMillis, (now) => Effect.andThen(this.handleEvent(event, now), next))
        )
    )
    return next
  }

  get isClosed(): boolean {
    return this.s.phase === "closed"
  }

  /** One transition; a failure closes the session with its close code. */
  handleEvent(event: SessionEvent, now: number): Effect.Effect<void> {
    // Before `step`: parts of a transition (a direct delivery) send while it is being built.
    if (this.ports.logFrames) this.sent = []
    const transition = this.step(event, now).pipe(
      Effect.catchTag("SessionClose", (e) => Effect.sync(() => this.closeWith(e.kind))),
      Effect.catchTag("StorageError", (e) =>
        Effect.andThen(
          Effect.logWarning("storage failed; closing the session").pipe(Effect.annotateLogs({ operation: e.operation })),
          Effect.sync(() => this.closeWith("storage-error"))
        ))
    )
    if (!this.ports.logFrames) return transition
    return Effect.andThen(transition, () => {
      const sent = this.sent ?? []
      this.sent = undefined
      return Effect.logDebug("session event").pipe(
        Effect.annotateLogs({
          uaid_hash: this.s.uaid === "" ? null : opaqueId(this.s.uaid),
          event: event._tag === "Frame" ? describeFrame(event.message) : event._tag,
          sent: sent
        })
      )
    })
  }

  /** Send a frame to the client (and keep a log-safe summary of it when logging frames). */
  private out(text: string): void {
    this.transport.send(text)
    this.sent?.push(describeFrame(JSON.parse(text) as Record<string, unknown>))
  }

  private record(event: DomainEvent): void {
    this.ports.events.record(event)
  }

  private step(event: SessionEvent, now: number): Step {
    const s = this.s
    switch (event._tag) {
      case "Frame":
        s.lastActivity = now
        s.pingSentAt = undefined
        this.scheduleKeepalive()
        return this.onFrame(event.message, now)
      case "BadFrame":
        return close("invalid-json")
      case "BinaryFrame":
        return close("binary-frame")
      case "Delivery":
        return this.onDelivery(event.notification, now)
      case "CheckStorage":
        return s.phase === "awaiting-hello" ? Effect.void : this.requestDrain()
      case "Tick":
        return this.onTick(now)
      case "Pong":
        s.pingSentAt = undefined
        s.lastActivity = now
        this.scheduleKeepalive()
        return Effect.void
      case "Kick":
        return close(event.kind)
      case "SocketClosed":
        return Effect.sync(() => this.finish())
    }
  }

  /** Send the close frame and end the session (the transport ends TCP after its grace). */
  closeWith(kind: CloseKind): void {
    const { code, reason } = closeFrame(kind)
    this.s.closeReason = reason
    this.transport.close(code, reason)
    if (this.s.uaid !== "") {
      this.record({ type: "session.closed.1", uaid: this.s.uaid, data: { code, reason } })
    }
    this.finish()
  }

  private finish(): void {
    this.s.phase = "closed"
    this.handle.mailbox.close()
    this.handle.deadline = Number.POSITIVE_INFINITY
  }

  // ── timers ──────────────────────────────────────────────────────────────────────────────────

  private scheduleKeepalive(): void {
    const { options } = this.ports
    const s = this.s
    this.handle.deadline = s.pingSentAt !== undefined
      ? s.pingSentAt + options.autoPingTimeoutMs
      : s.lastActivity + options.autoPingIntervalMs
  }

  private onTick(now: number): Step {
    const s = this.s
    const { options } = this.ports
    if (s.phase === "awaiting-hello") {
      if (now >= s.createdAt + options.helloTimeoutMs) return close("hello-timeout")
      this.handle.deadline = s.createdAt + options.helloTimeoutMs
      return Effect.void
    }
    if (s.pingSentAt !== undefined) {
      if (now >= s.pingSentAt + options.autoPingTimeoutMs) return close("pong-timeout")
    } else if (now >= s.lastActivity + options.autoPingIntervalMs) {
      this.transport.ping()
      s.pingSentAt = now
    }
    this.scheduleKeepalive()
    return Effect.void
  }

  // ── client frames ───────────────────────────────────────────────────────────────────────────

  private onFrame(message: ClientMessage, now: number): Step {
    const s = this.s
    if (s.phase === "awaiting-hello") {
      return message.messageType === "hello" ? this.onHello(message, now) : close("expected-hello")
    }
    switch (message.messageType) {
      case "hello":
        return close("already-hello")
      case "ping":
        return this.onPing(now)
      case "ack":
        return this.onAck(message.updates)
      case "nack":
        s.nacks++
        this.record({
          type: "notification.nacked.1",
          uaid: s.uaid,
          data: { version: message.version, code: message.code ?? 0 }
        })
        return Effect.void
      case "broadcast_subscribe":
        // No broadcasts exist yet: nothing to reply (Firefox does not expect an answer).
        return Effect.void
      case "register":
      case "unregister":
        if (s.phase === "migrating") {
          // The seed: new commands are accepted only once the month switch is done.
          ;(s.deferred ??= []).push(message)
          return Effect.void
        }
        return message.messageType === "register" ? this.onRegister(message, now) : this.onUnregister(message)
    }
  }

  private onPing(now: number): Step {
    const s = this.s
    if (s.lastClientPing !== undefined && now - s.lastClientPing < this.ports.options.minPingIntervalMs) {
      return close("excessive-ping")
    }
    s.lastClientPing = now
    this.out(PING_REPLY)
    return Effect.void
  }

  private onHello(message: Extract<ClientMessage, { messageType: "hello" }>, now: number): Step {
    const self = this
    const { storage, options, peers, registry } = this.ports
    const s = this.s
    return Effect.gen(function*() {
      const claimed = typeof message.uaid === "string" ? parseUaid(message.uaid) : undefined
      const existing = claimed === undefined ? undefined : yield* self.loadExisting(claimed, now)
      const current = yield* storage.currentMessageTable
      s.connectedAt = now
      if (existing === undefined) {
        s.uaid = newUaid()
        s.table = current
        self.record({ type: "client.hello.1", uaid: s.uaid, data: { kind: claimed === undefined ? "new" : "reassigned" } })
      } else {
        const user: UserRecord = {
          ...existing,
          nodeId: options.routerUrl,
          connectedAt: now,
          lastConnect: lastConnectValue(now)
        }
        if (!(yield* storage.registerUser(user))) return yield* close("already-connected")
        if (existing.nodeId !== undefined && existing.nodeId !== options.routerUrl) {
          peers.disconnect(existing.nodeId, existing.uaid, existing.connectedAt)
        }
        s.uaid = existing.uaid
        s.user = user
        s.table = existing.currentMonth ?? current
        self.record({ type: "client.hello.1", uaid: s.uaid, data: { kind: "existing" } })
      }
      self.handle.uaid = s.uaid
      self.handle.connectedAt = now
      registry.register(self.handle)
      s.phase = "identified"
      self.scheduleKeepalive()
      self.out(helloReply(s.uaid))
      if (s.user === undefined) return
      if (!options.noTableRotation && s.table !== current) {
        s.phase = "migrating"
        s.migrateFrom = s.table
      }
      yield* self.requestDrain()
    })
  }

  /** The user record for a claimed uaid, when it can be resumed; undefined means "give a new uaid". */
  private loadExisting(uaid: string, now: number): Effect.Effect<UserRecord | undefined, SessionClose | StorageError> {
    const { storage, options } = this.ports
    const self = this
    return Effect.gen(function*() {
      const user = yield* storage.getUser(uaid)
      if (user === undefined || user.routerType !== "webpush") return undefined
      if (user.connectedAt > now) return yield* close("already-connected")
      if (options.noTableRotation) return user
      const active = yield* storage.activeMessageTables
      if (user.currentMonth !== undefined && active.includes(user.currentMonth)) return user
      // The seed: a user whose month table is gone (or unknown) cannot be served; it starts over.
      yield* storage.dropUser(uaid)
      self.record({ type: "uaid.reset.1", uaid, data: { reason: "stale_month" } })
      return undefined
    })
  }

  private onRegister(message: Extract<ClientMessage, { messageType: "register" }>, now: number): Step {
    const self = this
    const { storage, endpoints, options } = this.ports
    const s = this.s
    return Effect.gen(function*() {
      if (!isCanonicalChannelId(message.channelID)) {
        self.out(registerReply(message.channelID, 401, ""))
        return
      }
      const endpoint = yield* endpoints.makeEndpoint(s.uaid, message.channelID, message.key ?? undefined)
      if (endpoint === undefined) {
        self.out(registerReply(message.channelID, 400, "Failed to generate endpoint"))
        return
      }
      const stored = yield* Effect.gen(function*() {
        if (s.user === undefined) {
          const user: UserRecord = {
            uaid: s.uaid,
            routerType: "webpush",
            routerData: {},
            connectedAt: s.connectedAt,
            nodeId: options.routerUrl,
            lastConnect: lastConnectValue(now),
            currentMonth: s.table,
            recordVersion: USER_RECORD_VERSION
          }
          if (!(yield* storage.registerUser(user))) return false
          s.user = user
        }
        yield* storage.addChannel(s.uaid, s.table, message.channelID)
        return true
      }).pipe(Effect.catchTag("StorageError", () => Effect.succeed(false)))
      if (!stored) {
        self.out(registerReply(message.channelID, 500, ""))
        return
      }
      s.registers++
      self.record({ type: "channel.registered.1", uaid: s.uaid, data: { channelId: message.channelID } })
      self.out(registerReply(message.channelID, 200, endpoint))
    })
  }

  private onUnregister(message: Extract<ClientMessage, { messageType: "unregister" }>): Step {
    const self = this
    const s = this.s
    const channelId = parseChannelId(message.channelID)
    if (channelId === undefined) {
      this.out(unregisterReply(message.channelID, 401))
      return Effect.void
    }
    return Effect.gen(function*() {
      const ok = s.user === undefined ||
        (yield* self.ports.storage.removeChannel(s.uaid, s.table, channelId).pipe(
          Effect.as(true),
          Effect.catchTag("StorageError", () => Effect.succeed(false))
        ))
      if (ok) {
        s.unregisters++
        self.record({ type: "channel.unregistered.1", uaid: s.uaid, data: { channelId, code: message.code } })
      }
      self.out(unregisterReply(channelId, ok ? 200 : 500))
    })
  }

  private onAck(updates: ReadonlyArray<{ readonly version: string; readonly code?: number }>): Step {
    const self = this
    const s = this.s
    const { storage } = this.ports
    return Effect.gen(function*() {
      for (const update of updates) {
        const entry = s.unacked.get(update.version)
        if (entry === undefined) continue
        s.unacked.delete(update.version)
        const n = entry.notification
        if (entry.table !== undefined) {
          s.storedOutstanding--
          s.storedAcked++
          yield* storage.deleteMessage(s.uaid, entry.table, chidMessageId(n), n.version)
        } else {
          s.directAcked++
        }
        self.record({
          type: "notification.acked.1",
          uaid: s.uaid,
          data: { version: n.version, code: update.code ?? 100, source: entry.table === undefined ? "direct" : "stored" }
        })
      }
      if (s.storedOutstanding === 0 && s.drain !== undefined) yield* self.continueDrain()
    })
  }

  // ── deliveries ──────────────────────────────────────────────────────────────────────────────

  private onDelivery(n: Notification, now: number): Step {
    const s = this.s
    if (s.phase === "awaiting-hello") return Effect.void
    // TTL 0 means "only if connected now": it is now, so it goes out.
    if (n.ttl > 0 && isExpired(n, Math.floor(now / 1000))) {
      this.record({ type: "notification.expired.1", uaid: s.uaid, data: { version: n.version } })
      return Effect.void
    }
    this.send(n, undefined)
    return Effect.void
  }

  private send(n: Notification, table: string | undefined): void {
    this.remember(n, table)
    this.out(notificationFrame(n))
    this.record({
      type: "notification.delivered.1",
      uaid: this.s.uaid,
      data: { channelId: n.channelId, version: n.version, source: table === undefined ? "direct" : "stored" }
    })
  }

  /** Track a message until it is acked. TTL 0 direct messages are fire-and-forget: nothing to save. */
  private remember(n: Notification, table: string | undefined): void {
    const s = this.s
    if (table !== undefined || n.ttl > 0) {
      s.unacked.set(n.version, { notification: n, table })
      if (table !== undefined) s.storedOutstanding++
    }
    if (n.topic !== undefined) s.newestTopic.set(`${n.channelId}:${n.topic}`, n.version)
  }

  // ── the storage drain ───────────────────────────────────────────────────────────────────────

  /** A reason to look at storage: start a drain, or remember to go again if one is running. */
  private requestDrain(): Step {
    const s = this.s
    if (s.user === undefined) return Effect.void
    if (s.drain !== undefined) {
      s.drain.again = true
      return Effect.void
    }
    s.drain = { tables: this.drainTables(), phase: "topic", after: undefined, again: false, sentFromStorage: 0 }
    return s.storedOutstanding === 0 ? this.continueDrain() : Effect.void
  }

  private drainTables(): Array<string> {
    const s = this.s
    return s.migrateFrom !== undefined ? [s.migrateFrom] : [s.table]
  }

  /** Read the next page (the previous one is fully acked); when every table is read, finish the drain. */
  private continueDrain(): Step {
    const self = this
    const s = this.s
    const { storage, options } = this.ports
    return Effect.gen(function*() {
      while (s.drain !== undefined) {
        const drain = s.drain
        const table = drain.tables[0]
        if (table === undefined) {
          if (drain.again) {
            s.drain = { tables: self.drainTables(), phase: "topic", after: undefined, again: false, sentFromStorage: drain.sentFromStorage }
            continue
          }
          s.drain = undefined
          if (s.phase === "migrating") yield* self.finishMigration()
          return
        }
        let page: ReadonlyArray<Notification>
        if (drain.phase === "topic") {
          page = yield* storage.fetchTopicMessages(s.uaid, table, options.pageSize)
          if (page.length === 0) {
            drain.phase = "timestamp"
            continue
          }
        } else {
          const result = yield* storage.fetchTimestampMessages(s.uaid, table, drain.after, options.pageSize)
          page = result.messages
          if (page.length === 0) {
            if (result.lastSortKey !== undefined) {
              // A page of expired rows only: keep reading after it.
              drain.after = result.lastSortKey
              continue
            }
            drain.tables.shift()
            drain.phase = "topic"
            drain.after = undefined
            continue
          }
          drain.after = result.lastSortKey
        }
        drain.sentFromStorage += page.length
        s.storedRetrieved += page.length
        if (drain.sentFromStorage > options.msgLimit) return yield* self.resetUser()
        for (const n of page) {
          if (!s.unacked.has(n.version)) self.send(n, table)
        }
        if (s.storedOutstanding > 0) return
      }
    })
  }

  /** Too many stored messages: drop the user; the next hello gets a new uaid. */
  private resetUser(): Step {
    const self = this
    return Effect.gen(function*() {
      yield* self.ports.storage.dropUser(self.s.uaid)
      self.record({ type: "uaid.reset.1", uaid: self.s.uaid, data: { reason: "too_many_messages" } })
      self.s.user = undefined
      self.s.unacked.clear()
      self.s.storedOutstanding = 0
      return yield* close("uaid-reset")
    })
  }

  /**
   * The old month is drained and acked: copy the channels to the current month, point the router
   * record at it, sweep the old table once more (an endpoint may have stored there meanwhile), then
   * accept the commands that waited, and drain the new month.
   */
  private finishMigration(): Step {
    const self = this
    const s = this.s
    const { storage } = this.ports
    return Effect.gen(function*() {
      const from = s.migrateFrom as string
      const to = yield* storage.currentMessageTable
      const channels = yield* storage.getChannels(s.uaid, from)
      yield* storage.addChannels(s.uaid, to, channels)
      const now = yield* Clock.currentTimeMillis
      yield* storage.updateUser(s.uaid, {
        currentMonth: to,
        lastConnect: lastConnectValue(now)
      })
      s.user = { ...(s.user as UserRecord), currentMonth: to }
      s.table = to
      s.migrateFrom = undefined
      s.phase = "identified"
      self.record({ type: "month.migrated.1", uaid: s.uaid, data: { from, to } })
      s.drain = { tables: [from, to], phase: "topic", after: undefined, again: false, sentFromStorage: 0 }
      const deferred = s.deferred ?? []
      s.deferred = undefined
      for (const message of deferred) yield* self.onFrame(message, now)
      if (s.storedOutstanding === 0 && s.drain !== undefined) yield* self.continueDrain()
    })
  }

  // ── the end ─────────────────────────────────────────────────────────────────────────────────

  /**
   * After the socket is gone: leave the registry, save unacked direct messages (and deliveries still
   * queued) re-stamped so they sort after what is stored and do not collide, clear our node id, and
   * poke the user's node if it reconnected meanwhile; then log the session summary.
   */
  cleanup(): Effect.Effect<void> {
    const s = this.s
    const { storage, registry, options } = this.ports
    registry.remove(this.handle)
    if (s.user === undefined) return this.summary()
    // Deliveries still queued were accepted by the router port (the endpoint did not store them).
    for (let event = this.handle.mailbox.poll(); event !== undefined; event = this.handle.mailbox.poll()) {
      if (event._tag === "Delivery") this.remember(event.notification, undefined)
    }
    const self = this
    return Effect.gen(function*() {
      const now = yield* Clock.currentTimeMillis
      const pending: Array<Notification> = []
      for (const { notification, table } of s.unacked.values()) {
        if (table !== undefined || isExpired(notification, Math.floor(now / 1000))) continue
        if (notification.topic === undefined) {
          pending.push({ ...notification, sortkeyTimestamp: now + pending.length })
        } else if (s.newestTopic.get(`${notification.channelId}:${notification.topic}`) === notification.version) {
          pending.push(notification)
        }
      }
      s.unacked.clear()
      s.directStored = pending.length
      const persist = pending.length === 0
        ? Effect.asVoid(storage.clearNodeId(s.uaid, options.routerUrl, s.connectedAt))
        : self.persistUnacked(pending)
      yield* persist.pipe(
        // Saving unacked messages is worth a few tries; after that the loss is logged loudly.
        Effect.retry({ times: 3, schedule: Schedule.exponential(100) }),
        Effect.catchTag("StorageError", (e) =>
          Effect.logError("could not save unacked messages at disconnect").pipe(
            Effect.annotateLogs({ operation: e.operation, messages: pending.length })
          ))
      )
    }).pipe(Effect.andThen(() => this.summary()))
  }

  /**
   * Save messages of a session that ended into the table the router record names; if the user moved
   * to a new month meanwhile, they follow it (the migrating session may have swept already).
   */
  private persistUnacked(pending: ReadonlyArray<Notification>): Effect.Effect<void, StorageError> {
    const s = this.s
    const { storage, peers, options } = this.ports
    const self = this
    return Effect.gen(function*() {
      const before = yield* storage.getUser(s.uaid)
      if (before === undefined) return // dropped meanwhile: nobody to keep them for
      const table = before.currentMonth ?? s.table
      yield* storage.saveMessages(s.uaid, table, pending)
      for (const n of pending) {
        self.record({ type: "notification.stored.1", uaid: s.uaid, data: { channelId: n.channelId, version: n.version, reason: "disconnect" } })
      }
      yield* storage.clearNodeId(s.uaid, options.routerUrl, s.connectedAt)
      const after = yield* storage.getUser(s.uaid)
      if (after?.currentMonth !== undefined && after.currentMonth !== table) {
        yield* storage.saveMessages(s.uaid, after.currentMonth, pending)
        for (const n of pending) yield* storage.deleteMessage(s.uaid, table, chidMessageId(n), n.version)
      }
      if (after?.nodeId !== undefined && after.connectedAt !== s.connectedAt) peers.notify(after.nodeId, s.uaid)
    })
  }

  /** The per-session summary record (protocol-notes §7), once per identified session. */
  private summary(): Effect.Effect<void> {
    const s = this.s
    if (s.uaid === "") return Effect.void
    return Clock.currentTimeMillis.pipe(
      Effect.flatMap((now) =>
        Effect.logInfo("Session").pipe(
          Effect.annotateLogs({
            uaid_hash: opaqueId(s.uaid),
            connection_time: now - s.createdAt,
            direct_acked: s.directAcked,
            direct_storage: s.directStored,
            stored_retrieved: s.storedRetrieved,
            stored_acked: s.storedAcked,
            nacks: s.nacks,
            registers: s.registers,
            unregisters: s.unregisters,
            disconnect_reason: s.closeReason
          })
        )
      )
    )
  }
}
