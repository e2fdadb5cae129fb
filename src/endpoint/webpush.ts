/**
 * `POST /wpush/{v1|v2}/{token}` and `DELETE /m/{message_id}`.
 *
 * A POST is validated as one pipeline of small checks, in autopush's order (rules #1–#16 below), so
 * that a request that is wrong in several ways always gets the error of the first rule it breaks.
 * An accepted message is routed (`WebPushRouter`) and answered `201` with `Location` and the
 * effective `TTL`.
 */
import type { IncomingMessage } from "node:http"
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import type * as Headers from "effect/http/Headers"
import * as HttpTraceContext from "effect/http/HttpTraceContext"
import { Bridges } from "../bridges/Bridges.ts"
import type { BridgeError, BridgeRouter } from "../bridges/bridge.ts"
import { bridgedTableOf } from "../bridges/table.ts"
import {
  type EndpointToken,
  EndpointCrypto,
  type EndpointVersion,
  matchesVapidKey
} from "../crypto/endpoint.ts"
import {
  BridgeNotConfigured,
  InvalidApiVersion,
  InvalidAuth,
  InvalidMessageId,
  InvalidToken,
  NoSubscription,
  PayloadTooLarge
} from "../domain/errors.ts"
import { RecentMap } from "../platform/memo.ts"
import type { RateLimits } from "./rateLimits.ts"
import { type Body, type BodyLimits, type BodyRefusal, readBody } from "../platform/raw-http.ts"
import { domainEvent, type RouteOutcome } from "../domain/events.ts"
import type { Notification, Urgency } from "../domain/notification.ts"
import type { UserRecord } from "../domain/user.ts"
import { EventLog } from "../observability/EventLog.ts"
import { messageSpans } from "../observability/tracing.ts"
import { WebPushRouter } from "../routers/webpush.ts"
import { Storage, storageUnavailable } from "../storage/Storage.ts"
import { encryptionOf, type RequestHeaders, topicOf, ttlOf, urgencyOf } from "./headers.ts"
import { endpointBase, endpointOrigin, type EndpointOptions } from "./options.ts"
import { peerOf } from "./http2.ts"
import type { Receipts } from "./receipts.ts"
import { RouterCache } from "./routerCache.ts"
import { parseVapid, type VerifiedVapid, verifyVapid } from "./vapid.ts"

/** Router types that reach users through a bridge (FCM, APNs, ADM, the test stub). */
const BRIDGE_TYPES: ReadonlySet<string> = new Set(["fcm", "apns", "adm", "stub"])

const NO_SUBSCRIPTION = "No such subscription"


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

/** A token that decrypted but to the wrong length: reported by rule #5, after the VAPID rules. */
const BAD_LENGTH = "bad-length" as const

/** What a push reads of its request: the headers, and at rule #10 the body. */
export interface PushRequest {
  readonly headers: RequestHeaders
  readonly body: Effect.Effect<Buffer, BodyRefusal>
  /** The connection's peer address (the sender, or a proxy in front of it). */
  readonly peer: string | undefined
}

/**
 * A message this service makes itself for a subscription (the Matrix push gateway, `gateway/`):
 * its body is plaintext JSON rather than an encrypted payload, and its TTL and urgency are given,
 * not read from headers. It goes through the same checks as a push from the token on (#1, #2, #5–#9;
 * with no VAPID credentials, so a v2 endpoint bound to a key refuses it at #6, as `require_vapid`
 * does), but not the sender's address limit (its sender limits it) nor the encryption rule (#15).
 * Only `sendMade` takes one, and nothing of an HTTP request can make one: a push over HTTP never
 * skips #15.
 */
export interface MadePush {
  /** The message, as the client gets it (at most `max_data_bytes`: the maker sees to it). */
  readonly body: Buffer
  /** Seconds (capped to `max_notification_ttl`). */
  readonly ttl: number
  readonly urgency: Urgency
}

/** What a made message is stored and delivered with in place of encryption headers: none. */
const PLAINTEXT: Readonly<Record<string, string>> = {}

/** A handler's answer without a body: status and headers. */
export interface EmptyAnswer {
  readonly status: number
  readonly headers: Readonly<Record<string, string>>
}

export const makeWebPushHandlers = Effect.fnUntraced(function*(options: EndpointOptions, receipts: Receipts, limits: RateLimits) {
  const storage = yield* Storage
  const crypto = yield* EndpointCrypto
  const router = yield* WebPushRouter
  const events = yield* EventLog
  const bridges = yield* Bridges
  const spans = yield* messageSpans
  const origin = endpointOrigin(options.endpointUrl)
  const locationBase = `${endpointBase(options.endpointUrl)}/m/`
  const cache = new RouterCache(options.routerCache ?? { ttlMs: 0, entries: 0 })

  // ── the checks, in autopush's order ───────────────────────────────────────────────────────────────

  /** #1 */
  const apiVersionOf = (segment: string | undefined): Effect.Effect<EndpointVersion, InvalidApiVersion> =>
    segment === undefined || segment === "v1" ? Effect.succeed("v1")
    : segment === "v2" ? Effect.succeed("v2")
    : Effect.fail(new InvalidApiVersion())

  /** #2: decrypts under some key (the length is rule #5). */
  const openToken = (version: EndpointVersion, token: string) =>
    crypto.parseEndpoint(version, token).pipe(
      Effect.catchTag("EndpointTokenError", (e) =>
        e.reason === BAD_LENGTH ? Effect.succeed(BAD_LENGTH) : Effect.fail(new InvalidToken()))
    )

  /** #3 + #4: credentials parsed, then their JWT verified. */
  const vapidOf = (headers: RequestHeaders, nowMs: number) =>
    Effect.flatMap(parseVapid(headers), (credentials) =>
      credentials === undefined
        ? Effect.succeed(undefined)
        : verifyVapid(credentials, origin, Math.floor(nowMs / 1000)))

  /** #5 */
  const subscriptionOf = (opened: EndpointToken | typeof BAD_LENGTH): Effect.Effect<EndpointToken, InvalidToken> =>
    opened === BAD_LENGTH ? Effect.fail(new InvalidToken()) : Effect.succeed(opened)

  /** #6: a v2 endpoint only takes messages signed with the key it was made for; with `require_vapid`, every one signed. */
  const checkBoundKey = (token: EndpointToken, vapid: VerifiedVapid | undefined): Effect.Effect<void, InvalidAuth> =>
    vapid === undefined && options.requireVapid === true ? Effect.fail(new InvalidAuth({ message: "This server accepts only VAPID-signed pushes" }))
    : token.keyHash === undefined ? Effect.void
    : vapid === undefined ? Effect.fail(new InvalidAuth({ message: "Missing VAPID public key" }))
    : matchesVapidKey(token, vapid.rawKey) ? Effect.void
    : Effect.fail(new InvalidAuth({ message: "VAPID public key mismatch" }))

  /** #7 */
  const userOf = (uaid: string) =>
    storage.getUser(uaid).pipe(
      Effect.catchTag("StorageError", storageUnavailable),
      Effect.flatMap((user) =>
        user === undefined ? Effect.fail(new NoSubscription({ message: NO_SUBSCRIPTION })) : Effect.succeed(user))
    )

  /** Forget a user we can never deliver to, then say so (410/106). */
  const dropUser = (uaid: string, message: string) =>
    storage.dropUser(uaid).pipe(
      Effect.catchTag("StorageError", (error) => Effect.logWarning("dropping a user failed", error)),
      Effect.andThen(Effect.fail(new NoSubscription({ message })))
    )

  /**
   * #8: a WebPush user whose message table is still served (seed: stale `current_month` → dropped),
   * or a bridged user of a bridge this node has (its channels moved to the current table if need be).
   */
  const destinationOf = Effect.fnUntraced(function*(user: UserRecord) {
    if (user.routerType === "gcm") return yield* dropUser(user.uaid, "Bridge reports user was not found")
    if (BRIDGE_TYPES.has(user.routerType)) {
      const bridge = bridges.get(user.routerType)
      if (bridge === undefined) return yield* new BridgeNotConfigured({ message: `No ${user.routerType} router is configured` })
      const table = yield* bridgedTableOf(user).pipe(Effect.provideService(Storage, storage), Effect.catchTag("StorageError", storageUnavailable))
      return { table, bridge }
    }
    if (user.routerType !== "webpush") return yield* dropUser(user.uaid, NO_SUBSCRIPTION)
    const table = user.currentMonth
    if (table === undefined || !(yield* storage.activeMessageTables).includes(table)) {
      return yield* dropUser(user.uaid, NO_SUBSCRIPTION)
    }
    return { table, bridge: undefined }
  })

  /**
   * What became of a message, where it was decided (the one producer of `notification.routed.1`):
   * its outcome, and how long routing took since `startNanos` (the Clock's).
   */
  const recordRouted = (uaid: string, notification: Notification, outcome: RouteOutcome, startNanos: bigint) =>
    Effect.map(Clock.currentTimeNanos, (nanos) =>
      events.record(domainEvent("notification.routed.1", uaid, Number(nanos / 1_000_000n), {
        channelId: notification.channelId,
        version: notification.version,
        outcome,
        durationMs: Number(nanos - startNanos) / 1_000_000
      })))

  /** A bridged user's message goes to its platform; a platform that no longer knows the device → user dropped, 410/106. */
  const sendBridged = (bridge: BridgeRouter, user: UserRecord, notification: Notification, startNanos: bigint) =>
    bridge.send(user, notification).pipe(
      spans.span("notification.bridge", { attributes: { platform: bridge.platform } }),
      Effect.tap(() =>
        Effect.flatMap(Clock.currentTimeMillis, (now) => {
          events.record(domainEvent("notification.bridged.1", user.uaid, now, {
            channelId: notification.channelId,
            version: notification.version,
            platform: bridge.platform,
            ...(notification.urgency !== undefined ? { urgency: notification.urgency } : {})
          }))
          return recordRouted(user.uaid, notification, "bridged", startNanos)
        })),
      Effect.tapError((error: BridgeError) =>
        Effect.flatMap(Clock.currentTimeMillis, (now) => {
          events.record(domainEvent("notification.bridge_failed.1", user.uaid, now, {
            version: notification.version,
            platform: bridge.platform,
            reason: bridgeFailureReason(error)
          }))
          return recordRouted(user.uaid, notification, "failed", startNanos)
        })),
      Effect.catchTag("BridgeRecipientGone", (gone) => dropUser(user.uaid, gone.message))
    )

  /** #9 */
  const hasChannel = (uaid: string, table: string, channelId: string) =>
    storage.hasChannel(uaid, table, channelId).pipe(Effect.catchTag("StorageError", storageUnavailable))

  /** #7–#9 on a fresh read of the router record (kept in the cache). */
  const subscriberOf = Effect.fnUntraced(function*(uaid: string, channelId: string) {
    cache.forget(uaid)
    const user = yield* userOf(uaid) //                                  #7
    const { table, bridge } = yield* destinationOf(user) //              #8
    if (!(yield* hasChannel(uaid, table, channelId))) return yield* new NoSubscription({ message: NO_SUBSCRIPTION })
    cache.remember(user, channelId, yield* Clock.currentTimeMillis)
    return { user, table, bridge, cached: false }
  })

  /**
   * #7–#9 from the cache when it has a record whose table is still served, and holds the channel
   * (known, or read now); anything else is decided on a fresh read. A cached answer is only used
   * for a direct delivery, which the node checks, or to store for a client that was offline, which
   * the re-read after the store checks (`routerCache.ts`).
   */
  const targetOf = Effect.fnUntraced(function*(uaid: string, channelId: string) {
    const hit = cache.get(uaid, yield* Clock.currentTimeMillis)
    const table = hit?.user.currentMonth
    if (
      hit !== undefined && table !== undefined && (yield* storage.activeMessageTables).includes(table) &&
      (hit.channels.has(channelId) || (yield* hasChannel(uaid, table, channelId)))
    ) {
      hit.channels.add(channelId)
      return { user: hit.user, table, bridge: undefined, cached: true }
    }
    return yield* subscriberOf(uaid, channelId)
  })

  const bodyLimits: BodyLimits = {
    maxBytes: options.maxDataBytes,
    tooLarge: new PayloadTooLarge({ message: `Data payload must be smaller than ${options.maxDataBytes} bytes` }),
    // A client that stops sending its body gets 408 (and the connection closed), not a socket held.
    idleMs: options.clientRequestTimeoutMs ?? 10_000
  }

  /**
   * A push request over `node:http`. Its body is read from the start (at most `max_data_bytes`) and
   * its outcome looked at by rule #10 only, so a request wrong in an earlier way gets that error.
   */
  const pushRequest = (req: IncomingMessage): PushRequest => {
    let read: Body | undefined
    let waiting: ((body: Body) => void) | undefined
    readBody(req, bodyLimits, (body) => {
      read = body
      waiting?.(body)
    })
    const outcome = (body: Body) => body._tag === "Body" ? Effect.succeed(body.bytes) : Effect.fail(body.error)
    return {
      headers: req.headers as RequestHeaders,
      peer: peerOf(req),
      body: Effect.suspend(() =>
        read !== undefined ? outcome(read) : Effect.callback<Buffer, BodyRefusal>((resume) => {
          waiting = (body) => resume(outcome(body))
        })
      )
    }
  }

  /**
   * The storage ms of a timestamp message: now, or the ms after the last one this node gave the
   * channel. Two messages of a channel in one ms would share a storage key (the later one is then
   * moved to the next free ms by another conditional write): a burst to one channel does not
   * collide on this node. Kept for the channels of the last 10,000 pushes, by channel id alone (a
   * random UUID; were two users to share one, their messages would only take later ms).
   */
  const lastSortKeyMs = new RecentMap<number>(10_000)
  const sortKeyMs = (channelId: string, nowMs: number): number => {
    const ms = Math.max(nowMs, (lastSortKeyMs.get(channelId) ?? 0) + 1)
    lastSortKeyMs.set(channelId, ms)
    return ms
  }

  // ── POST ───────────────────────────────────────────────────────────────────────────────────────

  /** The accept span of a push: a child of the app server's `traceparent`, when it sends one. */
  const send = (request: PushRequest, versionSegment: string | undefined, token: string, made?: MadePush) =>
    spans.enabled
      ? accept(request, versionSegment, token, made).pipe(
        spans.span("notification.accept", {
          kind: "server",
          parent: Option.getOrUndefined(HttpTraceContext.fromHeaders(request.headers as Headers.Headers))
        })
      )
      : accept(request, versionSegment, token, made)

  const accept = Effect.fnUntraced(function*(
    request: PushRequest,
    versionSegment: string | undefined,
    token: string,
    made?: MadePush
  ) {
    const headers: RequestHeaders = request.headers
    const nowMs = yield* Clock.currentTimeMillis
    if (made === undefined) yield* limits.address(request.peer, headers["x-forwarded-for"], nowMs) // before any work for the sender
    const apiVersion = yield* apiVersionOf(versionSegment) //            #1
    const opened = yield* openToken(apiVersion, token) //                #2
    const vapid = yield* vapidOf(headers, nowMs) //                       #3, #4
    if (vapid !== undefined) yield* limits.vapidKey(vapid.rawKey, nowMs) // a verified key only: nobody drains another's
    const subscription = yield* subscriptionOf(opened) //                #5
    yield* checkBoundKey(subscription, vapid) //                          #6
    const target = yield* targetOf(subscription.uaid, subscription.channelId) // #7–#9
    const body = yield* request.body //                                   #10
    const ttl = made === undefined ? yield* ttlOf(headers, options.maxNotificationTtl) : Math.min(made.ttl, options.maxNotificationTtl) // #11–#13
    const topic = yield* topicOf(headers) //                              #14
    const encryption = made === undefined ? yield* encryptionOf(headers, body.length > 0) : PLAINTEXT // #15
    const urgency = made === undefined ? yield* urgencyOf(headers) : made.urgency // #16 (RFC 8030 §5.3)
    const receiptUrl = headers["push-receipt"] //                         Push-Receipt (RFC 8030 §5.1)
    const receipt = receiptUrl === undefined ? undefined : yield* receipts.claim(receiptUrl)

    const { uaid, channelId } = subscription
    const sortkeyTimestamp = topic !== undefined ? nowMs : sortKeyMs(channelId, nowMs)
    const messageId = yield* crypto.makeMessageId(
      topic !== undefined
        ? { kind: "topic", uaid, channelId, topic, receipt }
        : { kind: "timestamp", uaid, channelId, sortkeyTimestamp, receipt }
    )
    const notification: Notification = {
      channelId,
      version: messageId,
      ttl,
      timestamp: Math.floor(nowMs / 1000),
      sortkeyTimestamp,
      ...(topic !== undefined ? { topic } : {}),
      ...(urgency !== undefined ? { urgency } : {}),
      ...(receipt !== undefined ? { receipt } : {}),
      ...(encryption !== undefined ? { data: body.toString("base64url"), headers: encryption } : {})
    }
    if (receipt !== undefined) yield* receipts.accepting(uaid, receipt, notification, nowMs)
    events.record(domainEvent("notification.accepted.1", uaid, nowMs, {
      channelId,
      version: messageId,
      ttl,
      ...(urgency !== undefined ? { urgency } : {}),
      ...(receipt !== undefined ? { receipt } : {})
    }))
    // A cached record of a connected client is good for a direct delivery (its node checks it), one
    // of a client that was offline for storing (the re-read after the store checks it); anything
    // else is routed on a fresh one. TTL 0 is never dropped on a cached record.
    const startNanos = yield* Clock.currentTimeNanos
    const storeCached = target.cached && target.user.nodeId === undefined && ttl > 0
    const direct = target.cached && !storeCached ? yield* router.routeDirect(target.user, notification) : undefined
    const fresh = direct !== undefined || !target.cached || storeCached ? target : yield* subscriberOf(uaid, channelId)
    if (direct === undefined && fresh.bridge !== undefined) {
      yield* sendBridged(fresh.bridge, fresh.user, notification, startNanos)
      if (receipt !== undefined) yield* receipts.routed(uaid, receipt, notification, notification, "bridged", nowMs)
      return created(messageId, ttl, receipt)
    }
    const routed = direct ?? (yield* router.route(fresh.user, fresh.table, notification).pipe(
      Effect.tapError(() => {
        cache.forget(uaid)
        return recordRouted(uaid, notification, "failed", startNanos)
      })
    ))
    // The client came back since the record was cached (it may have unsubscribed meanwhile): its new
    // record is kept if it is connected (its node checks the channel), else read afresh next time.
    if (storeCached && routed.reread?.connectedAt !== target.user.connectedAt) {
      cache.forget(uaid)
      if (routed.reread?.nodeId !== undefined) cache.remember(routed.reread, channelId, yield* Clock.currentTimeMillis)
    }
    yield* recordRouted(uaid, routed.notification, routed.outcome, startNanos)
    const routedAt = yield* Clock.currentTimeMillis
    const version = routed.notification.version
    if (routed.outcome === "stored") {
      events.record(domainEvent("notification.stored.1", uaid, routedAt, { channelId, version, reason: "offline" }))
    } else if (routed.outcome === "dropped") {
      events.record(domainEvent("notification.expired.1", uaid, routedAt, { version }))
    }
    if (receipt !== undefined) yield* receipts.routed(uaid, receipt, notification, routed.notification, routed.outcome, nowMs)
    return created(version, ttl, receipt)
  })

  /** 201 Created; with a receipt, 202 Accepted (RFC 8030 §5.1: the receipt comes later). */
  const created = (messageId: string, ttl: number, receipt: string | undefined): EmptyAnswer => ({
    status: receipt === undefined ? 201 : 202,
    headers: { location: locationBase + messageId, ttl: String(ttl), link: receipts.link }
  })

  // ── DELETE /m/{message_id} ───────────────────────────────────────────────────────────────────

  const cancel = Effect.fnUntraced(function*(messageId: string) {
    const data = yield* crypto.parseMessageId(messageId).pipe(Effect.mapError(() => new InvalidMessageId()))
    const user = yield* storage.getUser(data.uaid).pipe(Effect.catchTag("StorageError", storageUnavailable))
    if (user?.currentMonth !== undefined) {
      yield* storage.deleteMessage(data.uaid, user.currentMonth, data).pipe(
        Effect.catchTag("StorageError", storageUnavailable)
      )
      events.record(domainEvent("notification.deleted.1", data.uaid, yield* Clock.currentTimeMillis, { version: messageId }))
    }
    if (data.receipt !== undefined) yield* receipts.deleted(data.uaid, data.receipt, messageId)
    return { status: 204, headers: {} } satisfies EmptyAnswer
  })

  /** A message made by this service (`MadePush`) for the subscription of `token`, through `accept`. */
  const sendMade = (made: MadePush, versionSegment: string | undefined, token: string) =>
    send({ headers: {}, body: Effect.succeed(made.body), peer: undefined }, versionSegment, token, made)

  return { pushRequest, send: (request: PushRequest, versionSegment: string | undefined, token: string) => send(request, versionSegment, token), sendMade, cancel } as const
})
