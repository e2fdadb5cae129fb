/**
 * Deliveries, acks and the storage drain, as autopush does them except where noted (acked messages
 * are deleted, never re-sent; a drain's `msg_limit` counts what the client sees, whatever the page size):
 * - a delivery from an endpoint node is sent at once (TTL 0: only now, fire and forget);
 * - stored messages are drained after hello and after every check-storage poke, a page at a time
 *   (topic messages, then timestamp order; a page from a table's first row holds both kinds, one
 *   read where autopush makes two); the next page is read once the previous one is acked and its
 *   rows deleted (`Draining`, or `Migrating` on last month's table, which then moves: `Moving`);
 * - an acked stored message is deleted (conditionally on its version, so a newer message that replaced
 *   a topic is kept); an acked direct message is just forgotten;
 * - more than `msgLimit` messages from storage in one drain → the client gets the first `msgLimit`,
 *   then (once they are acked) the user is dropped and the socket closed 1000.
 *
 * Handlers that move the drain on take the phase's own continuation (`advanceDraining`,
 * `advanceMigrating`, or none): what differs by phase is chosen in the table, not here.
 */
import type { CommandResult } from "./inputs.ts"
import type { Ledger } from "./ledger.ts"
import type { ClientMessage } from "./messages.ts"
import { closeLive, currentTable, NO_ACKS, NOTHING, type Out, replacedTopic, send, storedOutstanding, withSession } from "./out.ts"
import type { Drain, Draining, Identified, Live, Migrating, Moving, Phase, Reading, StoredUnacked, Unacked } from "./phases.ts"
import { withReceipt } from "../domain/events.ts"
import { isExpired, type Notification, urgentEnough } from "../domain/notification.ts"

type Msg<T extends ClientMessage["messageType"]> = Extract<ClientMessage, { readonly messageType: T }>

/** How a phase goes on after its acks or a page: read more, finish, or (not reading) nothing. */
type Advance<P extends Live> = (phase: P, out: Out) => Phase

/** A drain from the start of `tables` (from their first rows: topic rows first). */
export const newDrain = (...tables: ReadonlyArray<string>): Drain => ({ tables, rows: "first", after: undefined, again: false, sent: 0 })

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

/** A reason to look at storage mid-drain: start over once this pass ends (a message may sit behind `after`). */
export const drainAgain = <P extends Reading>(phase: P): P => ({ ...phase, drain: { ...phase.drain, again: true } })

// ── the drain ───────────────────────────────────────────────────────────────────────────────────

/**
 * Read the next page when the previous one is fully acked and nothing is pending; when every table
 * is read, `finish`. Past `msgLimit` (what was sent being acked), drop the user.
 */
const advance = <P extends Reading>(phase: P, out: Out, finish: (phase: P, out: Out) => Phase): Phase => {
  const s = phase.session
  const drain = phase.drain
  if (s.retry !== undefined || out.command !== undefined || storedOutstanding(s.acks) > 0) return phase
  if (drain.sent > out.options.msgLimit) {
    out.run({ _tag: "DropUser", uaid: s.uaid, connectedAt: s.connectedAt, reason: "too_many_messages", attempt: 0 })
    return phase
  }
  const table = drain.tables[0]
  if (table !== undefined) {
    if (drain.rows === "read") return advance({ ...phase, drain: nextTable(drain) }, out, finish)
    out.run({ _tag: "ReadPage", uaid: s.uaid, table, rows: drain.rows, after: drain.after, limit: out.options.pageSize, attempt: 0 })
    return phase
  }
  if (drain.again) return advance({ ...phase, drain: { ...newDrain(s.table), sent: drain.sent } }, out, finish)
  return finish(phase, out)
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

/**
 * A page of stored messages: sent, unless one is in hand already (sent directly, unacked) or expired
 * on the way. A page that was not full is the last of its table when `lastIfShort` — but
 * while migrating, endpoints that read the old record may still store into the old table: it is
 * read until a page is empty.
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
  // start once its rows are acked and deleted.
  const topicsLeft = command.rows === "first" && input.lastSortKey === undefined && input.more
  if (messages.length === 0) {
    const next: Drain = input.more && (input.lastSortKey !== undefined || command.rows === "first")
      ? { ...drain, rows: "timestamp", after: input.lastSortKey } // a page of rows held already or on hold (less urgent than the client wants, or expired on the way): keep reading after it
      : nextTable(drain)
    return advanceP({ ...phase, drain: next }, out)
  }
  const sent = drain.sent + messages.length
  // The client gets `msgLimit` messages of a drain whatever the page size; the rest of a page that
  // goes past it is not sent (the user is dropped once what was sent is acked: advance).
  const page = sent > out.options.msgLimit ? messages.slice(0, Math.max(0, out.options.msgLimit - drain.sent)) : messages
  const last = !input.more && lastIfShort
  let next: Drain = topicsLeft ? { ...drain, sent } : { ...drain, sent, after: input.lastSortKey, rows: last ? "read" : "timestamp" }
  let session = s
  let fresh = 0
  for (const n of page) {
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
    session = send(session, n, command.table, out)
    fresh++
  }
  // Topic rows already in hand (sent directly, unacked) would be read again and again: move on.
  if (fresh === 0 && topicsLeft) next = { ...next, rows: "timestamp" }
  return advanceP({ ...phase, session, drain: next }, out)
}

export const messagesDeleted = <P extends Reading>(advanceP: Advance<P>) => (phase: P, _input: unknown, out: Out): Phase => advanceP(phase, out)

// ── acks ────────────────────────────────────────────────────────────────────────────────────────

/**
 * Acks: direct messages are forgotten; acked stored rows are deleted before the next page is read
 * (a topic page would otherwise show them again), together — when a topic row was acked, or no
 * stored message is outstanding any more.
 */
export const ack = <P extends Live>(advanceP: Advance<P>) => (phase: P, message: Msg<"ack">, out: Out): Phase => {
  const before = phase.session.acks
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
    out.event("notification.acked.1", phase.session.uaid, withReceipt({
      version: update.version,
      code: update.code ?? 100,
      source: entry._tag === "Stored" ? "stored" : "direct"
    }, entry.notification))
  }
  if (unacked === undefined) return advanceP(phase, out)
  const ackedRows = rows ?? before.ackedRows
  const acks = { ...before, unacked }
  const s = { ...phase.session, acks }
  if (!topicRows && storedOutstanding(acks) > 0) return withSession(phase, { ...s, acks: { ...acks, ackedRows } })
  if (ackedRows.length === 0) return advanceP(withSession(phase, s), out)
  const cleared = { ...s, acks: { ...acks, ackedRows: NOTHING } }
  if (s.retry?.command._tag === "DeleteMessages") {
    const pending = s.retry.command
    return withSession(phase, { ...cleared, retry: { ...s.retry, command: { ...pending, messages: [...pending.messages, ...ackedRows] } } })
  }
  out.run({ _tag: "DeleteMessages", uaid: s.uaid, messages: ackedRows, attempt: 0 })
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
