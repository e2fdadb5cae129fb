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
import { EndpointCrypto, type MessageIdData } from "../crypto/endpoint.ts"
import { type ApiError, InvalidMessageId, MessageNotStored } from "../domain/errors.ts"
import { domainEvent, withReceipt } from "../domain/events.ts"
import { messageKeyOf } from "../domain/notification.ts"
import { Metrics } from "../observability/Metrics.ts"
import { messageSpans } from "../observability/tracing.ts"
import { Storage, type StorageError, type StorageService, storageUnavailable } from "../storage/Storage.ts"
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

/**
 * Cancel by identity: the row that holds the message `messageId` names becomes its tombstone
 * (`cancelMessage`); true when one did. A tombstone rather than a delete, because a save of this
 * message may still come after the cancel — a session's close sequence retrying a save whose first
 * try was applied but whose answer was lost — and it finds the tombstone and writes nothing, where
 * it would fill a free key again; the tombstone goes when the message would have expired. A message id names one message wherever it is stored, because every writer keeps a row at
 * the key its id encodes: the endpoint stores a message at its id's key (a taken ms is stored under
 * a new id), a session's close saves an unacked message back at its id's key (never re-stamped), a
 * save never writes over another message (`saveMessages`: only a free key or the message's own
 * row), and a month move keeps the key. So the row at that key holds this message or another one
 * (a newer message of its topic, a message of another id at that ms, whose save then put this one
 * at a later ms: `removeFrom`): every cancel is conditional on the version, so it cancels this
 * message or nothing — never another message.
 *
 * A message is looked for in each table the user's rows may be in (the user's month first, then the
 * other active months: a connection may still be moving it from last month's table, and a move
 * whose row was removed here is not saved on, see `TakeMessage`). Nothing removed means no table
 * holds it under this id: delivered (acked, or held unacked by a connection, which stores it again
 * at this same key when it closes: cancellable then), expired, replaced or cancelled already (its
 * tombstone is not cancelled twice). That is answered 404 and recorded nowhere, so that `204` and a
 * `deleted` receipt mean only that this cancel took the message back, once, and that it is never
 * delivered after it.
 */
export const removeStoredMessage = Effect.fnUntraced(function*(storage: StorageService, data: MessageIdData, messageId: string) {
  const month = (yield* storage.getUser(data.uaid))?.currentMonth
  if (month === undefined) return false
  const others = (yield* storage.activeMessageTables).filter((table) => table !== month)
  for (const table of [month, ...others]) {
    if (yield* removeFrom(storage, table, data, messageId).pipe(Effect.catchTag("StorageError", (error) =>
      // Only the user's own month must answer: another active table may not be made yet.
      table === month ? Effect.fail(error) : Effect.succeed(false)))) return true
  }
  return false
})

/** Rows read after a timestamp id's ms to find it saved at a later one (a bound on what a cancel reads). */
const CANCEL_SCAN_ROWS = 100

/**
 * The message cancelled in one table: at its id's key; else, for a timestamp message, at a later ms
 * (a save that found another message of its channel at that ms, from another endpoint node, put it
 * at the next ms free, keeping its id), found by its version in the rows from that ms on.
 */
const removeFrom = Effect.fnUntraced(function*(storage: StorageService, table: string, data: MessageIdData, messageId: string) {
  if (yield* storage.cancelMessage(data.uaid, table, data, messageId)) return true
  if (data.kind !== "timestamp") return false
  const page = yield* storage.fetchTimestampMessages(data.uaid, table, data.sortkeyTimestamp, CANCEL_SCAN_ROWS)
  const moved = page.messages.find((n) => n.version === messageId)
  return moved !== undefined && (yield* storage.cancelMessage(data.uaid, table, messageKeyOf(moved), messageId))
})

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

  /** DELETE /m/{message_id}: the message cancelled if a table still holds it (204), else 404 and nothing recorded. */
  const cancel = Effect.fnUntraced(function*(messageId: string): Effect.fn.Return<EmptyAnswer, ApiError | StorageError> {
    const data = yield* crypto.parseMessageId(messageId).pipe(Effect.mapError(() => new InvalidMessageId()))
    if (!(yield* removeStoredMessage(storage, data, messageId))) return yield* new MessageNotStored()
    yield* receipts.deleted(domainEvent("notification.deleted.1", data.uaid, yield* Clock.currentTimeMillis, withReceipt({ version: messageId }, data)))
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
