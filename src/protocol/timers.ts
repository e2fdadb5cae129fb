/**
 * Time: the hello timeout, the keepalive (our ping, the client's pong, a broadcast change instead of
 * a ping), retries that are due, waiting commands the budget releases — and `deadlineOf`, when the
 * node's ticker must wake a connection next.
 */
import { behind } from "./broadcasts.ts"
import { budgetDeadline, releaseHeld } from "./commands.ts"
import { broadcastFrame } from "./messages.ts"
import { closeEarly, closeLive, COLLECTING, type Out, withSession } from "./out.ts"
import type { AwaitingHello, Closing, Live, Phase, ProtocolOptions } from "./phases.ts"

export const helloTick = (phase: AwaitingHello, _input: unknown, out: Out): Phase =>
  out.now >= phase.openedAt + out.options.helloTimeoutMs ? closeEarly("hello-timeout", out) : phase

/** Keepalive, the retry due, and the waiting commands the budget allows. */
export const liveTick = (phase: Live, _input: unknown, out: Out): Phase => {
  let s = phase.session
  const now = out.now
  const { pingSentAt, lastActivity } = s.keepalive
  if (pingSentAt !== undefined && now >= pingSentAt + out.options.autoPingTimeoutMs) return closeLive(phase, "pong-timeout", out)
  if (pingSentAt === undefined && now >= lastActivity + out.options.autoPingIntervalMs) {
    // A change of a followed broadcast goes out instead of the ping (it keeps the connection alive too).
    const update = behind(s, out.broadcasts)
    if (update.changed !== undefined) {
      out.frame(broadcastFrame(update.changed))
      out.event("broadcast.delivered.1", s.uaid, { broadcasts: update.changed, reason: "change" })
      s = { ...s, broadcasts: update.broadcasts, keepalive: { ...s.keepalive, lastActivity: now } }
    } else {
      out.signal({ _tag: "Ping" })
      s = { ...s, keepalive: { ...s.keepalive, pingSentAt: now } }
    }
  }
  if (s.retry !== undefined && now >= s.retry.at) {
    out.run(s.retry.command)
    s = { ...s, retry: undefined }
  }
  return releaseHeld(s === phase.session ? phase : withSession(phase, s), out)
}

export const closingTick = (phase: Closing, _input: unknown, out: Out): Phase => {
  if (phase.stage._tag === "Answering") return out.now >= phase.stage.until ? { ...phase, stage: COLLECTING } : phase
  if (phase.retry === undefined || out.now < phase.retry.at) return phase
  out.run(phase.retry.command)
  return { ...phase, retry: undefined }
}

/** Activity from the client: the keepalive starts over. */
export const active = <P extends Live>(phase: P, now: number): P =>
  withSession(phase, { ...phase.session, keepalive: { ...phase.session.keepalive, lastActivity: now, pingSentAt: undefined } })

export const pong = (phase: Live, _input: unknown, out: Out): Phase => active(phase, out.now)

/** When the node's ticker must wake this connection next (ms), or Infinity. */
export const deadlineOf = (phase: Phase, o: ProtocolOptions): number => {
  switch (phase._tag) {
    case "AwaitingHello":
    case "Resuming":
    case "Rechecking":
    case "Minting":
      return phase.openedAt + o.helloTimeoutMs
    case "Identified":
    case "Draining":
    case "Migrating":
    case "Moving": {
      const s = phase.session
      const { pingSentAt, lastActivity } = s.keepalive
      const keepalive = pingSentAt !== undefined ? pingSentAt + o.autoPingTimeoutMs : lastActivity + o.autoPingIntervalMs
      return Math.min(keepalive, s.retry?.at ?? Number.POSITIVE_INFINITY, budgetDeadline(s.budget, o))
    }
    case "Closing":
      return phase.stage._tag === "Answering" ? phase.stage.until : phase.retry?.at ?? Number.POSITIVE_INFINITY
    case "Closed":
      return Number.POSITIVE_INFINITY
  }
}
