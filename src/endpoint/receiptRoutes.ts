/**
 * The receipt routes (RFC 8030 §5.1, §6): the receipt subscribe resource (`POST /receipts`), a
 * receipt subscription's collection (`GET /receipts/{id}`: HTTP/2 server push, a JSON long poll, or
 * server-sent events; `receiptCollector.ts`) and the push message resource's status
 * (`GET /m/{message_id}`). They read the status rows the fold of events wrote (`receipts/`), so any
 * endpoint node answers for any subscription.
 *
 * A collector is held while it waits and does not count toward `max_in_flight_requests`, so it is
 * admitted only within caps of its own (`receiptCaps.ts`) and held for `maxHoldMs` at most, after
 * which a stream ends as when the server stops. Each one also takes a token of the address's rate
 * limit as it starts.
 *
 * A receipt subscription is a row kept for `receipt_subscription_idle` after its last use, so one
 * client address makes at most `subscriptionsPerAddress` of them at once, then as many per idle
 * time (a token bucket of its own, beside the rate limit, per process): however long it floods,
 * the rows it keeps alive without using them stay about twice that many.
 */
import { randomBytes } from "node:crypto"
import type { IncomingMessage, ServerResponse } from "node:http"
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import { EndpointCrypto } from "../crypto/endpoint.ts"
import { ReceiptNotFound, StorageUnavailable, TooManyReceiptSubscriptions } from "../domain/errors.ts"
import type { MessageStatus } from "../domain/receipt.ts"
import { METRICS } from "../observability/catalog.ts"
import { Metrics } from "../observability/Metrics.ts"
import { MessageTrace } from "../observability/MessageTrace.ts"
import { RECEIPT_RETENTION_SECONDS, type ReceiptBook } from "../receipts/book.ts"
import { makeCollection } from "../receipts/collection.ts"
import { Storage } from "../storage/Storage.ts"
import { peerOf } from "./http2.ts"
import type { EndpointOptions } from "./options.ts"
import { makeTokenBuckets, type RateLimits } from "./rateLimits.ts"
import { makeCollectorCaps } from "./receiptCaps.ts"
import { deliveryOf, makeCollector, notFound, preferredWaitMs } from "./receiptCollector.ts"
import { statusDocument, statusOfTrace } from "./receiptStatus.ts"

/**
 * A collector still busy this long after its longest hold (a storage request or a write to the
 * client that does not finish) is ended anyway: 503/201 if nothing was answered yet, else the
 * stream is cut.
 */
const HOLD_GRACE_MS = 5_000

/** Receipt subscription ids: 16 random bytes, unguessable like endpoint tokens. */
export const SUBSCRIPTION_ID = /^[A-Za-z0-9_-]{22}$/

/** Where receipt subscriptions and push message resources are, and the `Link` naming the subscribe resource. */
export interface ReceiptUrls {
  readonly subscriptionBase: string
  readonly messageBase: string
  readonly link: string
}

export const makeReceiptRoutes = Effect.fnUntraced(function*(options: EndpointOptions, limits: RateLimits, book: ReceiptBook, urls: ReceiptUrls) {
  const storage = yield* Storage
  const crypto = yield* EndpointCrypto
  const trace = Option.getOrUndefined(yield* Effect.serviceOption(MessageTrace))
  const metrics = Option.getOrUndefined(yield* Effect.serviceOption(Metrics))
  const idleSeconds = options.receipts?.idleSeconds ?? RECEIPT_RETENTION_SECONDS
  const { receiptsOf } = yield* makeCollection(idleSeconds, book)
  const document = statusDocument(urls.messageBase)
  const endedCount = (reason: "max_hold" | "stalled") => metrics?.counter(METRICS.receiptCollectorsEnded.name, { reason }).inc()
  const { held } = makeCollector({
    read: receiptsOf,
    handed: (id, receipts) =>
      storage.deleteMessageStatuses(id, receipts.map((r) => r.messageId)).pipe(
        Effect.catchTag("StorageError", (error) => Effect.logWarning("collected receipts could not be removed", error))
      ),
    document,
    messagePath: new URL(urls.messageBase).pathname,
    endedAtMaxHold: () => endedCount("max_hold")
  })
  const collect = makeCollect(options, limits, makeCollectorCaps(options.receipts, metrics), held, endedCount)
  const perAddress = options.receipts?.subscriptionsPerAddress ?? 100
  const subscriptionsMade = makeTokenBuckets({ perSecond: perAddress / idleSeconds, burst: perAddress })

  /**
   * `POST /receipts`: a new receipt subscription, its URL in `Location` (counted against the
   * sender's address limit, then its subscriptions, before storage is touched).
   */
  const subscribe = Effect.fnUntraced(function*(req: IncomingMessage) {
    const now = yield* Clock.currentTimeMillis
    yield* Effect.fromResult(limits.address(peerOf(req), req.headers["x-forwarded-for"], now))
    // Counted by address as the rate limits count it (the loopback, not a listed proxy, is none).
    const address = limits.clientOf(peerOf(req), req.headers["x-forwarded-for"])
    const wait = address === undefined ? 0 : subscriptionsMade.take(address, now)
    if (wait > 0) return yield* new TooManyReceiptSubscriptions({ retryAfter: wait })
    const id = randomBytes(16).toString("base64url")
    yield* storage.createReceiptSubscription(id, Math.floor(now / 1000) + idleSeconds)
    return { status: 201, headers: { location: urls.subscriptionBase + id, link: urls.link } }
  })

  const traceStatus = (messageId: string): MessageStatus | undefined => {
    const found = trace?.lookup(messageId)
    return found === undefined ? undefined : statusOfTrace(messageId, found)
  }

  /**
   * `GET /m/{message_id}`: the message's status, from its receipt, or else this process's trace
   * (an indexed lookup: the message's own events); counted against the sender's address limit, as
   * pushes are.
   */
  const status = Effect.fnUntraced(function*(messageId: string, req: IncomingMessage) {
    yield* Effect.fromResult(limits.address(peerOf(req), req.headers["x-forwarded-for"], yield* Clock.currentTimeMillis))
    const ids = yield* Effect.option(crypto.parseMessageId(messageId))
    const subscription = ids._tag === "Some" ? ids.value.receipt : undefined
    const found = subscription !== undefined
      ? yield* storage.getMessageStatus(subscription, messageId)
      : undefined
    const traced = found ?? (ids._tag === "Some" && trace !== undefined ? traceStatus(messageId) : undefined)
    if (traced === undefined) return yield* new ReceiptNotFound({ message: "No status is kept for this message" })
    return document(traced)
  })

  return { subscribe, status, collect }
})

/**
 * `GET /receipts/{id}`, on the request itself (its answer may be held open). A receipt handed out
 * is removed once it was written. Fails only before anything is written. Counted against the
 * address's rate limit as it starts, and held only within the collector caps, for at most
 * `maxHoldMs`.
 */
const makeCollect = (
  options: EndpointOptions,
  limits: RateLimits,
  caps: ReturnType<typeof makeCollectorCaps>,
  held: ReturnType<typeof makeCollector>["held"],
  endedCount: (reason: "stalled") => void
) => {
  const maxWaitMs = options.receipts?.maxWaitMs ?? 30_000
  const maxHoldMs = options.receipts?.maxHoldMs ?? 300_000
  return (id: string, req: IncomingMessage, res: ServerResponse, headers: Readonly<Record<string, string>>) =>
    Effect.gen(function*() {
      if (!SUBSCRIPTION_ID.test(id)) return yield* notFound
      const now = yield* Clock.currentTimeMillis
      yield* Effect.fromResult(limits.address(peerOf(req), req.headers["x-forwarded-for"], now))
      const delivery = deliveryOf(req)
      const holdMs = delivery === "json" ? Math.min(maxWaitMs, maxHoldMs, preferredWaitMs(req.headers.prefer) ?? maxWaitMs) : maxHoldMs
      // Counted by address as the rate limits count it (the loopback, not a listed proxy, is none).
      const address = limits.clientOf(peerOf(req), req.headers["x-forwarded-for"])
      const hold = yield* caps.admit(id, address, now, now + holdMs)
      return yield* held(id, delivery, res, headers, now + holdMs).pipe(
        // Storage or the client stuck past the hold: the collector ends all the same.
        Effect.timeoutOrElse({
          duration: holdMs + HOLD_GRACE_MS,
          orElse: () =>
            Effect.suspend(() => {
              endedCount("stalled")
              return res.headersSent ? Effect.sync(() => void res.destroy()) : Effect.fail(new StorageUnavailable({}))
            })
        }),
        // The server stops: a held answer ends (an SSE client reconnects, a push client asks again).
        Effect.onInterrupt(() =>
          Effect.sync(() => {
            if (!res.headersSent) res.writeHead(204, headers)
            res.end()
          })
        ),
        Effect.ensuring(caps.release(id, address, hold))
      )
    })
}
