/**
 * The per-session summary record (protocol-notes §7, logged as `Session` when a connection ends) as a
 * fold over the session's domain events: no counters of its own, so replaying a session's events
 * rebuilds it exactly.
 */
import type { DomainEvent } from "../domain/events.ts"

export interface SessionSummary {
  readonly uaid: string | undefined
  /** Time of the session's hello and of its end (ms). */
  readonly helloAt: number | undefined
  readonly endedAt: number | undefined
  readonly directAcked: number
  readonly directStored: number
  readonly storedRetrieved: number
  readonly storedAcked: number
  readonly nacks: number
  readonly registers: number
  readonly unregisters: number
  readonly disconnectReason: string | undefined
}

export const emptySummary: SessionSummary = {
  uaid: undefined,
  helloAt: undefined,
  endedAt: undefined,
  directAcked: 0,
  directStored: 0,
  storedRetrieved: 0,
  storedAcked: 0,
  nacks: 0,
  registers: 0,
  unregisters: 0,
  disconnectReason: undefined
}

export const foldSummary = (s: SessionSummary, event: DomainEvent): SessionSummary => {
  switch (event.type) {
    case "client.hello.1":
      return { ...s, uaid: event.uaid, helloAt: event.time }
    case "channel.registered.1":
      return { ...s, registers: s.registers + 1 }
    case "channel.unregistered.1":
      return { ...s, unregisters: s.unregisters + 1 }
    case "notification.delivered.1":
      return event.data.source === "stored" ? { ...s, storedRetrieved: s.storedRetrieved + 1 } : s
    case "notification.acked.1":
      return event.data.source === "stored"
        ? { ...s, storedAcked: s.storedAcked + 1 }
        : { ...s, directAcked: s.directAcked + 1 }
    case "notification.nacked.1":
      return { ...s, nacks: s.nacks + 1 }
    case "notification.stored.1":
      return event.data.reason === "disconnect" ? { ...s, directStored: s.directStored + 1 } : s
    case "session.ended.1":
      return { ...s, endedAt: event.time, disconnectReason: event.data.reason }
    default:
      return s
  }
}

/** The summary as logged (field names of the reference's `Session` record). */
export const summaryFields = (s: SessionSummary, opaque: (uaid: string) => string): Record<string, unknown> => ({
  uaid_hash: s.uaid === undefined ? null : opaque(s.uaid),
  connection_time: s.helloAt === undefined || s.endedAt === undefined ? 0 : s.endedAt - s.helloAt,
  direct_acked: s.directAcked,
  direct_storage: s.directStored,
  stored_retrieved: s.storedRetrieved,
  stored_acked: s.storedAcked,
  nacks: s.nacks,
  registers: s.registers,
  unregisters: s.unregisters,
  disconnect_reason: s.disconnectReason ?? "unknown"
})
