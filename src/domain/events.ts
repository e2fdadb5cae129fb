/**
 * Domain events: every state change of a uaid, versioned by `type`, ordered per uaid,
 * stamped with the Effect Clock's time (ms) by whoever produces them. Metrics, the event log, the
 * message trace and the per-session summary are folds over these; tests assert on them. Consumers
 * ignore types they do not know.
 */

import type { Urgency } from "./notification.ts"
import type { ReceiptOutcome } from "./receipt.ts"

type DeliverySource = "direct" | "stored"

/**
 * What an endpoint node did with an accepted message: handed to the client's
 * connection node, stored for later, dropped (TTL 0 and not connected), or failed (storage down, or
 * the user vanished while routing: the sender got a 503/410).
 */
/** `refused`: not stored, its subscription holding as many stored messages as it may (429/119). */
export type RouteOutcome = "direct" | "stored" | "dropped" | "bridged" | "failed" | "refused"

/** On the events of a message sent with `Push-Receipt`: its receipt subscription (what `receipts/` folds). */
interface Receipted {
  readonly receipt?: string | undefined
}

/**
 * `data` of one of a message's events, with the message's `receipt` when it has one: set on it, not
 * spread into a copy (these events are made for every message).
 */
export const withReceipt = <D extends object>(data: D, n: { readonly receipt?: string | undefined }): D & Receipted => {
  if (n.receipt !== undefined) (data as { receipt?: string }).receipt = n.receipt
  return data
}

interface Event<T extends string, D> {
  readonly type: T
  readonly uaid: string
  /** Milliseconds since the epoch, from the Clock of the producer. */
  readonly time: number
  readonly data: D
}

export type DomainEvent =
  | Event<"client.hello.1", { readonly kind: "new" | "existing" | "reassigned" }>
  /** The client's minimum urgency (RFC 8030 §5.3): messages below it are held in storage. */
  | Event<"client.urgency.1", { readonly min: Urgency }>
  | Event<"channel.registered.1", { readonly channelId: string }>
  | Event<"channel.unregistered.1", { readonly channelId: string; readonly code?: number | undefined }>
  /**
   * A register or unregister answered with an error status at a limit: `too_many_channels` (413,
   * max_channels_per_user) or `busy` (503, too many commands waiting while the user's month moves).
   */
  | Event<"channel.refused.1", {
    readonly channelId: string
    readonly command: "register" | "unregister"
    readonly reason: "too_many_channels" | "busy"
  }>
  | Event<"notification.accepted.1", Receipted & {
    readonly channelId: string
    readonly version: string
    readonly ttl: number
    /** The sender's `Urgency`, when given. */
    readonly urgency?: Urgency | undefined
  }>
  /** Handed to a bridge's platform (FCM, APNs, ADM, stub), which took it. */
  | Event<"notification.bridged.1", Receipted & {
    readonly channelId: string
    readonly version: string
    readonly platform: string
    readonly urgency?: Urgency | undefined
  }>
  /** A bridge's platform did not take it (`reason`: not_configured, auth, connection, timeout, upstream, rate_limited, unavailable, recipient_gone, too_large). */
  | Event<"notification.bridge_failed.1", { readonly version: string; readonly platform: string; readonly reason: string }>
  | Event<"notification.routed.1", {
    readonly channelId: string
    readonly version: string
    readonly outcome: RouteOutcome
    readonly durationMs: number
  }>
  | Event<"notification.stored.1", Receipted & {
    readonly channelId: string
    readonly version: string
    readonly reason: "offline" | "disconnect"
    /**
     * On a message the endpoint stored at a later ms than it accepted it at (another message of its
     * channel had that ms), so under a new id: when it was accepted (ms) and its TTL (s), from which
     * its receipt's row is made again under this id (`notification.moved.1` names the old one).
     */
    readonly acceptedAt?: number | undefined
    readonly ttl?: number | undefined
  }>
  /**
   * A message the endpoint stored under a new id (see `acceptedAt` of `notification.stored.1`,
   * recorded just before): `version` is the id it was accepted under, which no longer names it.
   */
  | Event<"notification.moved.1", Receipted & { readonly channelId: string; readonly version: string }>
  | Event<"notification.delivered.1", Receipted & {
    readonly channelId: string
    readonly version: string
    readonly source: DeliverySource
    /** The endpoint's trace context of a direct delivery, when it had one. */
    readonly traceparent?: string | undefined
  }>
  | Event<"notification.acked.1", Receipted & { readonly version: string; readonly code: number; readonly source: DeliverySource }>
  | Event<"notification.nacked.1", Receipted & { readonly version: string; readonly code: number }>
  | Event<"notification.expired.1", Receipted & { readonly version: string }>
  | Event<"notification.deleted.1", Receipted & { readonly version: string }>
  /**
   * A collector of receipts found the outcome of a message that no node sees happen: its TTL ran out
   * undelivered (`expired`), or its subscription is gone (`unsubscribed`).
   */
  | Event<"notification.settled.1", { readonly version: string; readonly receipt: string; readonly outcome: "expired" | "unsubscribed" }>
  /** A message sent with a receipt reached its outcome (recorded once: the first outcome is kept). */
  | Event<"notification.receipt.1", { readonly version: string; readonly receipt: string; readonly outcome: ReceiptOutcome }>
  | Event<"uaid.reset.1", { readonly reason: "too_many_messages" | "stale_month" }>
  | Event<"month.migrated.1", { readonly from: string; readonly to: string }>
  /** Broadcast versions sent to a client: in the hello reply, answering a subscribe, or a change at a keepalive tick. */
  | Event<"broadcast.delivered.1", {
    readonly broadcasts: Readonly<Record<string, string>>
    readonly reason: "hello" | "subscribe" | "change"
  }>
  /** The server closed an identified session's socket. */
  | Event<"session.closed.1", { readonly code: number; readonly reason: string }>
  /** An identified session is over (its unacked messages saved): the last event of a session. */
  | Event<"session.ended.1", { readonly reason: string }>

export type DomainEventType = DomainEvent["type"]
export type EventData<T extends DomainEventType> = Extract<DomainEvent, { readonly type: T }>["data"]

/** One event, typed by its `type`. */
export const domainEvent = <T extends DomainEventType>(type: T, uaid: string, time: number, data: EventData<T>): DomainEvent =>
  ({ type, uaid, time, data }) as DomainEvent
