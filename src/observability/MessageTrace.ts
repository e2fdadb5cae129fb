/**
 * "What happened to message X?": the lifecycle of recent messages, from the domain events that name
 * a message id (accepted, routed, stored, delivered, acked, nacked, expired, deleted), kept in a
 * bounded in-memory window — the last `capacity` such events, the oldest forgotten first. Served as
 * `GET /__trace__/{message_id}` on the connection node's router port.
 *
 * A process sees the events it records: in the all-in-one process the endpoint and the connection
 * node share one event log, so a trace has both halves (accepted, routed → delivered, acked); a
 * separate endpoint node sees accepted/routed/stored/expired/deleted and a separate connection node
 * sees delivered/acked/nacked/expired and stored-at-disconnect. Ask both and merge by time.
 *
 * The document carries opaque ids only (`opaque.ts`), so a trace can be shared like an event-log
 * line. Recording is on every message's path, so it only puts the event in a ring: no index, no
 * per-message record (keeping one per message cost a fifth of a connected push's CPU, most of it in
 * the garbage collector). A lookup reads the whole window instead (about 0.3 ms for 40,000 events);
 * the hashing for an opaque id and the document are done then too.
 */
import * as Context from "effect/Context"
import * as Layer from "effect/Layer"
import type { DomainEvent } from "../domain/events.ts"
import type { EventSink } from "./EventLog.ts"
import { isOpaqueId, makeOpaqueIds, opaqueId } from "./opaque.ts"

interface TraceEntry {
  readonly time: number
  readonly type: string
  readonly data: Readonly<Record<string, unknown>>
}

/** Where the message is, as far as this process knows. */
export type TraceState =
  | "accepted"
  | "routed"
  | "stored"
  | "delivered"
  | "bridged"
  | "nacked"
  | "acked"
  | "expired"
  | "deleted"
  | "failed"

export interface TraceDocument {
  /** Opaque id of the message. */
  readonly message: string
  /** Opaque id of its user. */
  readonly uaid: string
  readonly channelId?: string
  readonly state: TraceState
  readonly firstSeen: number
  readonly lastSeen: number
  readonly events: ReadonlyArray<TraceEntry>
  /** True when events beyond `maxEventsPerMessage` were left out. */
  readonly truncated: boolean
}

interface MessageTraceService {
  readonly sink: EventSink
  /** By message id (the `Location` of a 201) or its opaque id (the event log's `version`). */
  readonly lookup: (messageId: string) => TraceDocument | undefined
  /** Messages with events in the window (read from the whole window). */
  readonly size: () => number
}

interface MessageTraceOptions {
  /** Events retained. Default 40,000: the last 10,000 messages or so (accepted, routed, delivered, acked). */
  readonly capacity?: number
  /** Events shown per message (the first ones). Default 32. */
  readonly maxEventsPerMessage?: number
  readonly opaque?: ((value: string) => string) | undefined
}

const TERMINAL: ReadonlySet<TraceState> = new Set(["acked", "bridged", "expired", "deleted", "failed"])

/** The message id of an event with a trace state: every one of them names its message. */
const versionOf = (event: DomainEvent): string => (event.data as { readonly version: string }).version

/** Where an event leaves its message; undefined for events about no message. */
const stateOf = (event: DomainEvent): TraceState | undefined => {
  switch (event.type) {
    case "notification.accepted.1":
      return "accepted"
    case "notification.routed.1":
      return event.data.outcome === "failed" ? "failed" : "routed"
    case "notification.stored.1":
      return "stored"
    case "notification.delivered.1":
      return "delivered"
    case "notification.bridged.1":
      return "bridged"
    case "notification.bridge_failed.1":
      return "failed"
    case "notification.nacked.1":
      return "nacked"
    case "notification.acked.1":
      return "acked"
    case "notification.expired.1":
      return "expired"
    case "notification.deleted.1":
      return "deleted"
    default:
      return undefined
  }
}

/** A later event moves the state on, except that acked/bridged/expired/deleted/failed are final and routed only follows accepted. */
const nextState = (current: TraceState, next: TraceState): TraceState =>
  TERMINAL.has(current) ? current
  : next === "routed" ? (current === "accepted" ? "routed" : current)
  : next

export const makeMessageTrace = (options: MessageTraceOptions = {}): MessageTraceService => {
  const capacity = Math.max(1, options.capacity ?? 40_000)
  const maxEvents = Math.max(1, options.maxEventsPerMessage ?? 32)
  const opaque = options.opaque ?? makeOpaqueIds()
  /** The last `capacity` events about a message; `next` is the oldest one's slot. */
  const ring: Array<DomainEvent | undefined> = new Array<DomainEvent | undefined>(capacity).fill(undefined)
  let next = 0

  const sink: EventSink = (event) => {
    if (stateOf(event) === undefined) return
    ring[next] = event
    next = next + 1 === capacity ? 0 : next + 1
  }

  /** Each event of the window, oldest first, until `visit` says stop (true). */
  const visitEvents = (visit: (event: DomainEvent) => boolean | void): void => {
    for (let i = 0; i < capacity; i++) {
      const event = ring[next + i < capacity ? next + i : next + i - capacity]
      if (event !== undefined && visit(event) === true) return
    }
  }

  const document = (version: string, all: ReadonlyArray<DomainEvent>): TraceDocument => {
    const first = all[0] as DomainEvent
    let state = stateOf(first) as TraceState
    for (let i = 1; i < all.length; i++) state = nextState(state, stateOf(all[i] as DomainEvent) as TraceState)
    let channelId: string | undefined
    const events = all.slice(0, maxEvents).map((event): TraceEntry => {
      const data: Record<string, unknown> = {}
      for (const [k, v] of Object.entries(event.data)) {
        if (k === "version" || v === undefined) continue
        if (k === "channelId" && typeof v === "string") {
          channelId ??= v
          continue
        }
        data[k] = v
      }
      return { time: event.time, type: event.type, data }
    })
    return {
      message: opaque(version),
      uaid: opaque(first.uaid),
      ...(channelId !== undefined ? { channelId } : {}),
      state,
      firstSeen: first.time,
      lastSeen: (all[all.length - 1] as DomainEvent).time,
      events,
      truncated: all.length > maxEvents
    }
  }

  const eventsOf = (version: string): Array<DomainEvent> => {
    const events: Array<DomainEvent> = []
    visitEvents((event) => {
      if (versionOf(event) === version) events.push(event)
    })
    return events
  }

  /** The message id whose opaque id this is, if it is in the window. */
  const byOpaqueId = (opaqueMessageId: string): string | undefined => {
    // Hashed without the shared memo: the window's ids would push out the ones the event log reuses.
    const hashed = new Set<string>()
    let found: string | undefined
    visitEvents((event) => {
      const version = versionOf(event)
      if (hashed.has(version)) return false
      hashed.add(version)
      if (opaqueId(version) === opaqueMessageId) found = version
      return found !== undefined
    })
    return found
  }

  const lookup = (messageId: string): TraceDocument | undefined => {
    const events = eventsOf(messageId)
    if (events.length > 0) return document(messageId, events)
    const version = isOpaqueId(messageId) ? byOpaqueId(messageId) : undefined
    return version === undefined ? undefined : document(version, eventsOf(version))
  }

  const size = (): number => {
    const messages = new Set<string>()
    visitEvents((event) => void messages.add(versionOf(event)))
    return messages.size
  }

  return { sink, lookup, size }
}

export class MessageTrace extends Context.Service<MessageTrace, MessageTraceService>()(
  "autopush/observability/MessageTrace"
) {
  static readonly layer = (options: MessageTraceOptions = {}): Layer.Layer<MessageTrace> =>
    Layer.sync(MessageTrace, () => MessageTrace.of(makeMessageTrace(options)))
}
