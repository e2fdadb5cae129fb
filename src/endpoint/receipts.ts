/**
 * Push receipts on the endpoint (RFC 8030 §5.1, §6): `Push-Receipt` on a push and the status rows
 * of its message, here; the receipt routes (`POST /receipts`, `GET /receipts/{id}`, `GET /m/{id}`)
 * in `receiptRoutes.ts`, composed here.
 *
 * A message's status row is a fold of its domain events (`receipts/fold.ts`) written by one writer,
 * the receipt book: this endpoint's events (accepted, stored, moved to a new id, expired at once,
 * bridged, deleted), a connection node's (delivered, stored at a disconnect, acked, nacked, expired
 * on the way) and a collector's (settled: expired or unsubscribed, `receipts/collection.ts`).
 *
 * A connection node folds its events in the background; this endpoint folds its own on the request
 * path, before it answers: the row is opened before the message goes anywhere (a failure is a 503
 * with nothing sent, so the sender's retry is no duplicate), and what routing or a DELETE decided
 * is in the row when the sender reads it after the answer.
 */
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import { InvalidReceipt } from "../domain/errors.ts"
import type { DomainEvent } from "../domain/events.ts"
import { EventLog } from "../observability/EventLog.ts"
import { RecentMap } from "../platform/memo.ts"
import { makeReceiptBook, RECEIPT_RETENTION_SECONDS } from "../receipts/book.ts"
import { RENEW_STEP } from "../receipts/collection.ts"
import { receiptSubscriptionOf } from "../receipts/fold.ts"
import { Storage } from "../storage/Storage.ts"
import { endpointBase, type EndpointOptions } from "./options.ts"
import type { RateLimits } from "./rateLimits.ts"
import { makeReceiptRoutes, SUBSCRIPTION_ID } from "./receiptRoutes.ts"

/** The link relation of the receipt subscribe resource (RFC 8030 §5.1). */
const RECEIPT_RELATION = "urn:ietf:params:push:receipt"

/** The endpoint's push receipts: `Push-Receipt` on a push, its message's status row through the receipt book, the receipt routes. */
export const makeEndpointReceipts = Effect.fnUntraced(function*(options: EndpointOptions, limits: RateLimits) {
  const storage = yield* Storage
  const events = yield* EventLog
  const idleSeconds = options.receipts?.idleSeconds ?? RECEIPT_RETENTION_SECONDS
  const book = makeReceiptBook(storage, events, idleSeconds)
  const base = endpointBase(options.endpointUrl)
  const urls = {
    subscriptionBase: `${base}/receipts/`,
    messageBase: `${base}/m/`,
    /** The `Link` of every push answer: where receipt subscriptions are made. */
    link: `<${base}/receipts>; rel="${RECEIPT_RELATION}"`
  }
  const routes = yield* makeReceiptRoutes(options, limits, book, urls)

  /** Subscriptions this process renewed, with the expiry it wrote (the real one may be later). */
  const renewed = new RecentMap<number>(10_000)

  /**
   * The receipt subscription a push's `Push-Receipt` names, its idle time started again. Only a
   * subscription URL of this service, alive, is taken.
   */
  const claim = Effect.fnUntraced(function*(url: string) {
    const id = url.startsWith(urls.subscriptionBase) ? url.slice(urls.subscriptionBase.length) : undefined
    if (id === undefined || !SUBSCRIPTION_ID.test(id)) {
      return yield* new InvalidReceipt({ message: `Push-Receipt must be a receipt subscription of this service (${urls.subscriptionBase}…)` })
    }
    // A subscription this process renewed lately is alive until the expiry it wrote: pushes to it
    // renew it once per RENEW_STEP, not each (one item every push would write: a hot key).
    const now = Math.floor((yield* Clock.currentTimeMillis) / 1000)
    const renewAt = now + idleSeconds
    const known = renewed.get(id)
    if (known !== undefined && known > now && renewAt - known <= RENEW_STEP(idleSeconds)) return id
    const alive = yield* storage.touchReceiptSubscription(id, renewAt)
    if (!alive) {
      renewed.delete(id)
      return yield* new InvalidReceipt({ message: "Push-Receipt names a receipt subscription that does not exist or has expired" })
    }
    renewed.set(id, renewAt)
    return id
  })

  /**
   * `notification.accepted.1`, recorded once its fold is written: a message with a receipt is not
   * accepted until its row is open, before it goes anywhere, so every later step finds the row (a
   * failure is a 503 with nothing sent and no event).
   */
  const accepted = (event: DomainEvent) =>
    receiptSubscriptionOf(event) === undefined
      ? Effect.sync(() => events.record(event))
      : book.fold(event).pipe(Effect.map(() => events.record(event)))

  /** An event recorded, then its fold written (nothing to write for a message without a receipt). */
  const recordedAndFolded = (event: DomainEvent) =>
    Effect.suspend(() => {
      events.record(event)
      return book.fold(event)
    })

  /**
   * What routing decided — stored (under a new id: stored, then moved), expired at once, bridged —
   * recorded and folded in order, before the answer, so the sender's next read sees it. The message
   * is on its way: a failed write is logged and ends the steps (a row not opened under a new id is
   * not moved), and the answer stays 202.
   */
  const routed = (...steps: ReadonlyArray<DomainEvent>) =>
    // A message without a receipt (most pushes) has nothing to fold: its events are only recorded.
    steps.every((step) => receiptSubscriptionOf(step) === undefined)
      ? Effect.sync(() => steps.forEach((step) => events.record(step)))
      : Effect.forEach(steps, recordedAndFolded, { discard: true }).pipe(
        Effect.catchTag("StorageError", (error) => Effect.logWarning("a receipt status could not be written", error))
      )

  /** `notification.deleted.1`: the sender took the message back; its fold failing is a 503. */
  const deleted = (event: DomainEvent) =>
    recordedAndFolded(event).pipe(Effect.asVoid)

  return { claim, accepted, routed, deleted, link: urls.link, ...routes }
})

export type Receipts = Effect.Success<ReturnType<typeof makeEndpointReceipts>>
