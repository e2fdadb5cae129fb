/**
 * What a connection can be in: the phases of the protocol (`table.ts`), each its own type carrying
 * only the fields valid in it, and the session an identified connection keeps, grouped by concern
 * (its pending retry included: the commands that are retried are defined here).
 */
import type { Ledger } from "./ledger.ts"
import type { ClientMessage } from "./messages.ts"
import type { Notification, Urgency } from "../domain/notification.ts"
import type { UserRecord } from "../domain/user.ts"

// ── options ─────────────────────────────────────────────────────────────────────────────────────

export interface ProtocolOptions {
  /** This node's router URL: the `node_id` written to router records. */
  readonly routerUrl: string
  readonly helloTimeoutMs: number
  /**
   * After a close frame, how long until the transport ends TCP (Firefox never answers a close frame):
   * acks that arrive before the client answers the close, or this long, are taken.
   */
  readonly closeGraceMs: number
  readonly autoPingIntervalMs: number
  readonly autoPingTimeoutMs: number
  readonly minPingIntervalMs: number
  /** The backlog a client may find at hello (messages accepted before it): more, and the user is dropped. */
  readonly msgLimit: number
  /**
   * Messages a connection may hold for its client, queued or sent and not acked. A poke reads a
   * further page of stored messages while the client holds fewer, acked or not (a client that acks
   * late still gets what was stored for it at once); the router port refuses a delivery beyond it.
   */
  readonly clientChannelCapacity: number
  /** Messages per storage page (autopush: 10). */
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
  /** First retry of a failed storage read, write or month move; doubles up to `storageRetryMaxMs`. */
  readonly storageRetryMs: number
  readonly storageRetryMaxMs: number
  /** How long a session that ended keeps trying to save its unacked messages. */
  readonly saveRetryForMs: number
  /** `require_vapid`: every push must be VAPID-signed, so a register without a key is refused (UnifiedPush's VAPID_REQUIRED). */
  readonly requireVapid: boolean
}

/** Commands waiting for a client beyond which the socket is paused (back-pressure on reading). */
export const HELD_COMMANDS_MAX = 32

/** The node's broadcasts (id → version) as of a step; a new map whenever they change. */
export type BroadcastSet = ReadonlyMap<string, string>

/** Broadcast ids of one client message that are looked at; the rest are ignored. */
export const BROADCASTS_PER_MESSAGE = 100
/** Longer ids cannot name a broadcast (the admin API refuses them): ignored, not echoed. */
export const BROADCAST_ID_MAX = 128

// ── the session ─────────────────────────────────────────────────────────────────────────────────

/** A message sent to the client directly (from an endpoint node), not yet acked. */
interface DirectUnacked {
  readonly _tag: "Direct"
  readonly notification: Notification
}

/** A message sent from a stored row of `table`, not yet acked. */
export interface StoredUnacked {
  readonly _tag: "Stored"
  readonly notification: Notification
  readonly table: string
}

export type Unacked = DirectUnacked | StoredUnacked

/**
 * The newest message of a `chid:topic` (its key) the client was sent: its version, and the ms it was
 * accepted at (its sort key).
 */
export interface TopicSent {
  readonly key: string
  readonly version: string
  readonly ms: number
}

/**
 * The newest message sent per topic, in two generations: once `young` holds `TOPICS_GENERATION`
 * topics (beyond those of unacked messages), it becomes `old` and the previous `old` is forgotten,
 * but for the topics of messages still unacked, which are carried into the new `young`. So a session
 * remembers at most about twice that many topics (it used to remember every topic it ever sent).
 * A topic forgotten only matters if an older stored row of it is read later in the session: it is
 * then sent (as it would be on the next connection anyway).
 */
export interface Topics {
  readonly young: Ledger<TopicSent>
  readonly old: Ledger<TopicSent>
}

/** Topics in a generation of the session's topic memory (`Topics`). */
export const TOPICS_GENERATION = 500

/**
 * What the client has been sent and not acked (autopush-rs's `AckState`). Ledgers, not Maps: a frame updates
 * them in O(1) whatever they hold (`ledger.ts`). How many messages are unacked is bounded where they
 * come from: direct ones by `clientChannelCapacity` together with those queued (the router port
 * refuses more, and the endpoint stores them), stored ones by a page (the next page is read once
 * they are acked).
 */
export interface Acks {
  /** By version; `counted`: the stored ones. */
  readonly unacked: Ledger<Unacked>
  /**
   * Stored timestamp messages the client acked whose rows are not tombstones yet: they become
   * tombstones together once no stored message is outstanding (a page at a time), or when the session ends.
   * (A timestamp row is never rewritten, and pages are read after the last row read, so nothing
   * acked is read again meanwhile; topic rows become tombstones at once, on their version.)
   */
  readonly ackedRows: ReadonlyArray<StoredUnacked>
  /**
   * Per `chid:topic`, the newest message sent (by when it was accepted, not when it was sent: a
   * stored one may come after a newer one was delivered directly). An older one is replaced: not
   * sent, not saved over it.
   */
  readonly newestTopic: Topics
}

/** The keepalive: client activity, our ping awaiting its pong, the client's own pings. */
interface Keepalive {
  readonly lastActivity: number
  /** When our keepalive ping went out, while its pong is awaited. */
  readonly pingSentAt: number | undefined
  readonly lastClientPing: number | undefined
}

/** The command budget (a token bucket as of `tokensAt`) and the commands waiting for it, in order. */
export interface Budget {
  readonly tokens: number
  readonly tokensAt: number
  readonly held: Held
  readonly readingPaused: boolean
}

/**
 * Commands waiting for the budget, oldest first: a persistent queue, so that a waiting command costs
 * O(1) (amortized) however many wait, and no earlier phase's queue ever changes. `front` from `start`
 * holds the oldest, `back` the newest (newest first); taking past `front` turns `back` around once.
 */
interface Held {
  readonly length: number
  readonly front: ReadonlyArray<ClientMessage>
  readonly start: number
  readonly back: HeldCell | undefined
}

interface HeldCell {
  readonly message: ClientMessage
  readonly older: HeldCell | undefined
}

export const NO_HELD: Held = { length: 0, front: [], start: 0, back: undefined }

/** A queue of `messages` (oldest first). */
export const heldOf = (messages: ReadonlyArray<ClientMessage>): Held =>
  messages.length === 0 ? NO_HELD : { length: messages.length, front: messages, start: 0, back: undefined }

/** `held` with `message` waiting last. */
export const heldPush = (held: Held, message: ClientMessage): Held => ({
  length: held.length + 1,
  front: held.front,
  start: held.start,
  back: { message, older: held.back }
})

/** The oldest `n` (at most `held.length`) and what is left. */
export const heldTake = (held: Held, n: number): readonly [ReadonlyArray<ClientMessage>, Held] => {
  if (n <= 0) return [[], held]
  if (n >= held.length) return [heldList(held), NO_HELD]
  let { front, start } = held
  let back = held.back
  if (front.length - start < n) {
    front = heldList(held)
    start = 0
    back = undefined
  }
  return [front.slice(start, start + n), { length: held.length - n, front, start: start + n, back }]
}

/** Every waiting command, oldest first. */
export const heldList = (held: Held): ReadonlyArray<ClientMessage> => {
  const out = held.front.slice(held.start)
  const newest: Array<ClientMessage> = []
  for (let cell = held.back; cell !== undefined; cell = cell.older) newest.push(cell.message)
  for (let i = newest.length - 1; i >= 0; i--) out.push(newest[i] as ClientMessage)
  return out
}

/** Commands retried with backoff when storage fails (but while saying hello: then the connection closes). */
export type RetriedCommand =
  | { readonly _tag: "ReadUser"; readonly uaid: string; readonly attempt: number }
  | {
    readonly _tag: "ReadPage"
    readonly uaid: string
    readonly table: string
    /** `first`: from the first row on (topic rows, then timestamp rows); `timestamp`: timestamp rows after `after`. */
    readonly rows: "first" | "timestamp"
    readonly after: number | undefined
    readonly limit: number
    readonly attempt: number
  }
  | { readonly _tag: "TombstoneAcked"; readonly uaid: string; readonly messages: ReadonlyArray<StoredUnacked>; readonly attempt: number }
  /** The month move, a write at a time: the user's channels read in the old table, copied into the new one, the record pointed at it. */
  | { readonly _tag: "ReadChannels"; readonly uaid: string; readonly table: string; readonly attempt: number }
  | { readonly _tag: "AddChannels"; readonly uaid: string; readonly table: string; readonly channels: ReadonlySet<string>; readonly attempt: number }
  | { readonly _tag: "PointRecord"; readonly uaid: string; readonly table: string; readonly attempt: number }
  /** Delete one stored row only if it still holds its message (its version): the result says whether it did. */
  | { readonly _tag: "TakeMessage"; readonly uaid: string; readonly row: StoredUnacked; readonly attempt: number }
  /** Store messages whose ids are out already (unacked at the end of a session). */
  | { readonly _tag: "SaveMessages"; readonly uaid: string; readonly table: string; readonly messages: ReadonlyArray<Notification>; readonly attempt: number }
  /** Take this node out of the router record, if the record is still the session's (`connectedAt`). */
  | { readonly _tag: "ClearNodeId"; readonly uaid: string; readonly connectedAt: number; readonly attempt: number }
  /** Drop the user, unless its record was re-claimed since (its `connectedAt` changed). */
  | {
    readonly _tag: "DropUser"
    readonly uaid: string
    readonly connectedAt: number
    readonly reason: "stale_month" | "too_many_messages"
    readonly attempt: number
  }

/** A failed command waiting for its next attempt. */
export interface Retry {
  readonly command: RetriedCommand
  readonly at: number
}

/** Everything an identified connection knows. */
export interface Session {
  readonly uaid: string
  /** The router record's `connected_at` this session wrote (or, a new uaid, will write at its first register). */
  readonly connectedAt: number
  /** The message table the user lives in (while migrating: the old month). */
  readonly table: string
  /**
   * Whether the user has a router record (a new uaid has none until its first register). The record
   * itself is not kept: nothing reads it again, and an idle session would hold it (memory per connection).
   */
  readonly recorded: boolean
  readonly acks: Acks
  readonly keepalive: Keepalive
  readonly budget: Budget
  /**
   * Broadcasts the client follows, flat: id, version it has, id, version, … — the strings are the
   * node set's own (shared by every session), so a subscription costs two references.
   */
  readonly broadcasts: ReadonlyArray<string>
  readonly retry: Retry | undefined
  /** The lowest urgency the client wants now (RFC 8030 §5.3); undefined: every urgency. */
  readonly minUrgency: Urgency | undefined
}

/** Where the storage drain is: tables still to read, topic or timestamp rows, position. */
export interface Drain {
  readonly tables: ReadonlyArray<string>
  /**
   * What to read next in `tables[0]`: `first`, from its first row on (topic rows, then timestamp
   * rows); `timestamp`, timestamp rows after `after`; `read`, nothing (its last page was not full:
   * every row there was then is sent, and only a poke makes the drain look after `after` again).
   */
  readonly rows: "first" | "timestamp" | "read"
  /** Sort key (ms) of the last timestamp row read in `tables[0]`. */
  readonly after: number | undefined
  /** A poke or a lower minimum urgency arrived mid-drain: start over once this pass ends (a message may sit behind `after`). */
  readonly again: boolean
  /** A poke arrived since the end of the last table was read: read after it now, acked or not. */
  readonly poked: boolean
  /**
   * Messages of the backlog the client found at hello (accepted before the session's `connectedAt`)
   * sent in this drain, each channel's counted up to half of `msgLimit` (`backlogByChannel`): the
   * `msg_limit` count, a guard against many subscriptions together — one subscription alone never
   * passes it (the endpoint bounds what one may have stored; what a session saved unacked at its
   * end comes on top). What was pushed since hello never counts. Past `msgLimit` nothing more is
   * sent, and once what was sent is acked the user is dropped.
   */
  readonly backlog: number
  readonly backlogByChannel: ReadonlyMap<string, number>
}

// ── phases ──────────────────────────────────────────────────────────────────────────────────────

/** Socket open, no hello yet. */
export interface AwaitingHello {
  readonly _tag: "AwaitingHello"
  readonly openedAt: number
}

/** What a hello asked for, kept until the uaid is known (then the broadcasts are answered). */
interface Hello {
  readonly openedAt: number
  readonly broadcasts: Readonly<Record<string, string>> | undefined
}

/** The hello claimed a uaid: its router record is read, and re-claimed (or, a stale month, dropped). */
export interface Resuming extends Hello {
  readonly _tag: "Resuming"
  readonly claimed: string
}

/** The resume write lost: the record is read once more to tell why (dropped meanwhile, or newer). */
export interface Rechecking extends Hello {
  readonly _tag: "Rechecking"
  readonly claimed: string
}

/** A new uaid is made (none claimed, or the claimed one cannot be resumed). */
export interface Minting extends Hello {
  readonly _tag: "Minting"
  readonly claimed: string | undefined
}

/** Identified, nothing to read from storage. */
export interface Identified {
  readonly _tag: "Identified"
  readonly session: Session
}

/** Identified, reading stored messages a page at a time. */
export interface Draining {
  readonly _tag: "Draining"
  readonly session: Session
  readonly drain: Drain
}

/**
 * The user lives in last month's table: it is drained before the user moves to this month's.
 * Register and unregister wait in `deferred` (at most `HELD_COMMANDS_MAX`), then go through the budget.
 */
export interface Migrating {
  readonly _tag: "Migrating"
  readonly session: Session
  readonly drain: Drain
  readonly deferred: ReadonlyArray<ClientMessage>
}

/** Last month's table (still `session.table`) is drained: the user's channels and record move to table `to`. */
export interface Moving {
  readonly _tag: "Moving"
  readonly session: Session
  readonly to: string
  readonly deferred: ReadonlyArray<ClientMessage>
}

/** The socket is gone: saving what is unacked. `reason` is the close reason, or `client`. */
export interface Closing {
  readonly _tag: "Closing"
  readonly session: Session
  readonly reason: string
  /**
   * The node is stopping (the session was closed for it): the node takes its id out of the records
   * of all its sessions at once when they have ended (`clearNodeIds`), so the session does not.
   */
  readonly nodeStops: boolean
  readonly since: number
  readonly retry: Retry | undefined
  readonly stage: ClosingStage
  /** The month move the session ended in the middle of, if any: its old table is read first (`sweep.ts`). */
  readonly sweep: Sweep | undefined
}

/**
 * A session that ends while moving its user to this month's table (`Moving`, or `Draining` the old
 * table after the move) may have pointed the record at the new table already without reading the
 * old one (`from`) since: an endpoint that read the old record may have stored there, and no later
 * hello reads it. Its close reads `from` first and moves what it finds to the table the record
 * names; `moved`: how many rows it moved (undefined: not read yet).
 */
export interface Sweep {
  readonly from: string
  readonly moved: number | undefined
}

/** The sweep a live phase leaves to its close: the table it was moving out of and had not read since. */
export const sweepOf = (phase: Live): Sweep | undefined => {
  switch (phase._tag) {
    case "Moving":
      return { from: phase.session.table, moved: undefined }
    case "Draining": {
      const [first] = phase.drain.tables
      return first !== undefined && first !== phase.session.table ? { from: first, moved: undefined } : undefined
    }
    default:
      return undefined
  }
}

/** How far the end of a session is, each step one storage call (`closing.ts`). */
export type ClosingStage =
  /**
   * We closed the socket (a close frame is out): the acks the client sends before it answers it, or
   * until `until` (the close grace), are taken — an ack in flight is not lost; nothing else it sends is.
   */
  | { readonly _tag: "Answering"; readonly until: number }
  /** Deliveries still in the mailbox are kept, until it is drained. */
  | { readonly _tag: "Collecting" }
  /**
   * The sweep: the record is read (`to` undefined), then pages of the old table: their rows (`rows`,
   * while saved) are saved into `to` (the record's table) and taken out of the old one (`Taking`,
   * then `Sweep`); `moved` so far.
   */
  | { readonly _tag: "Sweeping"; readonly to: string | undefined; readonly moved: number; readonly rows: ReadonlyArray<Notification> }
  /**
   * Acked rows not made tombstones yet become tombstones; then `messages` (unacked) and `strays` (stored rows sent
   * from a table the user has left: last month's, read after the move) are saved.
   */
  | { readonly _tag: "TombstoningAcked"; readonly messages: ReadonlyArray<Notification>; readonly strays: ReadonlyArray<StoredUnacked> }
  /** `messages` (strays among them) are saved into the session's table. */
  | { readonly _tag: "Saving"; readonly table: string; readonly strays: ReadonlyArray<StoredUnacked> }
  /** This node leaves the record; `table` undefined: nothing was saved. */
  | { readonly _tag: "Clearing"; readonly table: string | undefined; readonly saved: ReadonlyArray<Notification> }
  /** The record is read after the save: did the user move to a new month, connect to another node, or go, meanwhile? */
  | { readonly _tag: "ReadingAfter"; readonly table: string; readonly saved: ReadonlyArray<Notification> }
  /** The user moved to table `to` meanwhile: what was saved into `from` is saved into `to`… */
  | { readonly _tag: "Following"; readonly from: string; readonly to: string; readonly after: UserRecord; readonly saved: ReadonlyArray<Notification> }
  /**
   * …rows saved into `table` (strays, what follows a move, or a sweep's: `then` says which) are
   * taken out of the table they were in, one by one (`left[0]` now); or, the user gone, what was
   * saved is taken back out of `table` (`then` finishes with no record). The copy of one no longer
   * there (read and acked there, replaced, cancelled) is taken back out of `table` afterwards
   * (`undo`, one by one).
   */
  | {
    readonly _tag: "Taking"
    readonly table: string
    readonly then:
      | { readonly _tag: "Clear" }
      | { readonly _tag: "Finish"; readonly after: UserRecord | undefined }
      | { readonly _tag: "Sweep"; readonly moved: number }
    readonly saved: ReadonlyArray<Notification>
    readonly left: ReadonlyArray<StoredUnacked>
    readonly undo: ReadonlyArray<Notification>
  }

export interface Closed {
  readonly _tag: "Closed"
}

export type Phase = AwaitingHello | Resuming | Rechecking | Minting | Identified | Draining | Migrating | Moving | Closing | Closed

export type PhaseTag = Phase["_tag"]
export type PhaseOf<T extends PhaseTag> = Extract<Phase, { readonly _tag: T }>

/** Before the uaid is known. */
export type Unidentified = Resuming | Rechecking | Minting
/** A live, identified connection. */
export type Live = Identified | Draining | Migrating | Moving
/** Live and reading storage. */
export type Reading = Draining | Migrating

/** Whether a connection is live and identified (it has a session to save when it ends). */
export const isLive = (phase: Phase): phase is Live =>
  phase._tag === "Identified" || phase._tag === "Draining" || phase._tag === "Migrating" || phase._tag === "Moving"
