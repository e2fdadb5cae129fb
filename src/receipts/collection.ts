/**
 * A receipt subscription as its collector reads it (`GET /receipts/{id}` on an endpoint node): the
 * statuses with an outcome, after working out the outcomes no node sees happen — a message whose
 * TTL ran out undelivered (expired), a subscription the user agent dropped (unsubscribed).
 *
 * Such an outcome is recorded as the collector's event, `notification.settled.1`, and folded into
 * the row like any other step (`fold.ts`), at once: the answer hands it out only when it was the
 * message's first outcome, which the row's conditional write decides (another node may have
 * recorded one meanwhile: the next read shows that one).
 */
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import { EndpointCrypto } from "../crypto/endpoint.ts"
import { domainEvent } from "../domain/events.ts"
import type { MessageStatus } from "../domain/receipt.ts"
import { EventLog } from "../observability/EventLog.ts"
import { RecentMap } from "../platform/memo.ts"
import { Storage } from "../storage/Storage.ts"
import type { ReceiptBook } from "./book.ts"

/** A message delivered but not acked yet is given this long after its TTL before it counts as expired. */
const ACK_GRACE_MS = 60_000
/** A message without an outcome is checked for its subscription at most this often (per process). */
const SUBSCRIPTION_CHECK_MS = 30_000
/** Messages checked for their subscription per read of a receipt subscription (each check: two reads). */
const SUBSCRIPTION_CHECKS_PER_READ = 25

/**
 * A use of a subscription (a push naming it, a read) renews it once that adds more than this (s): at
 * most one write an hour per endpoint process, and a subscription lives at least its idle time less
 * this after its last use (an hour less than 7 days; a tenth less when the idle time is shorter).
 */
export const RENEW_STEP = (idleSeconds: number): number => Math.min(3600, idleSeconds / 10)

export const makeCollection = Effect.fnUntraced(function*(idleSeconds: number, book: ReceiptBook) {
  const storage = yield* Storage
  const crypto = yield* EndpointCrypto
  const events = yield* EventLog

  /** When each message was last checked for its subscription (this process). */
  const checked = new RecentMap<number>(10_000)

  /** Whether the user agent still has the subscription a message was sent to. */
  const stillSubscribed = Effect.fnUntraced(function*(messageId: string) {
    const ids = Option.getOrUndefined(yield* Effect.option(crypto.parseMessageId(messageId)))
    if (ids === undefined) return true
    const user = yield* storage.getUser(ids.uaid)
    if (user === undefined) return false
    if (user.routerType !== "webpush" || user.currentMonth === undefined) return true
    return yield* storage.hasChannel(ids.uaid, user.currentMonth, ids.channelId)
  })

  /**
   * The outcome a message without one has reached unseen, if any: its TTL ran out before delivery
   * (or well before an ack), or its subscription is gone.
   */
  const unseenOutcome = Effect.fnUntraced(function*(status: MessageStatus, now: number, budget: { checks: number }) {
    if (status.deadline !== undefined && now >= status.deadline + (status.deliveredAt === undefined ? 0 : ACK_GRACE_MS)) return "expired" as const
    const last = checked.get(status.messageId)
    if (budget.checks <= 0 || (last !== undefined && now - last < SUBSCRIPTION_CHECK_MS)) return undefined
    budget.checks--
    checked.set(status.messageId, now)
    return (yield* stillSubscribed(status.messageId)) ? undefined : "unsubscribed" as const
  })

  /** An outcome found unseen, folded and recorded; true when it is the message's outcome. */
  const settle = Effect.fnUntraced(function*(id: string, messageId: string, outcome: "expired" | "unsubscribed", now: number) {
    // The message id is decrypted only for a message whose outcome is decided now (its uaid names the event).
    const ids = Option.getOrUndefined(yield* Effect.option(crypto.parseMessageId(messageId)))
    const settled = domainEvent("notification.settled.1", ids?.uaid ?? "", now, { version: messageId, receipt: id, outcome })
    // Folded first: a read that fails is answered 503, and the next read finds the outcome again.
    const written = yield* book.fold(settled)
    events.record(settled)
    return written
  })

  /**
   * A subscription's receipts now: the statuses with an outcome, after settling the others. Its idle
   * time starts again (`RENEW_STEP`). Undefined when it is unknown or expired.
   */
  const receiptsOf = Effect.fnUntraced(function*(id: string) {
    const subscription = yield* storage.readReceiptSubscription(id)
    if (subscription === undefined) return undefined
    const now = yield* Clock.currentTimeMillis
    const renewAt = Math.floor(now / 1000) + idleSeconds
    if (renewAt - subscription.expiry > RENEW_STEP(idleSeconds)) yield* storage.touchReceiptSubscription(id, renewAt)
    const receipts: Array<MessageStatus> = []
    const budget = { checks: SUBSCRIPTION_CHECKS_PER_READ }
    for (const status of subscription.statuses) {
      if (status.outcome !== undefined) {
        receipts.push(status)
        continue
      }
      const outcome = yield* unseenOutcome(status, now, budget)
      if (outcome !== undefined && (yield* settle(id, status.messageId, outcome, now))) receipts.push({ ...status, outcome, outcomeAt: now })
    }
    return receipts
  })

  return { receiptsOf }
})
