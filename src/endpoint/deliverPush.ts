/**
 * The second step of a push: delivery. An accepted push (`acceptPush.ts`) goes to the node its
 * client is connected to, to storage, or to a bridge (`WebPushRouter`, `BridgeRouter`), and what
 * was decided is recorded where it was decided: `notification.routed.1` (the one producer),
 * `notification.stored.1` (and `notification.moved.1`), `notification.expired.1`, the bridge's
 * events; those of a message with a receipt are folded into its row before the answer (`receipts.ts`).
 *
 * A storage failure is not answered here: it goes up to the error edge.
 */
import type * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import type { Mutable } from "effect/Types"
import type { BridgeError, BridgeRouter } from "../bridges/bridge.ts"
import type { ApiError } from "../domain/errors.ts"
import { domainEvent, type EventData, type RouteOutcome, withReceipt } from "../domain/events.ts"
import type { Notification } from "../domain/notification.ts"
import type { UserRecord } from "../domain/user.ts"
import { EventLog } from "../observability/EventLog.ts"
import { messageSpans } from "../observability/tracing.ts"
import { WebPushRouter } from "../routers/webpush.ts"
import type { StorageError } from "../storage/Storage.ts"
import type { AcceptedPush } from "./acceptPush.ts"
import type { Receipts } from "./receipts.ts"
import type { Subscribers } from "./subscriber.ts"

/** The `reason` tag of `notification.bridge.error`: a bounded label per kind of failure. */
const bridgeFailureReason = (error: BridgeError): string => {
  switch (error._tag) {
    case "BridgeNotConfigured":
      return "not_configured"
    case "BridgeAuthFailed":
      return "auth"
    case "BridgeUnreachable":
      return "connection"
    case "BridgeTimeout":
      return "timeout"
    case "BridgeUpstreamError":
      return "upstream"
    case "BridgeRateLimited":
      return "rate_limited"
    case "BridgeUnavailable":
      return "unavailable"
    case "BridgeRecipientGone":
      return "recipient_gone"
    case "PayloadTooLarge":
      return "too_large"
  }
}

/** What recording and bridging need: the event log, the receipts' fold, the message spans, and how to drop a user. */
interface Recorders {
  readonly events: EventLog["Service"]
  readonly routed: Receipts["routed"]
  readonly spans: Effect.Success<typeof messageSpans>
  readonly dropUser: Subscribers["dropUser"]
}

/**
 * What became of a message, where it was decided (the one producer of `notification.routed.1`):
 * its outcome, and how long routing took since `startNanos` (by `clock`'s monotonic time: one
 * reading, where its wall time in ns takes two and BigInt arithmetic).
 */
const recordRouted = (
  events: EventLog["Service"],
  clock: Clock.Clock,
  uaid: string,
  notification: Notification,
  outcome: RouteOutcome,
  startNanos: bigint
): void => {
  const nanos = clock.monotonicTimeNanosUnsafe()
  events.record(domainEvent("notification.routed.1", uaid, clock.currentTimeMillisUnsafe(), {
    channelId: notification.channelId,
    version: notification.version,
    outcome,
    durationMs: Number(nanos - startNanos) / 1_000_000
  }))
}

/** The data of `notification.bridged.1`. */
const bridgedData = (bridge: BridgeRouter, notification: Notification) => {
  const data: Mutable<EventData<"notification.bridged.1">> = { channelId: notification.channelId, version: notification.version, platform: bridge.platform }
  if (notification.urgency !== undefined) data.urgency = notification.urgency
  return withReceipt(data, notification)
}

/** A bridged user's message goes to its platform; a platform that no longer knows the device → user dropped, 410/106. */
const sendBridged = (by: Recorders, clock: Clock.Clock, bridge: BridgeRouter, user: UserRecord, notification: Notification, startNanos: bigint) =>
  bridge.send(user, notification).pipe(
    by.spans.span("notification.bridge", { attributes: { platform: bridge.platform } }),
    Effect.tap(() =>
      by.routed(domainEvent("notification.bridged.1", user.uaid, clock.currentTimeMillisUnsafe(), bridgedData(bridge, notification))).pipe(
        Effect.andThen(Effect.sync(() => recordRouted(by.events, clock, user.uaid, notification, "bridged", startNanos)))
      )),
    Effect.tapError((error: BridgeError) =>
      Effect.sync(() => {
        by.events.record(domainEvent("notification.bridge_failed.1", user.uaid, clock.currentTimeMillisUnsafe(), {
          version: notification.version,
          platform: bridge.platform,
          reason: bridgeFailureReason(error)
        }))
        recordRouted(by.events, clock, user.uaid, notification, "failed", startNanos)
      })),
    Effect.catchTag("BridgeRecipientGone", (gone) => by.dropUser(user.uaid, gone.message))
  )

/**
 * A message stored offline: `notification.stored.1`, and when it was stored at a later ms than it
 * was accepted at (a new id), when it was accepted and its TTL, then `notification.moved.1` of the
 * id it was accepted under (so that its receipt's row goes with it).
 */
const storedEvents = (uaid: string, accepted: AcceptedPush, stored: Notification, at: number) => {
  const moved = stored.version !== accepted.notification.version
  const { channelId, version } = stored
  return [
    domainEvent("notification.stored.1", uaid, at, withReceipt(
      moved ? { channelId, version, reason: "offline", acceptedAt: accepted.acceptedAt, ttl: stored.ttl } : { channelId, version, reason: "offline" },
      stored
    )),
    ...(moved ? [domainEvent("notification.moved.1", uaid, at, withReceipt({ channelId, version: accepted.notification.version }, stored))] : [])
  ]
}

export const makeDeliverPush = Effect.fnUntraced(function*(receipts: Receipts, subscribers: Subscribers) {
  const router = yield* WebPushRouter
  const events = yield* EventLog
  const recorders: Recorders = { events, routed: receipts.routed, spans: yield* messageSpans, dropUser: subscribers.dropUser }
  const { cache } = subscribers

  /**
   * An accepted push delivered, stored or bridged, timed by `clock`: the id of the message as it
   * went (a later ms, stored, is a new id).
   */
  const deliverOnce = Effect.fnUntraced(function*(clock: Clock.Clock, accepted: AcceptedPush): Effect.fn.Return<string, ApiError | StorageError> {
    const { uaid, target, notification } = accepted
    const channelId = notification.channelId
    // A cached record of a connected client is good for a direct delivery (its node checks it), one
    // of a client that was offline for storing (the re-read after the store checks it); anything
    // else is routed on a fresh one. TTL 0 is never dropped on a cached record.
    const startNanos = clock.monotonicTimeNanosUnsafe()
    const storeCached = target.cached && target.user.nodeId === undefined && notification.ttl > 0
    const direct = target.cached && !storeCached ? yield* router.routeDirect(target.user, target.table, notification) : undefined
    const fresh = direct !== undefined || !target.cached || storeCached ? target : yield* subscribers.subscriberOf(uaid, channelId)
    if (direct === undefined && fresh.bridge !== undefined) {
      yield* sendBridged(recorders, clock, fresh.bridge, fresh.user, notification, startNanos)
      return notification.version
    }
    const routed = direct ?? (yield* router.route(fresh.user, fresh.table, notification).pipe(
      Effect.tapError((error) =>
        Effect.sync(() => {
          // Refused for the subscription's stored messages, the record is still good.
          const refused = error._tag === "TooManyStored"
          if (!refused) cache.forget(uaid)
          recordRouted(events, clock, uaid, notification, refused ? "refused" : "failed", startNanos)
        })
      )
    ))
    // The client came back since the record was cached (it may have unsubscribed meanwhile): its new
    // record is kept if it is connected (its node checks the channel), else read afresh next time.
    if (storeCached && routed.reread?.connectedAt !== target.user.connectedAt) {
      cache.forget(uaid)
      if (routed.reread?.nodeId !== undefined) cache.remember(routed.reread, channelId, clock.currentTimeMillisUnsafe())
    }
    recordRouted(events, clock, uaid, routed.notification, routed.outcome, startNanos)
    const routedAt = clock.currentTimeMillisUnsafe()
    if (routed.outcome === "stored") yield* receipts.routed(...storedEvents(uaid, accepted, routed.notification, routedAt))
    else if (routed.outcome === "dropped") {
      yield* receipts.routed(domainEvent("notification.expired.1", uaid, routedAt, withReceipt({ version: routed.notification.version }, routed.notification)))
    }
    return routed.notification.version
  })

  /**
   * Once delivery starts it runs to its end: a sender that leaves mid-push (its fiber interrupted)
   * must not cut the store from the re-read that moves the message to the user's month, nor a
   * follow-move between its save into the new table and its removal from the old. Every step is
   * bounded (storage operations by `storage_timeout`, the node by its request timeout), so the
   * region is too.
   */
  return (clock: Clock.Clock, accepted: AcceptedPush) => Effect.uninterruptible(deliverOnce(clock, accepted))
})
