/**
 * "What happened to message X?": the lifecycle of recent messages, from the domain events that name
 * a message id (accepted, routed, stored, delivered, acked, nacked, expired, deleted), kept in a
 * bounded in-memory window — the last `capacity` messages by first sight; the oldest is forgotten
 * when a new one arrives. Served as `GET /__trace__/{message_id}` on the connection node's router port.
 *
 * A process sees the events it records: in the all-in-one process the endpoint and the connection
 * node share one event log, so a trace has both halves (accepted, routed → delivered, acked); a
 * separate endpoint node sees accepted/routed/stored/expired/deleted and a separate connection node
 * sees delivered/acked/nacked/expired and stored-at-disconnect. Ask both and merge by time.
 *
 * The document carries opaque ids only (`opaque.ts`), so a trace can be shared like an event-log
 * line. Recording is on every message's path and only keeps the events themselves; the hashing and
 * the document are done when someone asks (a lookup by opaque id hashes the window's message ids).
 */
import * as Context from "effect/Context"
import * as Layer from "effect/Layer"
import type { DomainEvent } from "../domain/events.ts"
import type { EventSink } from "./EventLog.ts"
import { RecentMap } from "../domain/memo.ts"
import { isOpaqueId, makeOpaqueIds, opaqueId } from "./opaque.ts"

export interface TraceEntry {
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

export interface MessageTraceService {
  readonly sink: EventSink
  /** By message id (the `Location` of a 201) or its opaque id (the event log's `version`). */
  readonly lookup: (messageId: string) => TraceDocument | undefined
  readonly size: () => number
}

export interface MessageTraceOptions {
  /** Messages retained. Default 10 000. */
  readonly capacity?: number
  /** Events retained per message. Default 32. */
  readonly maxEventsPerMessage?: number
  readonly opaque?: ((value: string) => string) | undefined
}

interface Lifecycle {
  readonly uaid: string
  state: TraceState
  readonly firstSeen: number
  lastSeen: number
  readonly events: Array<DomainEvent>
  truncated: boolean
}

const TERMINAL: ReadonlySet<TraceState> = new Set(["acked", "bridged", "expired", "deleted", "failed"])

/** The message id an event is about, if any. */
const versionOf = (event: DomainEvent): string | undefined => {
  const data = event.data as { readonly version?: unknown }
  return typeof data.version === "string" ? data.version : undefined
}

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
  const capacity = Math.max(1, options.capacity ?? 10_000)
  const maxEvents = Math.max(1, options.maxEventsPerMessage ?? 32)
  const opaque = options.opaque ?? makeOpaqueIds()
  /** By message id: the last `capacity` by first sight. */
  const window = new RecentMap<Lifecycle>(capacity)

  const sink: EventSink = (event) => {
    const version = versionOf(event)
    if (version === undefined) return
    const state = stateOf(event)
    if (state === undefined) return
    const lifecycle = window.get(version)
    if (lifecycle === undefined) {
      window.set(version, { uaid: event.uaid, state, firstSeen: event.time, lastSeen: event.time, events: [event], truncated: false })
      return
    }
    lifecycle.state = nextState(lifecycle.state, state)
    lifecycle.lastSeen = event.time
    if (lifecycle.events.length < maxEvents) lifecycle.events.push(event)
    else lifecycle.truncated = true
  }

  const document = (version: string, lifecycle: Lifecycle): TraceDocument => {
    let channelId: string | undefined
    const events = lifecycle.events.map((event): TraceEntry => {
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
      uaid: opaque(lifecycle.uaid),
      ...(channelId !== undefined ? { channelId } : {}),
      state: lifecycle.state,
      firstSeen: lifecycle.firstSeen,
      lastSeen: lifecycle.lastSeen,
      events,
      truncated: lifecycle.truncated
    }
  }

  const lookup = (messageId: string): TraceDocument | undefined => {
    const lifecycle = window.get(messageId)
    if (lifecycle !== undefined) return document(messageId, lifecycle)
    if (!isOpaqueId(messageId)) return undefined
    // Hashed without the shared memo: 10,000 ids would push out the ones the event log reuses.
    for (const [version, candidate] of window) if (opaqueId(version) === messageId) return document(version, candidate)
    return undefined
  }

  return { sink, lookup, size: () => window.size }
}

export class MessageTrace extends Context.Service<MessageTrace, MessageTraceService>()(
  "autopush/observability/MessageTrace"
) {
  static readonly layer = (options: MessageTraceOptions = {}): Layer.Layer<MessageTrace> =>
    Layer.sync(MessageTrace, () => MessageTrace.of(makeMessageTrace(options)))
}
