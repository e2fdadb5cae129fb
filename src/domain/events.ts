/**
 * Domain events (DESIGN.md §3): every state change of a uaid, versioned by `type`, ordered per uaid.
 * Metrics, the event log and the per-message lifecycle are derived from these; tests assert on them.
 * Consumers ignore types they do not know.
 */

export type DeliverySource = "direct" | "stored"

/**
 * What an endpoint node did with an accepted message (protocol-notes §4): handed to the client's
 * connection node, stored for later, dropped (TTL 0 and not connected), or failed (storage down, or
 * the user vanished while routing: the sender got a 503/410).
 */
export type RouteOutcome = "direct" | "stored" | "dropped" | "failed"

export type DomainEvent =
  | { readonly type: "client.hello.1"; readonly uaid: string; readonly data: { readonly kind: "new" | "existing" | "reassigned" } }
  | { readonly type: "channel.registered.1"; readonly uaid: string; readonly data: { readonly channelId: string } }
  | { readonly type: "channel.unregistered.1"; readonly uaid: string; readonly data: { readonly channelId: string; readonly code?: number | undefined } }
  | { readonly type: "notification.accepted.1"; readonly uaid: string; readonly data: { readonly channelId: string; readonly version: string; readonly ttl: number } }
  | {
    readonly type: "notification.routed.1"
    readonly uaid: string
    readonly data: { readonly channelId: string; readonly version: string; readonly outcome: RouteOutcome; readonly durationMs: number }
  }
  | { readonly type: "notification.stored.1"; readonly uaid: string; readonly data: { readonly channelId: string; readonly version: string; readonly reason: "offline" | "disconnect" } }
  | { readonly type: "notification.delivered.1"; readonly uaid: string; readonly data: { readonly channelId: string; readonly version: string; readonly source: DeliverySource } }
  | { readonly type: "notification.acked.1"; readonly uaid: string; readonly data: { readonly version: string; readonly code: number; readonly source: DeliverySource } }
  | { readonly type: "notification.nacked.1"; readonly uaid: string; readonly data: { readonly version: string; readonly code: number } }
  | { readonly type: "notification.expired.1"; readonly uaid: string; readonly data: { readonly version: string } }
  | { readonly type: "notification.deleted.1"; readonly uaid: string; readonly data: { readonly version: string } }
  | { readonly type: "uaid.reset.1"; readonly uaid: string; readonly data: { readonly reason: "too_many_messages" | "stale_month" } }
  | { readonly type: "month.migrated.1"; readonly uaid: string; readonly data: { readonly from: string; readonly to: string } }
  | { readonly type: "session.closed.1"; readonly uaid: string; readonly data: { readonly code: number; readonly reason: string } }
