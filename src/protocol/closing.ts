/**
 * The end of a connection, and what storage failures mean on the way: a socket that closes (or a
 * close we decide) leaves the node; a live session then saves what the client did not ack
 * (`Closing`), and ends (`Closed`). Storage failures: a hello closes; a register or unregister is
 * answered 500; reads, deletes, month moves and the final save are retried with backoff.
 */
import type { CloseKind } from "./close.ts"
import type { CommandResult } from "./inputs.ts"
import { registerReply, unregisterReply } from "./messages.ts"
import { backoff, closeEarly, closeLive, type Out, remember, withSession } from "./out.ts"
import type { Closed, Closing, Live, Phase, Retry, StoredUnacked, Unidentified } from "./phases.ts"
import { isExpired, type Notification } from "../domain/notification.ts"

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
  retry: undefined
})

export const socketClosedEarly = (): Closed => ({ _tag: "Closed" })

// ── saving what is unacked ──────────────────────────────────────────────────────────────────────

/** A delivery still queued when the socket closed: the router port accepted it, so it is kept. */
export const leftover = (phase: Closing, { notification }: { readonly notification: Notification }): Phase => ({
  ...phase,
  session: remember(phase.session, notification, undefined)
})

/**
 * What to save of an ended session: unacked direct messages, unexpired, re-stamped so they sort after
 * what is stored and do not collide; a topic message only if it is still the newest of its topic.
 */
export const mailboxDrained = (phase: Closing, _input: unknown, out: Out): Phase => {
  const s = phase.session
  if (s.user === undefined) return ended(phase, [], out)
  const nowSec = Math.floor(out.now / 1000)
  const messages: Array<Notification> = []
  // Stored topic messages the client has since had a newer message of (a TTL 0 one, sent and never
  // stored) were replaced: their rows go, as acked ones do.
  const replaced: Array<StoredUnacked> = []
  const { unacked, newestTopic, ackedRows } = s.acks
  for (const entry of unacked.values()) {
    const n = entry.notification
    const newest = n.topic === undefined || newestTopic.get(`${n.channelId}:${n.topic}`) === n.version
    if (entry._tag === "Stored") {
      if (!newest) replaced.push(entry)
      continue
    }
    if (isExpired(n, nowSec)) continue
    if (n.topic === undefined) messages.push({ ...n, sortkeyTimestamp: out.now + messages.length })
    else if (newest) messages.push(n)
  }
  const acked = replaced.length === 0 ? ackedRows : [...ackedRows, ...replaced]
  out.run({ _tag: "SaveUnacked", uaid: s.uaid, connectedAt: s.connectedAt, table: s.table, messages, acked, attempt: 0 })
  return phase
}

export const unackedSaved = (phase: Closing, { saved }: { readonly saved: ReadonlyArray<Notification> }, out: Out): Phase =>
  ended(phase, saved, out)

const ended = (phase: Closing, saved: ReadonlyArray<Notification>, out: Out): Phase => {
  const uaid = phase.session.uaid
  for (const n of saved) out.event("notification.stored.1", uaid, { channelId: n.channelId, version: n.version, reason: "disconnect" })
  out.event("session.ended.1", uaid, { reason: phase.reason })
  return { _tag: "Closed" }
}

// ── storage failures ────────────────────────────────────────────────────────────────────────────

/** A hello's storage failed (or did not answer within `storage_timeout`): close — as a handshake timeout once `hello_timeout` has passed. */
export const helloFailed = (phase: Unidentified, _input: Failed, out: Out): Phase =>
  closeEarly(out.now >= phase.openedAt + out.o.helloTimeoutMs ? "hello-timeout" : "storage-error", out)

/** A live session's storage failed: a register or unregister is answered 500; the rest is retried with backoff. */
export const liveCommandFailed = (phase: Live, { command }: Failed, out: Out): Phase => {
  switch (command._tag) {
    case "MintUaid":
    case "ReadUser":
    case "SaveUnacked":
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
    default: {
      const retry: Retry = { command: { ...command, attempt: command.attempt + 1 }, at: out.now + backoff(out.o, command.attempt) }
      return withSession(phase, { ...phase.session, retry })
    }
  }
}

/** The final save failed: retried with backoff until `saveRetryForMs`; then the session ends without it. */
export const closingFailed = (phase: Closing, { command }: Failed, out: Out): Phase => {
  if (command._tag !== "SaveUnacked") throw new Error(`${command._tag} failed in phase Closing`)
  if (out.now - phase.since >= out.o.saveRetryForMs) return ended(phase, [], out)
  return { ...phase, retry: { command: { ...command, attempt: command.attempt + 1 }, at: out.now + backoff(out.o, command.attempt) } }
}
