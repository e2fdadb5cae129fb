/**
 * The end of a connection, and what storage failures mean on the way: a socket that closes (or a
 * close we decide) leaves the node; a live session then saves what the client did not ack
 * (`Closing`, a storage call a stage: delete acked rows, read the record, save into the table it
 * names, leave the record, read it again to follow a month move or poke the node the user moved
 * to), and ends (`Closed`). Storage failures: a hello closes; a register or unregister is answered
 * 500; reads, deletes, month moves and the steps of the end are retried with backoff.
 */
import type { CloseKind } from "./close.ts"
import type { CommandResult } from "./inputs.ts"
import { refuse } from "./refusal.ts"
import { backoff, closeEarly, closeLive, COLLECTING, newestOfTopic, NOTHING, type Out, remember, withSession } from "./out.ts"
import type { Closed, Closing, ClosingStage, Live, Phase, Retry, StoredUnacked, Unidentified } from "./phases.ts"
import { receiptOf } from "../domain/events.ts"
import { isExpired, type Notification } from "../domain/notification.ts"
import { tableMovedTo, type UserRecord } from "../domain/user.ts"

type Failed = Extract<CommandResult, { _tag: "CommandFailed" }>

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
  since: out.now,
  retry: undefined,
  stage: COLLECTING
})

export const socketClosedEarly = (): Closed => ({ _tag: "Closed" })

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
 * after the move: no later hello reads it), which follow the user. Acked rows not deleted yet go
 * first — those acked since the last delete, and those of a delete that failed and waits for its
 * retry: acked means deleted, whenever the socket closes.
 */
export const mailboxDrained = (phase: Closing, _input: unknown, out: Out): Phase => {
  const s = phase.session
  if (!s.recorded) return ended(phase, NOTHING, out)
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
  const pending = s.retry?.command._tag === "DeleteMessages" ? s.retry.command.messages : NOTHING
  const acked = replaced.length === 0 && pending.length === 0 ? ackedRows : [...pending, ...ackedRows, ...replaced]
  if (acked.length === 0) return takeStrays(phase, messages, strays, out)
  out.run({ _tag: "DeleteMessages", uaid: s.uaid, messages: acked, attempt: 0 })
  return { ...phase, stage: { _tag: "DeletingAcked", messages, strays } }
}

/** Strays are taken out of the table they were read from, one by one (each with `MessageTaken`); then the save. */
const takeStrays = (phase: Closing, messages: ReadonlyArray<Notification>, left: ReadonlyArray<StoredUnacked>, out: Out): Phase => {
  const [next] = left
  if (next === undefined) return saveUnacked(phase, messages, out)
  out.run({ _tag: "TakeMessage", uaid: phase.session.uaid, row: next, attempt: 0 })
  return { ...phase, stage: { _tag: "TakingStrays", messages, left } }
}

/** What was saved is taken out of the table the user left, one by one; then what was still there is saved where it lives. */
const takeMoved = (phase: Closing, stage: Extract<ClosingStage, { _tag: "TakingMoved" }>, out: Out): Phase => {
  const [next] = stage.left
  if (next !== undefined) {
    out.run({ _tag: "TakeMessage", uaid: phase.session.uaid, row: next, attempt: 0 })
    return { ...phase, stage }
  }
  if (stage.taken.length === 0) return finish(phase, stage.after, stage.saved, out)
  out.run({ _tag: "SaveMessages", uaid: phase.session.uaid, table: stage.to, messages: stage.taken, attempt: 0 })
  return { ...phase, stage: { _tag: "Following", after: stage.after, saved: stage.saved } }
}

/** Unacked messages go to the table the router record names (read now: the user may have moved); nothing to save: this node just leaves the record. */
const saveUnacked = (phase: Closing, messages: ReadonlyArray<Notification>, out: Out): Phase => {
  const s = phase.session
  if (messages.length === 0) {
    out.run({ _tag: "ClearNodeId", uaid: s.uaid, connectedAt: s.connectedAt, attempt: 0 })
    return { ...phase, stage: { _tag: "Clearing", table: undefined, saved: NOTHING } }
  }
  out.run({ _tag: "ReadUser", uaid: s.uaid, attempt: 0 })
  return { ...phase, stage: { _tag: "ReadingBefore", messages } }
}

/** Acked rows deleted: the strays are taken next, then the save. */
export const closingRowsDeleted = (phase: Closing, _input: unknown, out: Out): Phase => {
  const { stage } = phase
  if (stage._tag !== "DeletingAcked") throw new Error(`MessagesDeleted at stage ${stage._tag}`)
  return takeStrays(phase, stage.messages, stage.strays, out)
}

/** A row taken (or found gone) out of the table it was in: a stray joins what is saved; a moved message what follows the user. */
export const closingMessageTaken = (phase: Closing, { taken }: { readonly taken: boolean }, out: Out): Phase => {
  const { stage } = phase
  switch (stage._tag) {
    case "TakingStrays": {
      const [row, ...left] = stage.left
      const messages = taken && row !== undefined ? [...stage.messages, row.notification] : stage.messages
      return takeStrays(phase, messages, left, out)
    }
    case "TakingMoved": {
      const [row, ...left] = stage.left
      const moved = taken && row !== undefined ? [...stage.taken, row.notification] : stage.taken
      return takeMoved(phase, { ...stage, left, taken: moved }, out)
    }
    default:
      throw new Error(`MessageTaken at stage ${stage._tag}`)
  }
}

/** The record before the save (gone: the user was dropped, nothing to keep), or after it (moved?). */
export const closingUserRead = (phase: Closing, { user }: { readonly user: UserRecord | undefined }, out: Out): Phase => {
  const { stage, session } = phase
  switch (stage._tag) {
    case "ReadingBefore": {
      if (user === undefined) return ended(phase, NOTHING, out)
      const table = user.currentMonth ?? session.table
      out.run({ _tag: "SaveMessages", uaid: session.uaid, table, messages: stage.messages, attempt: 0 })
      return { ...phase, stage: { _tag: "Saving", table } }
    }
    case "ReadingAfter": {
      const moved = tableMovedTo(stage.table, user)
      if (user === undefined || moved === undefined) return finish(phase, user, stage.saved, out)
      // The user moved to a new month while we saved (its session may have read the old table already).
      const left = stage.saved.map((notification): StoredUnacked => ({ _tag: "Stored", notification, table: stage.table }))
      return takeMoved(phase, { _tag: "TakingMoved", to: moved, after: user, saved: stage.saved, left, taken: NOTHING }, out)
    }
    default:
      throw new Error(`UserRead at stage ${stage._tag}`)
  }
}

/** Saved: this node leaves the record next; or, saved into the user's new month, the end. */
export const closingMessagesSaved = (phase: Closing, { saved }: { readonly saved: ReadonlyArray<Notification> }, out: Out): Phase => {
  const { stage, session } = phase
  switch (stage._tag) {
    case "Saving":
      out.run({ _tag: "ClearNodeId", uaid: session.uaid, connectedAt: session.connectedAt, attempt: 0 })
      return { ...phase, stage: { _tag: "Clearing", table: stage.table, saved } }
    case "Following":
      return finish(phase, stage.after, stage.saved, out)
    default:
      throw new Error(`MessagesSaved at stage ${stage._tag}`)
  }
}

/** This node left the record: with nothing saved, the end; else the record is read again. */
export const closingNodeCleared = (phase: Closing, _input: unknown, out: Out): Phase => {
  const { stage, session } = phase
  if (stage._tag !== "Clearing") throw new Error(`NodeCleared at stage ${stage._tag}`)
  if (stage.table === undefined) return ended(phase, NOTHING, out)
  out.run({ _tag: "ReadUser", uaid: session.uaid, attempt: 0 })
  return { ...phase, stage: { _tag: "ReadingAfter", table: stage.table, saved: stage.saved } }
}

/** The end: the node the user reconnected to meanwhile (if any) is told to check storage for what was saved. */
const finish = (phase: Closing, after: UserRecord | undefined, saved: ReadonlyArray<Notification>, out: Out): Phase => {
  if (after?.nodeId !== undefined && after.connectedAt !== phase.session.connectedAt) {
    out.signal({ _tag: "NotifyPeer", nodeId: after.nodeId, uaid: phase.session.uaid })
  }
  return ended(phase, saved, out)
}

const ended = (phase: Closing, saved: ReadonlyArray<Notification>, out: Out): Phase => {
  const uaid = phase.session.uaid
  for (const n of saved) {
    out.event("notification.stored.1", uaid, { channelId: n.channelId, version: n.version, reason: "disconnect", ...receiptOf(n) })
  }
  out.event("session.ended.1", uaid, { reason: phase.reason })
  return { _tag: "Closed" }
}

// ── storage failures ────────────────────────────────────────────────────────────────────────────

/** A hello's storage failed (or did not answer within `storage_timeout`): close — as a handshake timeout once `hello_timeout` has passed. */
export const helloFailed = (phase: Unidentified, _input: Failed, out: Out): Phase =>
  closeEarly(out.now >= phase.openedAt + out.options.helloTimeoutMs ? "hello-timeout" : "storage-error", out)

/** A live session's storage failed: a register or unregister is answered 500; the rest is retried with backoff. */
export const liveCommandFailed = (phase: Live, { command }: Failed, out: Out): Phase => {
  switch (command._tag) {
    case "MintUaid":
    case "ReadUser":
    case "SaveMessages":
    case "ClearNodeId":
    case "TakeMessage":
      throw new Error(`${command._tag} failed in phase ${phase._tag}`)
    case "WriteUser":
      if (command.purpose._tag === "Resume") throw new Error(`a resume write failed in phase ${phase._tag}`)
      refuse(out, phase.session.uaid, { messageType: "register", channelID: command.purpose.registering.channelId }, "not-written")
      return phase
    case "MakeEndpoint":
      refuse(out, phase.session.uaid, { messageType: "register", channelID: command.channelId }, "not-written")
      return phase
    case "AddChannel":
      refuse(out, phase.session.uaid, { messageType: "register", channelID: command.registering.channelId }, "not-written")
      return phase
    case "RemoveChannel":
      refuse(out, phase.session.uaid, { messageType: "unregister", channelID: command.channelId }, "not-written")
      return phase
    case "WriteUrgency":
      refuse(out, phase.session.uaid, { messageType: "urgency" }, "not-written")
      return phase
    default: {
      const retry: Retry = { command: { ...command, attempt: command.attempt + 1 }, at: out.now + backoff(out.options, command.attempt) }
      return withSession(phase, { ...phase.session, retry })
    }
  }
}

/** A step of the end failed: retried with backoff until `saveRetryForMs`; then the session ends without what was left. */
export const closingFailed = (phase: Closing, { command }: Failed, out: Out): Phase => {
  switch (command._tag) {
    case "ReadUser":
    case "SaveMessages":
    case "ClearNodeId":
    case "DeleteMessages":
    case "TakeMessage": {
      if (out.now - phase.since >= out.options.saveRetryForMs) return ended(phase, NOTHING, out)
      return { ...phase, retry: { command: { ...command, attempt: command.attempt + 1 }, at: out.now + backoff(out.options, command.attempt) } }
    }
    default:
      throw new Error(`${command._tag} failed in phase Closing`)
  }
}
