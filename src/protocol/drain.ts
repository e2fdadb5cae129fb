/**
 * Deliveries, acks and the storage drain, as autopush does them except where noted (acked messages
 * leave tombstones, never re-sent; `msg_limit` counts the backlog found at hello, whatever the page size):
 * - a delivery from an endpoint node is sent at once (TTL 0: only now, fire and forget);
 * - stored messages are drained after hello and after every check-storage poke, a page at a time
 *   (topic messages, then timestamp order; a page from a table's first row holds both kinds, one
 *   read where autopush makes two), the next page once the previous one is acked. A poke (something
 *   was stored for a connected client) reads the next page of timestamp rows, or what came after the
 *   last page, at once, whatever the client holds unacked (within `clientChannelCapacity`): a client
 *   that acks late or in batches gets what is stored for it now, in order, not after its acks. The
 *   pass starts over once everything is acked (a message may have been stored behind the last row
 *   read); `Draining`, or `Migrating` on last month's table, which then moves: `Moving`;
 * - an acked stored message becomes its tombstone (conditionally on its version, so a newer message
 *   that replaced a topic is kept); an acked direct message is just forgotten;
 * - more than `msgLimit` messages of the backlog found at hello (accepted before the session began),
 *   each channel's counted up to half of `msgLimit` → the client gets the first `msgLimit`, then (once they
 *   are acked) the user is dropped and the socket closed 1000: a guard for many subscriptions
 *   together. One subscription alone never resets its user, and what is pushed to a connected
 *   client never counts (the endpoint bounds what one subscription may have stored).
 *
 * Handlers that move the drain on take the phase's own continuation (`advanceDraining`,
 * `advanceMigrating`, or none): what differs by phase is chosen in the table, not here.
 */
import type { CommandResult } from "./inputs.ts"
import type { Ledger } from "./ledger.ts"
import type { ClientMessage } from "./messages.ts"
import { closeLive, currentTable, NO_ACKS, NOTHING, type Out, replacedTopic, send, storedOutstanding, withSession } from "./out.ts"
import type { Acks, Drain, Draining, Identified, Live, Migrating, Moving, Phase, Reading, Session, StoredUnacked, Unacked } from "./phases.ts"
import { withReceipt } from "../domain/events.ts"
import { isExpired, type Notification, sortkeyMs, urgentEnough } from "../domain/notification.ts"

type Msg<T extends ClientMessage["messageType"]> = Extract<ClientMessage, { readonly messageType: T }>

/** How a phase goes on after its acks or a page: read more, finish, or (not reading) nothing. */
type Advance<P extends Live> = (phase: P, out: Out) => Phase

/** A drain from the start of `tables` (from their first rows: topic rows first). */
const NO_BACKLOG: ReadonlyMap<string, number> = new Map()

export const newDrain = (...tables: ReadonlyArray<string>): Drain => ({
  tables,
  rows: "first",
  after: undefined,
  again: false,
  poked: false,
  backlog: 0,
  backlogByChannel: NO_BACKLOG
})

/**
 * What one channel's backlog counts towards `msg_limit` at most: half of it (rounded up), so that one
 * subscription alone — however loud, with what a session saved unacked at its end on top of what the
 * endpoint let it store — never resets its user, and a user whose backlog spans several does.
 */
const channelShare = (msgLimit: number): number => Math.ceil(msgLimit / 2)

/** Whether a stored message was there for the session to find at hello: accepted before it began. */
const inBacklog = (n: Notification, s: Session): boolean => sortkeyMs(n) <= s.connectedAt

export const delivery = (phase: Live, { notification: n }: { readonly notification: Notification }, out: Out): Phase => {
  // TTL 0 means "only if connected now": it is now, so it goes out.
  if (n.ttl > 0 && isExpired(n, Math.floor(out.now / 1000))) {
    out.event("notification.expired.1", phase.session.uaid, withReceipt({ version: n.version }, n))
    return phase
  }
  return withSession(phase, send(phase.session, n, undefined, out))
}

// ── reasons to look at storage ──────────────────────────────────────────────────────────────────

/** A reason to look at storage with nothing being read: a drain of the user's table starts. */
export const startDrain = (phase: Identified, out: Out): Phase =>
  !phase.session.recorded ? phase : advanceDraining({ _tag: "Draining", session: phase.session, drain: newDrain(phase.session.table) }, out)

/** A lower minimum urgency mid-drain: start over once this pass ends (what was held sits behind `after`). */
export const drainAgain = <P extends Reading>(phase: P): P => ({ ...phase, drain: { ...phase.drain, again: true } })

/**
 * A poke mid-drain (something was stored for the user): what was stored after the last row read is
 * read now, acked or not (within the client's capacity), and the pass starts over once it ends.
 */
export const checkAgain = <P extends Reading>(advanceP: Advance<P>) => (phase: P, _input: unknown, out: Out): Phase =>
  advanceP({ ...phase, drain: { ...phase.drain, again: true, poked: true } }, out)

// ── the drain ───────────────────────────────────────────────────────────────────────────────────

/**
 * Read the next page when the drain may (below); when every table is read and what was sent is
 * acked, start over if asked to, else `finish`. Past `msgLimit` of the backlog (what was sent being
 * acked), drop the user. A page is read once what the drain sent is acked; after a poke, the next
 * page of timestamp rows (or, the last page read, what came after it) at once, if the client holds
 * fewer than its capacity unacked.
 */
const advance = <P extends Reading>(phase: P, out: Out, finish: (phase: P, out: Out) => Phase): Phase => {
  const s = phase.session
  const drain = phase.drain
  if (s.retry !== undefined || out.command !== undefined) return phase
  const stored = storedOutstanding(s.acks)
  const roomy = s.acks.unacked.size < out.options.clientChannelCapacity
  if (drain.backlog > out.options.msgLimit) {
    if (stored === 0) out.run({ _tag: "DropUser", uaid: s.uaid, connectedAt: s.connectedAt, reason: "too_many_messages", attempt: 0 })
    return phase
  }
  const table = drain.tables[0]
  if (table !== undefined) {
    if (drain.rows === "read") {
      if (drain.tables.length > 1) return advance({ ...phase, drain: nextTable(drain) }, out, finish)
      if (drain.poked && roomy) return readPage({ ...phase, drain: { ...drain, poked: false } }, table, "timestamp", out)
    } else {
      // A page is read once what the drain sent is acked (and, for a read from the first row, made tombstones):
      // the backlog goes a page at a time. A poke reads the next timestamp page at once, acked or not.
      const poked = drain.rows === "timestamp" && drain.poked && roomy
      if (stored > 0 && !poked) return phase
      return readPage({ ...phase, drain: { ...drain, poked: false } }, table, drain.rows, out)
    }
  }
  if (stored > 0) return phase
  if (drain.again) {
    return advance({ ...phase, drain: { ...newDrain(s.table), backlog: drain.backlog, backlogByChannel: drain.backlogByChannel } }, out, finish)
  }
  return finish(phase, out)
}

const readPage = <P extends Reading>(phase: P, table: string, rows: "first" | "timestamp", out: Out): P => {
  const s = phase.session
  const after = rows === "first" ? undefined : phase.drain.after
  out.run({ _tag: "ReadPage", uaid: s.uaid, table, rows, after, limit: out.options.pageSize, attempt: 0 })
  return phase
}

/** Everything is read and acked: nothing more to read. */
export const advanceDraining: Advance<Draining> = (phase, out) =>
  advance(phase, out, (done) => ({ _tag: "Identified", session: done.session }))

/** Last month's table is read and acked: the user moves to this month's. */
export const advanceMigrating: Advance<Migrating> = (phase, out) =>
  advance(phase, out, (done, out) => {
    const s = done.session
    out.run({ _tag: "ReadChannels", uaid: s.uaid, table: s.table, attempt: 0 })
    return { _tag: "Moving", session: s, to: currentTable(out.options, out.now), deferred: done.deferred }
  })

/** Phases that read nothing go on as they are. */
export const stay = <P extends Live>(phase: P): P => phase

/** The drain goes on with the next table (from its topic rows). */
const nextTable = (drain: Drain): Drain => ({ ...drain, tables: drain.tables.slice(1), rows: "first", after: undefined })

/** Every row of `tables[0]` is read: the drain keeps its place after the last one (`after`), for a poke. */
const tableRead = (drain: Drain, lastSortKey: number | undefined): Drain => ({ ...drain, rows: "read", after: lastSortKey ?? drain.after })

/**
 * A page of stored messages: sent, unless one is in hand already (sent directly, or by this drain,
 * unacked) or expired on the way. A page that was not full is the last of its table when `lastIfShort`
 * — but while migrating, endpoints that read the old record may still store into the old table: it
 * is read until a page is empty.
 */
export const pageRead = <P extends Reading>(advanceP: Advance<P>, lastIfShort: boolean) =>
(phase: P, input: Extract<CommandResult, { _tag: "PageRead" }>, out: Out): Phase => {
  const s = phase.session
  const drain = phase.drain
  const { command } = input
  // Storage filtered expired rows when it read them; time has passed since: what expired on the way is
  // not sent. What is less urgent than the client wants now stays stored (sent once it lowers its minimum).
  const nowSec = Math.floor(out.now / 1000)
  const messages = input.messages.filter((n) => {
    if (isExpired(n, nowSec)) {
      out.event("notification.expired.1", s.uaid, withReceipt({ version: n.version }, n))
      return false
    }
    return urgentEnough(n, s.minUrgency)
  })
  // A page from the first row on that reached a timestamp row, or the end, has read every topic row:
  // timestamp rows after it are what is left. One that ended among topic rows is read again from the
  // start once its rows are acked and made tombstones.
  const topicsLeft = command.rows === "first" && input.lastSortKey === undefined && input.more
  const last = !input.more && lastIfShort
  if (messages.length === 0) {
    const next: Drain = input.more && (input.lastSortKey !== undefined || command.rows === "first")
      ? { ...drain, rows: "timestamp", after: input.lastSortKey ?? drain.after } // a page of rows held already or on hold (less urgent than the client wants, or expired on the way): keep reading after it
      : tableRead(drain, input.lastSortKey)
    return advanceP({ ...phase, drain: next }, out)
  }
  let session = s
  let backlog = drain.backlog
  let byChannel: Map<string, number> | undefined
  let fresh = 0
  for (const n of messages) {
    if (session.acks.unacked.has(n.version)) continue
    if (replacedTopic(session.acks, n)) {
      // The client has a newer message of this topic (sent directly): this row is replaced, and goes.
      const { ackedRows } = session.acks
      if (!ackedRows.some((row) => row.notification.version === n.version)) {
        const replaced: StoredUnacked = { _tag: "Stored", notification: n, table: command.table }
        session = { ...session, acks: { ...session.acks, ackedRows: [...ackedRows, replaced] } }
      }
      continue
    }
    // The client gets `msgLimit` messages of its backlog whatever the page size; past it nothing more
    // is sent (the user is dropped once what was sent is acked: advance).
    if (inBacklog(n, s)) {
      const counted = (byChannel ?? drain.backlogByChannel).get(n.channelId) ?? 0
      if (counted < channelShare(out.options.msgLimit)) {
        ;(byChannel ??= new Map(drain.backlogByChannel)).set(n.channelId, counted + 1)
        if (++backlog > out.options.msgLimit) break
      }
    }
    session = send(session, n, command.table, out)
    fresh++
  }
  const counts = { backlog, backlogByChannel: byChannel ?? drain.backlogByChannel }
  let next: Drain = topicsLeft ? { ...drain, ...counts } : last
    ? { ...tableRead(drain, input.lastSortKey), ...counts }
    : { ...drain, ...counts, after: input.lastSortKey ?? drain.after, rows: "timestamp" }
  // Topic rows already in hand (sent directly, unacked) would be read again and again: move on.
  if (fresh === 0 && topicsLeft) next = { ...next, rows: "timestamp" }
  return advanceP({ ...phase, session, drain: next }, out)
}

/** The acked rows are tombstones: the drain goes on. */
export const ackedTombstoned = <P extends Reading>(advanceP: Advance<P>) => (phase: P, _input: unknown, out: Out): Phase => advanceP(phase, out)

// ── acks ────────────────────────────────────────────────────────────────────────────────────────

/**
 * The updates of an ack frame that name messages the client holds: their events recorded, direct
 * ones forgotten, stored ones added to the rows to make tombstones; undefined when none did. `topicRows`:
 * a stored topic message was among them.
 */
export const takeAcks = (s: Session, message: Msg<"ack">, out: Out): { readonly acks: Acks; readonly topicRows: boolean } | undefined => {
  const before = s.acks
  let unacked: Ledger<Unacked> | undefined
  let rows: Array<StoredUnacked> | undefined
  let topicRows = false
  for (const update of message.updates) {
    const entry = (unacked ?? before.unacked).get(update.version)
    if (entry === undefined) continue
    unacked = (unacked ?? before.unacked).delete(update.version)
    if (entry._tag === "Stored") {
      ;(rows ??= [...before.ackedRows]).push(entry)
      if (entry.notification.topic !== undefined) topicRows = true
    }
    out.event("notification.acked.1", s.uaid, withReceipt({
      version: update.version,
      code: update.code ?? 100,
      source: entry._tag === "Stored" ? "stored" : "direct"
    }, entry.notification))
  }
  return unacked === undefined ? undefined : { acks: { ...before, unacked, ackedRows: rows ?? before.ackedRows }, topicRows }
}

/**
 * Acks: direct messages are forgotten; acked stored rows become tombstones before the next page is read
 * (a topic page would otherwise show them again), together — when a topic row was acked, a page of
 * them waits, or no stored message is outstanding any more.
 */
export const ack = <P extends Live>(advanceP: Advance<P>) => (phase: P, message: Msg<"ack">, out: Out): Phase => {
  const taken = takeAcks(phase.session, message, out)
  if (taken === undefined) return advanceP(phase, out)
  const { acks, topicRows } = taken
  const s = { ...phase.session, acks }
  // Timestamp rows become tombstones together, a page at a time or once nothing stored is outstanding.
  if (!topicRows && storedOutstanding(acks) > 0 && acks.ackedRows.length < out.options.pageSize) return advanceP(withSession(phase, s), out)
  if (acks.ackedRows.length === 0) return advanceP(withSession(phase, s), out)
  const { ackedRows } = acks
  const cleared = { ...s, acks: { ...acks, ackedRows: NOTHING } }
  if (s.retry?.command._tag === "TombstoneAcked") {
    const pending = s.retry.command
    return withSession(phase, { ...cleared, retry: { ...s.retry, command: { ...pending, messages: [...pending.messages, ...ackedRows] } } })
  }
  out.run({ _tag: "TombstoneAcked", uaid: s.uaid, messages: ackedRows, attempt: 0 })
  return withSession(phase, cleared)
}

// ── the end of a drain ──────────────────────────────────────────────────────────────────────────

/**
 * Too many stored messages: the user is gone; the next hello gets a new uaid. Not dropped: a newer
 * session of the user took over meanwhile (it drains, and counts, for itself), so this one goes.
 */
export const tooManyDropped = (phase: Reading, { dropped }: { readonly dropped: boolean }, out: Out): Phase => {
  if (!dropped) return closeLive(phase, "ghost", out)
  const s = phase.session
  out.event("uaid.reset.1", s.uaid, { reason: "too_many_messages" })
  return closeLive({ _tag: "Identified", session: { ...s, recorded: false, acks: NO_ACKS } }, "uaid-reset", out)
}

/** The month move: the channels read in the old table are copied into the new one… */
export const channelsRead = (phase: Moving, { channels }: { readonly channels: ReadonlySet<string> }, out: Out): Phase => {
  out.run({ _tag: "AddChannels", uaid: phase.session.uaid, table: phase.to, channels, attempt: 0 })
  return phase
}

/** …then the record is pointed at the new table… */
export const channelsAdded = (phase: Moving, _input: unknown, out: Out): Phase => {
  out.run({ _tag: "PointRecord", uaid: phase.session.uaid, table: phase.to, attempt: 0 })
  return phase
}

/**
 * …and the user lives in this month's table now: the commands that waited are fed again, through
 * the command budget; both months are drained (an endpoint that read the old record may have stored
 * into the old table meanwhile).
 */
export const recordPointed = (phase: Moving, _input: unknown, out: Out): Phase => {
  const s = phase.session
  const from = s.table
  out.event("month.migrated.1", s.uaid, { from, to: phase.to })
  if (phase.deferred.length > 0) out.signal({ _tag: "Replay", messages: phase.deferred, admitted: false })
  const session = { ...s, table: phase.to }
  return advanceDraining({ _tag: "Draining", session, drain: newDrain(from, phase.to) }, out)
}
