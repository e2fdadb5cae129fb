/**
 * The end of a connection: a socket that closes (or a close we decide) leaves the node; a live
 * session then saves what the client did not ack (`Closing`, a storage call a stage: acked rows
 * made tombstones, save into the session's table — then take the rows it moved out of the table
 * they were in —, leave the record, read it to follow a month move, poke the node the user moved
 * to, or take back what was saved for a user dropped meanwhile), and ends (`Closed`). Where a
 * message moves between tables it is saved first and taken after: a node that dies between the
 * two steps leaves it in both (delivered once more at worst: the client de-duplicates by version),
 * never in neither. A session that ends in the middle of its month
 * move first sweeps last month's table (`sweep.ts`). What storage failures mean: `failures.ts`.
 */
import type { CloseKind } from "./close.ts"
import { takeAcks } from "./drain.ts"
import type { ClientMessage } from "./messages.ts"
import type { CommandResult } from "./inputs.ts"
import { closeEarly, closeLive, COLLECTING, newestOfTopic, NOTHING, type Out, remember } from "./out.ts"
import { type Closed, type Closing, type ClosingStage, type Live, type Phase, type StoredUnacked, type Sweep, sweepOf } from "./phases.ts"
import { startSweep, sweepNextPage, sweepPageRead, sweepSaved, sweepUserRead } from "./sweep.ts"
import { withReceipt } from "../domain/events.ts"
import { isExpired, type Notification } from "../domain/notification.ts"
import { tableMovedTo, type UserRecord } from "../domain/user.ts"

// ── closes ──────────────────────────────────────────────────────────────────────────────────────

export const closeLiveWith = (kind: CloseKind) => (phase: Live, _input: unknown, out: Out): Phase => closeLive(phase, kind, out)
export const closeEarlyWith = (kind: CloseKind) => (_phase: unknown, _input: unknown, out: Out): Phase => closeEarly(kind, out)

export const kickedLive = (phase: Live, input: { readonly kind: CloseKind }, out: Out): Phase => closeLive(phase, input.kind, out)
export const kickedEarly = (_phase: unknown, input: { readonly kind: CloseKind }, out: Out): Phase => closeEarly(input.kind, out)

/** The client went away: what it did not ack is saved. */
export const socketClosedLive = (phase: Live, _input: unknown, out: Out): Phase => ({
  _tag: "Closing",
  session: phase.session,
  reason: "client",
  nodeStops: false,
  since: out.now,
  retry: undefined,
  stage: COLLECTING,
  sweep: sweepOf(phase)
})

export const socketClosedEarly = (): Closed => ({ _tag: "Closed" })

/** An ack that came before the client answered our close frame: taken (its rows made tombstones with the others, first thing of the save). */
export const closingAck = (phase: Closing, message: Extract<ClientMessage, { readonly messageType: "ack" }>, out: Out): Phase => {
  if (phase.stage._tag !== "Answering") return phase
  const taken = takeAcks(phase.session, message, out)
  return taken === undefined ? phase : { ...phase, session: { ...phase.session, acks: taken.acks } }
}

/** The client answered our close (or went): nothing more it sends is taken; what it did not ack is saved. */
export const closeAnswered = (phase: Closing): Phase => (phase.stage._tag === "Answering" ? { ...phase, stage: COLLECTING } : phase)

// ── saving what is unacked ──────────────────────────────────────────────────────────────────────

/** A delivery still queued when the socket closed: the router port accepted it, so it is kept. */
export const leftover = (phase: Closing, { notification }: { readonly notification: Notification }): Phase => ({
  ...phase,
  session: remember(phase.session, notification, undefined)
})

/**
 * What to save of an ended session: unacked direct messages, unexpired, at the key their id names
 * (never re-stamped: `DELETE` of the push's `Location` must find the row, and a retried save must
 * land on the row it wrote before); a topic message only if it is still the newest of its topic;
 * and unacked stored rows the session read from a table the user has since left (last month's, read
 * after the move: no later hello reads it), which follow the user. Acked rows not made tombstones yet go
 * first — those acked since the last `TombstoneAcked`, and those of one that failed and waits for
 * its retry: acked means a tombstone, whenever the socket closes.
 */
export const mailboxDrained = (phase: Closing, _input: unknown, out: Out): Phase => {
  const s = phase.session
  if (!s.recorded) return ended(phase, NOTHING, out)
  if (phase.sweep !== undefined && phase.sweep.moved === undefined) return startSweep(phase, out)
  const nowSec = Math.floor(out.now / 1000)
  const messages: Array<Notification> = []
  // Stored topic messages the client has since had a newer message of (a TTL 0 one, sent and never
  // stored) were replaced: their rows go, as acked ones do.
  const replaced: Array<StoredUnacked> = []
  const strays: Array<StoredUnacked> = []
  const { unacked, ackedRows } = s.acks
  for (const entry of unacked.values()) {
    const n = entry.notification
    const newest = newestOfTopic(s.acks, n)
    if (entry._tag === "Stored") {
      if (!newest) replaced.push(entry)
      else if (entry.table !== s.table) strays.push(entry)
      continue
    }
    if (isExpired(n, nowSec)) continue
    if (n.topic === undefined || newest) messages.push(n)
  }
  const pending = s.retry?.command._tag === "TombstoneAcked" ? s.retry.command.messages : NOTHING
  const acked = replaced.length === 0 && pending.length === 0 ? ackedRows : [...pending, ...ackedRows, ...replaced]
  if (acked.length === 0) return saveUnacked(phase, messages, strays, out)
  out.run({ _tag: "TombstoneAcked", uaid: s.uaid, messages: acked, attempt: 0 })
  return { ...phase, stage: { _tag: "TombstoningAcked", messages, strays } }
}

/**
 * Unacked messages (strays among them) are saved into the session's table; the record read after
 * the save says whether the user moved on meanwhile (then they follow it) or was dropped (then
 * they are taken back). Nothing to save: this node just leaves the record.
 */
const saveUnacked = (phase: Closing, messages: ReadonlyArray<Notification>, strays: ReadonlyArray<StoredUnacked>, out: Out): Phase => {
  const s = phase.session
  const all = strays.length === 0 ? messages : [...messages, ...strays.map((row) => row.notification)]
  // Nothing to save, but rows a sweep moved: the record is read again, for a session elsewhere to be told.
  if (all.length === 0) return leave(phase, (phase.sweep?.moved ?? 0) > 0 ? s.table : undefined, NOTHING, out)
  out.run({ _tag: "SaveMessages", uaid: s.uaid, table: s.table, messages: all, attempt: 0 })
  return { ...phase, stage: { _tag: "Saving", table: s.table, strays } }
}

/** Acked rows made tombstones: the save next. */
export const closingAckedTombstoned = (phase: Closing, _input: unknown, out: Out): Phase => {
  const { stage } = phase
  if (stage._tag !== "TombstoningAcked") throw new Error(`AckedTombstoned at stage ${stage._tag}`)
  return saveUnacked(phase, stage.messages, stage.strays, out)
}

/**
 * Rows saved into a table are taken out of the one they were in (saved first, taken after: a cut
 * between the two leaves a message in both tables, delivered from the new one, never in neither);
 * then the copies of rows that were gone (acked, replaced or cancelled meanwhile) are taken back.
 */
const take = (phase: Closing, stage: Extract<ClosingStage, { _tag: "Taking" }>, out: Out): Phase => {
  const uaid = phase.session.uaid
  const [next] = stage.left
  if (next !== undefined) {
    out.run({ _tag: "TakeMessage", uaid, row: next, attempt: 0 })
    return { ...phase, stage }
  }
  const [copy] = stage.undo
  if (copy !== undefined) {
    out.run({ _tag: "TakeMessage", uaid, row: { _tag: "Stored", notification: copy, table: stage.table }, attempt: 0 })
    return { ...phase, stage }
  }
  switch (stage.then._tag) {
    case "Finish":
      return finish(phase, stage.then.after, stage.saved, out)
    case "Sweep": // a page moved (less what was gone from the old table meanwhile): the next one
      return sweepNextPage(phase, sweepUnderWay(phase), stage.table, stage.then.moved + stage.saved.length, out)
    case "Clear":
      return leave(phase, stage.table, stage.saved, out)
  }
}

/**
 * This node leaves the record (unless the node is stopping: it leaves its sessions' records all at
 * once); then, if something was saved into `table`, the record is read again.
 */
const leave = (phase: Closing, table: string | undefined, saved: ReadonlyArray<Notification>, out: Out): Phase => {
  if (phase.nodeStops) return left(phase, table, saved, out)
  out.run({ _tag: "ClearNodeId", uaid: phase.session.uaid, connectedAt: phase.session.connectedAt, attempt: 0 })
  return { ...phase, stage: { _tag: "Clearing", table, saved } }
}

const left = (phase: Closing, table: string | undefined, saved: ReadonlyArray<Notification>, out: Out): Phase => {
  if (table === undefined) return ended(phase, NOTHING, out)
  out.run({ _tag: "ReadUser", uaid: phase.session.uaid, attempt: 0 })
  return { ...phase, stage: { _tag: "ReadingAfter", table, saved } }
}

/** A row taken (or found gone) out of its old table: gone, its copy is taken back; or a copy taken back. */
export const closingMessageTaken = (phase: Closing, { taken }: { readonly taken: boolean }, out: Out): Phase => {
  const { stage } = phase
  if (stage._tag !== "Taking") throw new Error(`MessageTaken at stage ${stage._tag}`)
  const [row, ...left] = stage.left
  if (row === undefined) return take(phase, { ...stage, undo: stage.undo.slice(1) }, out)
  const copy = taken ? undefined : stage.saved.find((n) => n.version === row.notification.version)
  if (copy === undefined) return take(phase, { ...stage, left }, out)
  return take(phase, { ...stage, left, saved: stage.saved.filter((n) => n !== copy), undo: [...stage.undo, copy] }, out)
}

/**
 * The record after the save: the user moved to a new month while we saved (its session may have
 * read the old table already): what was saved follows it; the user was dropped (a hello that
 * found too many messages, or a record gone stale): what was saved is taken back; else the end.
 */
export const closingUserRead = (phase: Closing, { user }: { readonly user: UserRecord | undefined }, out: Out): Phase => {
  const { stage, session } = phase
  if (stage._tag === "Sweeping" && stage.to === undefined) return sweepUserRead(phase, sweepUnderWay(phase), user, resumeAfterSweep, out)
  if (stage._tag !== "ReadingAfter") throw new Error(`UserRead at stage ${stage._tag}`)
  if (user === undefined) {
    const left = stage.saved.map((notification): StoredUnacked => ({ _tag: "Stored", notification, table: stage.table }))
    return take(phase, { _tag: "Taking", table: stage.table, then: { _tag: "Finish", after: undefined }, saved: NOTHING, left, undo: NOTHING }, out)
  }
  const moved = tableMovedTo(stage.table, user)
  if (moved === undefined || stage.saved.length === 0) return finish(phase, user, stage.saved, out)
  out.run({ _tag: "SaveMessages", uaid: session.uaid, table: moved, messages: stage.saved, attempt: 0 })
  return { ...phase, stage: { _tag: "Following", from: stage.table, to: moved, after: user, saved: stage.saved } }
}

/** Saved: the strays (or, following a move, the rows in the old table) are taken out of where they were. */
export const closingMessagesSaved = (phase: Closing, { saved }: { readonly saved: ReadonlyArray<Notification> }, out: Out): Phase => {
  const { stage } = phase
  switch (stage._tag) {
    case "Saving":
      return take(phase, { _tag: "Taking", table: stage.table, then: { _tag: "Clear" }, saved, left: stage.strays, undo: NOTHING }, out)
    case "Sweeping":
      if (stage.to === undefined) throw new Error("MessagesSaved while a sweep reads the record")
      return take(phase, sweepSaved(sweepUnderWay(phase), stage, stage.to, saved), out)
    case "Following": {
      const left = stage.saved.map((notification): StoredUnacked => ({ _tag: "Stored", notification, table: stage.from }))
      return take(phase, { _tag: "Taking", table: stage.to, then: { _tag: "Finish", after: stage.after }, saved, left, undo: NOTHING }, out)
    }
    default:
      throw new Error(`MessagesSaved at stage ${stage._tag}`)
  }
}

/** A page of the old table, read by the sweep. */
export const closingPageRead = (phase: Closing, input: Extract<CommandResult, { _tag: "PageRead" }>, out: Out): Phase => {
  const { stage } = phase
  if (stage._tag !== "Sweeping" || stage.to === undefined) throw new Error(`PageRead at stage ${stage._tag}`)
  return sweepPageRead(phase, sweepUnderWay(phase), stage.to, stage.moved, input.messages, resumeAfterSweep, out)
}

const sweepUnderWay = (phase: Closing): Sweep => {
  if (phase.sweep === undefined) throw new Error(`a sweep's step at stage ${phase.stage._tag} with no sweep`)
  return phase.sweep
}

/** The sweep done: the end goes on from the save of what is unacked (into the session's table, the record's now). */
const resumeAfterSweep = (phase: Closing, out: Out): Phase => mailboxDrained(phase, undefined, out)

/** This node left the record: with nothing saved, the end; else the record is read again. */
export const closingNodeCleared = (phase: Closing, _input: unknown, out: Out): Phase => {
  const { stage } = phase
  if (stage._tag !== "Clearing") throw new Error(`NodeCleared at stage ${stage._tag}`)
  return left(phase, stage.table, stage.saved, out)
}

/** The end: the node the user reconnected to meanwhile (if any) is told to check storage for what was saved. */
const finish = (phase: Closing, after: UserRecord | undefined, saved: ReadonlyArray<Notification>, out: Out): Phase => {
  if (after?.nodeId !== undefined && after.connectedAt !== phase.session.connectedAt) {
    out.signal({ _tag: "NotifyPeer", nodeId: after.nodeId, uaid: phase.session.uaid })
  }
  return ended(phase, saved, out)
}

export const ended = (phase: Closing, saved: ReadonlyArray<Notification>, out: Out): Phase => {
  const uaid = phase.session.uaid
  for (const n of saved) {
    out.event("notification.stored.1", uaid, withReceipt({ channelId: n.channelId, version: n.version, reason: "disconnect" }, n))
  }
  out.event("session.ended.1", uaid, { reason: phase.reason })
  return { _tag: "Closed" }
}
