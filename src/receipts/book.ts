/**
 * The one writer of receipt status rows, for every node: how long rows are kept, and the
 * `notification.receipt.1` event of a message whose outcome this write decided.
 *
 * A row lives while its message may still be delivered and then `retentionSeconds` more (the idle
 * time of receipt subscriptions): long enough for the sender to collect the receipt.
 *
 * Only `open` makes a row: the endpoint's write as it accepts the message, before the message goes
 * anywhere (and as it stores it under a new id), so every later step finds it. Any other write
 * applies only to a row that is there: a step that comes after the receipt was collected (its row
 * removed) is not written, and the message is not reported a second time.
 */
import * as Effect from "effect/Effect"
import { domainEvent } from "../domain/events.ts"
import type { ReceiptOutcome, StatusUpdate } from "../domain/receipt.ts"
import type { EventLogService } from "../observability/EventLog.ts"
import type { StorageError, StorageService } from "../storage/Storage.ts"

/** Default idle time of a receipt subscription, and how long a receipt waits to be collected: 7 days. */
export const RECEIPT_RETENTION_SECONDS = 7 * 86_400

/** A status change without its row's expiry, which the book works out. */
export type StatusChange = Omit<StatusUpdate, "expiry">

interface ReceiptBook {
  /**
   * Open a message's status row with a change (made if missing; the first write of each message).
   * True when written (false: it carried an outcome and the message had one already).
   */
  readonly open: (uaid: string, subscription: string, messageId: string, change: StatusChange) => Effect.Effect<boolean, StorageError>
  /**
   * Write a change to a message's status row, when the row is there; true when written (false: no
   * row, or it carried an outcome and the message had one already).
   */
  readonly write: (uaid: string, subscription: string, messageId: string, change: StatusChange) => Effect.Effect<boolean, StorageError>
  /** An outcome now: `write` with just that. */
  readonly finish: (
    uaid: string,
    subscription: string,
    messageId: string,
    outcome: ReceiptOutcome,
    at: number,
    code?: number
  ) => Effect.Effect<boolean, StorageError>
}

export const makeReceiptBook = (
  storage: Pick<StorageService, "openMessageStatus" | "updateMessageStatus">,
  events: EventLogService,
  retentionSeconds: number = RECEIPT_RETENTION_SECONDS
): ReceiptBook => {
  /** Rows with an outcome are kept for collection; rows without, until their message's TTL is out too. */
  const expiryOf = (change: StatusChange): number | undefined => {
    const until = change.outcome?.at ?? change.deadline
    return until === undefined ? undefined : Math.ceil(until / 1000) + retentionSeconds
  }
  /** A change through one of the storage writes, and its event when it decided the outcome. */
  const through = (store: StorageService["updateMessageStatus"]): ReceiptBook["write"] => (uaid, subscription, messageId, change) => {
    const expiry = expiryOf(change)
    return store(subscription, messageId, expiry === undefined ? change : { ...change, expiry }).pipe(
      Effect.map((written) => {
        if (written && change.outcome !== undefined) {
          events.record(domainEvent("notification.receipt.1", uaid, change.outcome.at, {
            version: messageId,
            receipt: subscription,
            outcome: change.outcome.outcome
          }))
        }
        return written
      })
    )
  }
  const write = through(storage.updateMessageStatus)
  return {
    open: through(storage.openMessageStatus),
    write,
    finish: (uaid, subscription, messageId, outcome, at, code) =>
      write(uaid, subscription, messageId, { outcome: { outcome, at, ...(code === undefined ? {} : { code }) } })
  }
}
