/**
 * The client's commands: register and unregister (with the storage and crypto they need), ping,
 * nack — and the command budget they go through (a token bucket per client; beyond it commands
 * wait, in order, and the socket stops being read while many wait).
 */
import type { CommandResult, Registering } from "./inputs.ts"
import { type ClientMessage, PING_REPLY, registerReply, unregisterReply, urgencyReply } from "./messages.ts"
import { refuse } from "./refusal.ts"
import { closeLive, type Out, withSession } from "./out.ts"
import { type Budget, HELD_COMMANDS_MAX, heldPush, heldTake, type Live, type Migrating, type Moving, type Phase, type ProtocolOptions } from "./phases.ts"
import { decodeVapidPublicKey } from "../crypto/endpoint.ts"
import { withReceipt } from "../domain/events.ts"
import { isCanonicalChannelId, parseChannelId } from "../domain/ids.ts"
import { type Urgency, URGENCIES, urgentEnough } from "../domain/notification.ts"
import { USER_RECORD_VERSION, type UserRecord } from "../domain/user.ts"

type Msg<T extends ClientMessage["messageType"]> = Extract<ClientMessage, { readonly messageType: T }>

// ── the budget ──────────────────────────────────────────────────────────────────────────────────

/** The bucket refilled to `now` (a full one is left as it is: its time does not matter). */
const refill = (b: Budget, o: ProtocolOptions, now: number): Budget => {
  if (b.tokens >= o.commandBurst) return b
  return { ...b, tokens: Math.min(o.commandBurst, b.tokens + ((now - b.tokensAt) * o.commandsPerSecond) / 1000), tokensAt: now }
}

/**
 * A command that costs budget: run now when there is budget and nothing waits before it; otherwise
 * it waits (in order), and the socket stops being read while many wait. `admitted`: it waited and
 * the budget let it through.
 */
export const budgeted = <P extends Live, M extends ClientMessage>(handle: (phase: P, message: M, out: Out) => Phase) =>
(phase: P, message: M, out: Out, admitted: boolean): Phase => {
  if (admitted) return handle(phase, message, out)
  const s = phase.session
  const b = refill(s.budget, out.options, out.now)
  if (b.held.length === 0 && b.tokens >= 1) return handle(withSession(phase, { ...s, budget: { ...b, tokens: b.tokens - 1, tokensAt: out.now } }), message, out)
  const held = heldPush(b.held, message)
  const pause = held.length >= HELD_COMMANDS_MAX && !b.readingPaused
  if (pause) out.signal({ _tag: "PauseReading" })
  return withSession(phase, { ...s, budget: { ...b, held, readingPaused: b.readingPaused || pause } })
}

/** Release waiting commands the budget now allows (at a tick). */
export const releaseHeld = <P extends Live>(phase: P, out: Out): P => {
  const s = phase.session
  if (s.budget.held.length === 0) return phase
  const b = refill(s.budget, out.options, out.now)
  const n = Math.min(b.held.length, Math.floor(b.tokens))
  if (n === 0) return b === s.budget ? phase : withSession(phase, { ...s, budget: b })
  const [released, held] = heldTake(b.held, n)
  out.signal({ _tag: "Replay", messages: released, admitted: true })
  const resume = b.readingPaused && held.length === 0
  if (resume) out.signal({ _tag: "ResumeReading" })
  return withSession(phase, { ...s, budget: { ...b, tokens: b.tokens - n, held, readingPaused: b.readingPaused && !resume } })
}

/** When the budget lets the first waiting command through (ms), if one waits. */
export const budgetDeadline = (b: Budget, o: ProtocolOptions): number =>
  b.held.length === 0 ? Number.POSITIVE_INFINITY : b.tokensAt + Math.ceil((1 - b.tokens) * 1000 / o.commandsPerSecond)

// ── register / unregister ───────────────────────────────────────────────────────────────────────

/**
 * A register: its channel id must be canonical, and its key (if any) a VAPID public key — required
 * when the server accepts only VAPID-signed pushes, since a keyless endpoint could then receive
 * nothing from its app's server unless that server signs anyway; then the endpoint is made.
 */
export const register = (phase: Live, message: Msg<"register">, out: Out): Phase => {
  if (!isCanonicalChannelId(message.channelID)) {
    refuse(out, phase.session.uaid, message, "invalid-channel-id")
    return phase
  }
  const key = message.key ?? undefined
  if (key === undefined && out.options.requireVapid) {
    refuse(out, phase.session.uaid, message, "vapid-required")
    return phase
  }
  const rawKey = key === undefined ? undefined : decodeVapidPublicKey(key)
  if (key !== undefined && rawKey === undefined) {
    refuse(out, phase.session.uaid, message, "invalid-key")
    return phase
  }
  out.run({ _tag: "MakeEndpoint", uaid: phase.session.uaid, channelId: message.channelID, rawKey })
  return phase
}

/** The endpoint is made: add the channel (a new uaid's router record is written first). */
export const endpointMade = (phase: Live, input: Extract<CommandResult, { _tag: "EndpointMade" }>, out: Out): Phase => {
  const s = phase.session
  const { channelId } = input.command
  const registering: Registering = { channelId, endpoint: input.endpoint }
  if (s.recorded) {
    out.run({ _tag: "AddChannel", uaid: s.uaid, table: s.table, registering })
    return phase
  }
  const user: UserRecord = {
    uaid: s.uaid,
    routerType: "webpush",
    routerData: {},
    connectedAt: s.connectedAt,
    nodeId: out.options.routerUrl,
    currentMonth: s.table,
    recordVersion: USER_RECORD_VERSION,
    ...(s.minUrgency === undefined ? {} : { urgency: s.minUrgency })
  }
  out.run({ _tag: "WriteUser", user, purpose: { _tag: "Register", registering } })
  return phase
}

/** The first register of a new uaid wrote its router record. */
export const userWritten = (phase: Live, input: Extract<CommandResult, { _tag: "UserWritten" }>, out: Out): Phase => {
  const { purpose } = input.command
  if (purpose._tag !== "Register") throw new Error("a resume write answered in an identified phase")
  if (!input.written) {
    refuse(out, phase.session.uaid, { messageType: "register", channelID: purpose.registering.channelId }, "not-written")
    return phase
  }
  out.run({ _tag: "AddChannel", uaid: phase.session.uaid, table: phase.session.table, registering: purpose.registering })
  return withSession(phase, { ...phase.session, recorded: true })
}

export const channelAdded = (phase: Live, { registering, added }: { readonly registering: Registering; readonly added: boolean }, out: Out): Phase => {
  if (!added) {
    refuse(out, phase.session.uaid, { messageType: "register", channelID: registering.channelId }, "too-many-channels")
    return phase
  }
  out.event("channel.registered.1", phase.session.uaid, { channelId: registering.channelId })
  out.frame(registerReply(registering.channelId, 200, registering.endpoint))
  return phase
}

export const unregister = (phase: Live, message: Msg<"unregister">, out: Out): Phase => {
  const s = phase.session
  const channelId = parseChannelId(message.channelID)
  if (channelId === undefined) {
    refuse(out, s.uaid, message, "invalid-channel-id")
    return phase
  }
  if (!s.recorded) {
    out.event("channel.unregistered.1", s.uaid, { channelId, code: message.code })
    out.frame(unregisterReply(channelId, 200))
    return phase
  }
  out.run({ _tag: "RemoveChannel", uaid: s.uaid, table: s.table, channelId, code: message.code })
  return phase
}

export const channelRemoved = (phase: Live, { command }: Extract<CommandResult, { _tag: "ChannelRemoved" }>, out: Out): Phase => {
  out.event("channel.unregistered.1", phase.session.uaid, { channelId: command.channelId, code: command.code })
  out.frame(unregisterReply(command.channelId, 200))
  return phase
}

/**
 * While the user's month moves, register and unregister wait until it lives in this month's table
 * (so that a channel is added to, or removed from, the set it will live in), at most `HELD_COMMANDS_MAX` of them; beyond, one is answered 503 at once (the socket
 * must go on being read: the move waits for the client's acks).
 */
export const deferred = <P extends Migrating | Moving>(phase: P, message: Msg<"register" | "unregister">, out: Out): Phase => {
  if (phase.deferred.length < HELD_COMMANDS_MAX) return { ...phase, deferred: [...phase.deferred, message] }
  refuse(out, phase.session.uaid, message, "busy")
  return phase
}

// ── the client's minimum urgency (RFC 8030 §5.3) ────────────────────────────────────────────────

/**
 * `urgency`: from now on the client gets only messages at least this urgent; the others wait in
 * storage. Kept in the router record (a new uaid's at its first register), answered once written.
 */
export const urgency = (phase: Live, message: Msg<"urgency">, out: Out): Phase => {
  const min = URGENCIES.find((u) => u === message.min)
  if (min === undefined) {
    refuse(out, phase.session.uaid, message, "invalid-urgency")
    return phase
  }
  const s = phase.session
  if (!s.recorded) return urgencySet(withSession(phase, s), min, out)
  out.run({ _tag: "WriteUrgency", uaid: s.uaid, min })
  return phase
}

/** Written: the session takes it; a lower minimum lets held messages go (`drainHeld`: how this phase reads storage again). */
export const urgencyWritten = <P extends Live>(drainHeld: (phase: P, out: Out) => Phase) =>
(phase: P, { command }: Extract<CommandResult, { _tag: "UrgencyWritten" }>, out: Out): Phase => {
  const before = phase.session.minUrgency
  const lowered = before !== undefined && !urgentEnough({ urgency: command.min }, before)
  const next = urgencySet(phase, command.min, out)
  return lowered ? drainHeld(next, out) : next
}

const urgencySet = <P extends Live>(phase: P, min: Urgency, out: Out): P => {
  out.event("client.urgency.1", phase.session.uaid, { min })
  out.frame(urgencyReply(200))
  return withSession(phase, { ...phase.session, minUrgency: min })
}

// ── ping, nack ──────────────────────────────────────────────────────────────────────────────────

export const ping = (phase: Live, _message: unknown, out: Out): Phase => {
  const s = phase.session
  const last = s.keepalive.lastClientPing
  if (last !== undefined && out.now - last < out.options.minPingIntervalMs) return closeLive(phase, "excessive-ping", out)
  out.frame(PING_REPLY)
  return withSession(phase, { ...s, keepalive: { ...s.keepalive, lastClientPing: out.now } })
}

export const nack = (phase: Live, message: Msg<"nack">, out: Out): Phase => {
  const unacked = phase.session.acks.unacked.get(message.version)
  const data = { version: message.version, code: message.code ?? 0 }
  out.event("notification.nacked.1", phase.session.uaid, unacked === undefined ? data : withReceipt(data, unacked.notification))
  return phase
}
