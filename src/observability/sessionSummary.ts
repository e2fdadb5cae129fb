/**
 * The per-session summary record (autopush's `Session` log record, logged when a connection ends) as a
 * fold over the session's domain events: no counters of its own, so replaying a session's events
 * rebuilds it exactly.
 */
import type { DomainEvent } from "../domain/events.ts"

export interface SessionSummary {
  readonly uaid: string | undefined
  /** Time of the session's hello and of its end (ms). */
  readonly helloAt: number | undefined
  readonly endedAt: number | undefined
  readonly disconnectReason: string | undefined
  /** A record of its own: every live session keeps a summary, most of them with nothing counted yet. */
  readonly counts: SessionCounts
}

interface SessionCounts {
  readonly directAcked: number
  readonly directStored: number
  readonly storedRetrieved: number
  readonly storedAcked: number
  readonly nacks: number
  readonly registers: number
  readonly unregisters: number
}

const noCounts: SessionCounts = {
  directAcked: 0,
  directStored: 0,
  storedRetrieved: 0,
  storedAcked: 0,
  nacks: 0,
  registers: 0,
  unregisters: 0
}

export const emptySummary: SessionSummary = {
  uaid: undefined,
  helloAt: undefined,
  endedAt: undefined,
  disconnectReason: undefined,
  counts: noCounts
}

const count = (s: SessionSummary, key: keyof SessionCounts): SessionSummary => ({ ...s, counts: { ...s.counts, [key]: s.counts[key] + 1 } })

export const foldSummary = (s: SessionSummary, event: DomainEvent): SessionSummary => {
  switch (event.type) {
    case "client.hello.1":
      return { ...s, uaid: event.uaid, helloAt: event.time }
    case "channel.registered.1":
      return count(s, "registers")
    case "channel.unregistered.1":
      return count(s, "unregisters")
    case "notification.delivered.1":
      return event.data.source === "stored" ? count(s, "storedRetrieved") : s
    case "notification.acked.1":
      return count(s, event.data.source === "stored" ? "storedAcked" : "directAcked")
    case "notification.nacked.1":
      return count(s, "nacks")
    case "notification.stored.1":
      return event.data.reason === "disconnect" ? count(s, "directStored") : s
    case "session.ended.1":
      return { ...s, endedAt: event.time, disconnectReason: event.data.reason }
    default:
      return s
  }
}

/** The summary as logged (field names of autopush-rs's `Session` record). */
export const summaryFields = (s: SessionSummary, opaque: (uaid: string) => string): Record<string, unknown> => ({
  uaid_hash: s.uaid === undefined ? null : opaque(s.uaid),
  connection_time: s.helloAt === undefined || s.endedAt === undefined ? 0 : s.endedAt - s.helloAt,
  direct_acked: s.counts.directAcked,
  direct_storage: s.counts.directStored,
  stored_retrieved: s.counts.storedRetrieved,
  stored_acked: s.counts.storedAcked,
  nacks: s.counts.nacks,
  registers: s.counts.registers,
  unregisters: s.counts.unregisters,
  disconnect_reason: s.disconnectReason ?? "unknown"
})
