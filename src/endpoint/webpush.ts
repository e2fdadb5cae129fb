/**
 * `POST /wpush/{v1|v2}/{token}` and `DELETE /m/{message_id}`.
 *
 * A push is two steps: validation (`acceptPush.ts`: the rules in autopush's order, to an accepted
 * push) and delivery (`deliverPush.ts`: to a node, to storage or to a bridge), answered `201` with
 * `Location` and the effective `TTL` (`202` with a receipt).
 *
 * The routes' failures go up as they are, a storage failure as a `StorageError`: the error edge
 * (`edge.ts`) answers them. A caller in process has no such edge, so `send` and `sendMade` answer a
 * storage failure themselves, as the edge does (503/201, its cause logged once).
 */
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import type * as Headers from "effect/http/Headers"
import * as HttpTraceContext from "effect/http/HttpTraceContext"
import { EndpointCrypto } from "../crypto/endpoint.ts"
import { type ApiError, InvalidMessageId } from "../domain/errors.ts"
import { domainEvent, receiptOf } from "../domain/events.ts"
import { Metrics } from "../observability/Metrics.ts"
import { messageSpans } from "../observability/tracing.ts"
import { Storage, type StorageError, storageUnavailable } from "../storage/Storage.ts"
import { makeAcceptPush, type MadePush } from "./acceptPush.ts"
import { makeDeliverPush } from "./deliverPush.ts"
import { endpointBase, type EndpointOptions } from "./options.ts"
import { makePushRequests, type PushRequest } from "./pushRequest.ts"
import type { RateLimits } from "./rateLimits.ts"
import type { Receipts } from "./receipts.ts"
import { makeSenderWarnings } from "./senderWarnings.ts"
import { makeSubscribers } from "./subscriber.ts"
import { SENDER_WARNING_HEADER, senderWarningHeader, type SenderWarning } from "./vapid.ts"

export type { PushRequest } from "./pushRequest.ts"

/** A handler's answer without a body: status and headers. */
export interface EmptyAnswer {
  readonly status: number
  readonly headers: Readonly<Record<string, string>>
}

/** The push path's handlers, as the routes and the Matrix gateway use them. */
export type WebPush = Effect.Success<ReturnType<typeof makeWebPushHandlers>>

/** In process there is no error edge: a storage failure is answered here, as the edge answers it. */
const answeredInProcess = <A>(effect: Effect.Effect<A, ApiError | StorageError>): Effect.Effect<A, ApiError> =>
  Effect.catchTag(effect, "StorageError", storageUnavailable)

export const makeWebPushHandlers = Effect.fnUntraced(function*(options: EndpointOptions, receipts: Receipts, limits: RateLimits) {
  const storage = yield* Storage
  const crypto = yield* EndpointCrypto
  const spans = yield* messageSpans
  const subscribers = yield* makeSubscribers(options)
  const accept = yield* makeAcceptPush(options, receipts, limits, subscribers)
  const deliver = yield* makeDeliverPush(receipts, subscribers)
  const locationBase = `${endpointBase(options.endpointUrl)}/m/`
  const senderWarnings = makeSenderWarnings(Option.getOrUndefined(yield* Effect.serviceOption(Metrics)))

  /**
   * 201 Created; with a receipt, 202 Accepted (RFC 8030 §5.1: the receipt comes later); with what
   * another push service would refuse of it in `Autopush-Warning`.
   */
  const created = (messageId: string, ttl: number, receipt: string | undefined, warnings: ReadonlyArray<SenderWarning>): EmptyAnswer => {
    const headers = { location: locationBase + messageId, ttl: String(ttl), link: receipts.link }
    const warning = senderWarningHeader(warnings)
    return { status: receipt === undefined ? 201 : 202, headers: warning === undefined ? headers : { ...headers, [SENDER_WARNING_HEADER]: warning } }
  }

  /** Both steps on the one Clock of the push's fiber, read from its context once. */
  const acceptAndDeliver = (request: PushRequest, versionSegment: string | undefined, token: string, made: MadePush | undefined) =>
    Clock.clockWith((clock) =>
      Effect.flatMap(accept(clock, request, versionSegment, token, made), (accepted) =>
        Effect.map(deliver(clock, accepted), (messageId) => {
          senderWarnings.record(accepted.vapidKey, accepted.warnings, accepted.acceptedAt)
          return created(messageId, accepted.notification.ttl, accepted.receipt, accepted.warnings)
        })))

  /** A push, in the accept span: a child of the app server's `traceparent`, when it sends one. */
  const pushed = (request: PushRequest, versionSegment: string | undefined, token: string, made?: MadePush) =>
    spans.enabled
      ? acceptAndDeliver(request, versionSegment, token, made).pipe(
        spans.span("notification.accept", {
          kind: "server",
          parent: Option.getOrUndefined(HttpTraceContext.fromHeaders(request.headers as Headers.Headers))
        })
      )
      : acceptAndDeliver(request, versionSegment, token, made)

  /** DELETE /m/{message_id}: the message taken back, if it is still stored. */
  const cancel = Effect.fnUntraced(function*(messageId: string): Effect.fn.Return<EmptyAnswer, ApiError | StorageError> {
    const data = yield* crypto.parseMessageId(messageId).pipe(Effect.mapError(() => new InvalidMessageId()))
    const month = (yield* storage.getUser(data.uaid))?.currentMonth
    if (month !== undefined) yield* storage.deleteMessage(data.uaid, month, data)
    // A message with a receipt gets its `deleted` outcome even when it was no longer stored (the
    // fold keeps the first outcome): its event is recorded then too.
    if (month !== undefined || data.receipt !== undefined) {
      yield* receipts.deleted(domainEvent("notification.deleted.1", data.uaid, yield* Clock.currentTimeMillis, { version: messageId, ...receiptOf(data) }))
    }
    return { status: 204, headers: {} }
  })

  return {
    pushRequest: makePushRequests(options),
    /** The VAPID keys whose pushes got sender warnings (the console lists them). */
    senderWarnings,
    /** POST /wpush/…: an HTTP push (never a made one), its failures for the edge to answer. */
    push: (request: PushRequest, versionSegment: string | undefined, token: string) => pushed(request, versionSegment, token),
    cancel,
    /** A push in process, answered here. */
    send: (request: PushRequest, versionSegment: string | undefined, token: string) =>
      answeredInProcess(pushed(request, versionSegment, token)),
    /** A message made by this service (`MadePush`: the Matrix gateway's) for the subscription of `token`, answered here. */
    sendMade: (made: MadePush, versionSegment: string | undefined, token: string) =>
      answeredInProcess(pushed({ headers: {}, body: Effect.succeed(made.body), peer: undefined }, versionSegment, token, made))
  } as const
})
