/**
 * "What happened to message X?": the lifecycle of recent messages, from the domain events that name
 * a message id (accepted, routed, stored, delivered, acked, nacked, expired, deleted), kept in a
 * bounded in-memory window — the last `capacity` such events, the oldest forgotten first. Served as
 * `GET /__trace__/{message_id}` on the connection node's router port, and read by the endpoint's
 * `GET /m/{message_id}` for a message sent without a receipt.
 *
 * A process sees the events it records: in the all-in-one process the endpoint and the connection
 * node share one event log, so a trace has both halves (accepted, routed → delivered, acked); a
 * separate endpoint node sees accepted/routed/stored/expired/deleted and a separate connection node
 * sees delivered/acked/nacked/expired and stored-at-disconnect. Ask both and merge by time.
 *
 * The document carries opaque ids only (`opaque.ts`), so a trace can be shared like an event-log
 * line. Recording is on every message's path, so it allocates nothing per event and hashes nothing:
 * the event goes in a ring, each slot links to the same message's previous event (a number array),
 * and a map from message id to the slot of its newest event finds a message. A lookup follows the
 * links: its work is the message's own events, whatever the window's size (reading the whole window
 * cost about 1 ms for 40,000 events, on a route anyone with a message id can ask). A lookup by
 * opaque id first indexes the opaque ids of the messages recorded since the last such lookup (one
 * hash per message each time), so those cost, all together, one hash per message at most per lookup.
 */
import * as Context from "effect/Context"
import * as Layer from "effect/Layer"
import type { DomainEvent } from "../domain/events.ts"
import type { EventSink } from "./EventLog.ts"
import { RecentMap } from "../platform/memo.ts"
import { isOpaqueId, makeOpaqueIds } from "./opaque.ts"

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
  /** Messages with events in the window. */
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
      return event.data.outcome === "failed" || event.data.outcome === "refused" ? "failed" : "routed"
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
  /** The last `capacity` events about a message; event number `n` (counted from 0) is in slot `n % capacity`. */
  const ring: Array<DomainEvent | undefined> = new Array<DomainEvent | undefined>(capacity).fill(undefined)
  /** For each slot, the number of the same message's previous event (-1: none). */
  const previous = new Float64Array(capacity).fill(-1)
  /** Events recorded so far: the next one's number. */
  let recorded = 0
  /** Each message in the window: the slot of its newest event. */
  const newest = new Map<string, number>()
  /**
   * The message id of opaque ids, for the last `capacity` messages indexed (one that left the window
   * is found here but not in `newest`). Filled by the lookups by opaque id, from the events recorded
   * since the last one (`indexed`: the next event to index): recording hashes nothing.
   */
  const byOpaque = new RecentMap<string>(capacity)
  let indexed = 0

  const sink: EventSink = (event) => {
    if (stateOf(event) === undefined) return
    const slot = recorded % capacity
    const gone = ring[slot]
    if (gone !== undefined) {
      // The window's oldest event goes; when it was also its message's newest, the message is gone.
      const version = versionOf(gone)
      if (newest.get(version) === slot) newest.delete(version)
    }
    const version = versionOf(event)
    const before = newest.get(version)
    ring[slot] = event
    previous[slot] = before === undefined ? -1 : recorded - ((slot - before + capacity) % capacity || capacity)
    newest.set(version, slot)
    recorded++
  }

  /** A message's events in the window, oldest first, by its links (none: empty). */
  const eventsOf = (version: string): Array<DomainEvent> => {
    const events: Array<DomainEvent> = []
    let slot = newest.get(version)
    const oldest = recorded - capacity
    while (slot !== undefined) {
      events.push(ring[slot] as DomainEvent)
      const before = previous[slot] as number
      slot = before >= 0 && before >= oldest ? before % capacity : undefined
    }
    return events.reverse()
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

  /**
   * The opaque ids of the messages of the events recorded since the last call, indexed: each message
   * hashed once per call (at its first event since then), the events before already indexed.
   */
  const indexOpaqueIds = (): void => {
    const from = Math.max(indexed, recorded - capacity)
    for (let n = from; n < recorded; n++) {
      const slot = n % capacity
      if ((previous[slot] as number) >= from) continue // its message was indexed at an earlier event of this call
      const version = versionOf(ring[slot] as DomainEvent)
      byOpaque.set(opaque(version), version)
    }
    indexed = recorded
  }

  const byOpaqueId = (opaqueMessageId: string): string | undefined => {
    indexOpaqueIds()
    return byOpaque.get(opaqueMessageId)
  }

  const lookup = (messageId: string): TraceDocument | undefined => {
    const version = newest.has(messageId) ? messageId : isOpaqueId(messageId) ? byOpaqueId(messageId) : undefined
    return version === undefined || !newest.has(version) ? undefined : document(version, eventsOf(version))
  }

  return { sink, lookup, size: () => newest.size }
}

export class MessageTrace extends Context.Service<MessageTrace, MessageTraceService>()(
  "autopush/observability/MessageTrace"
) {
  static readonly layer = (options: MessageTraceOptions = {}): Layer.Layer<MessageTrace> =>
    Layer.sync(MessageTrace, () => MessageTrace.of(makeMessageTrace(options)))
}
