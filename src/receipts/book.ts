/**
 * The one writer of receipt status rows, for every node: it applies the writes of the fold of
 * events (`fold.ts`), works out how long rows are kept, and records `notification.receipt.1` for a
 * message whose outcome a write decided.
 *
 * A row lives while its message may still be delivered and then `retentionSeconds` more (the idle
 * time of receipt subscriptions): long enough for the sender to collect the receipt.
 *
 * Only `open` makes a row (see `ReceiptWrite`): any other write applies only to a row that is
 * there, so a step that comes after the receipt was collected (its row removed) is not written,
 * and the message is not reported a second time.
 *
 * `notification.receipt.1` follows the write rather than being folded from the events, because
 * outcomes race across nodes (an ack on one, a delete or a collector's expiry on another) and only
 * the row's conditional write knows which came first: so it is recorded once per message, for the
 * outcome that won.
 */
import * as Effect from "effect/Effect"
import { domainEvent, type DomainEvent } from "../domain/events.ts"
import type { ReceiptOutcome } from "../domain/receipt.ts"
import type { EventLogService } from "../observability/EventLog.ts"
import type { StorageError, StorageService } from "../storage/Storage.ts"
import { receiptChangeOf, type ReceiptWrite, type StatusChange } from "./fold.ts"

/** Default idle time of a receipt subscription, and how long a receipt waits to be collected: 7 days. */
export const RECEIPT_RETENTION_SECONDS = 7 * 86_400

type Write = (uaid: string, subscription: string, messageId: string, change: StatusChange) => Effect.Effect<boolean, StorageError>

export interface ReceiptBook {
  /**
   * Open a message's status row with a change (made if missing). True when written (false: it
   * carried an outcome and the message had one already).
   */
  readonly open: Write
  /**
   * Write a change to a message's status row, when the row is there; true when written (false: no
   * row, or it carried an outcome and the message had one already).
   */
  readonly write: Write
  /** One write of the fold; true when it changed the row. */
  readonly apply: (write: ReceiptWrite) => Effect.Effect<boolean, StorageError>
  /** An event's write, now; false for an event that changes no row. */
  readonly fold: (event: DomainEvent) => Effect.Effect<boolean, StorageError>
}

export const makeReceiptBook = (
  storage: Pick<StorageService, "openMessageStatus" | "updateMessageStatus" | "deleteMessageStatuses">,
  events: EventLogService,
  retentionSeconds: number = RECEIPT_RETENTION_SECONDS
): ReceiptBook => {
  /** Rows with an outcome are kept for collection; rows without, until their message's TTL is out too. */
  const expiryOf = (change: StatusChange): number | undefined => {
    const until = change.outcome?.at ?? change.deadline
    return until === undefined ? undefined : Math.ceil(until / 1000) + retentionSeconds
  }
  /** A change through one of the storage writes, and its event when it decided the outcome. */
  const through = (store: StorageService["updateMessageStatus"]): Write => (uaid, subscription, messageId, change) => {
    const expiry = expiryOf(change)
    return store(subscription, messageId, expiry === undefined ? change : { ...change, expiry }).pipe(
      Effect.map((written) => {
        if (written && change.outcome !== undefined) decided(uaid, subscription, messageId, change.outcome)
        return written
      })
    )
  }
  const decided = (uaid: string, subscription: string, messageId: string, outcome: { readonly outcome: ReceiptOutcome; readonly at: number }) =>
    events.record(domainEvent("notification.receipt.1", uaid, outcome.at, { version: messageId, receipt: subscription, outcome: outcome.outcome }))
  const open = through((subscription, messageId, update) => storage.openMessageStatus(subscription, messageId, update))
  const write = through((subscription, messageId, update) => storage.updateMessageStatus(subscription, messageId, update))
  const apply = (w: ReceiptWrite): Effect.Effect<boolean, StorageError> =>
    w.kind === "remove"
      ? Effect.as(storage.deleteMessageStatuses(w.subscription, [w.messageId]), true)
      : (w.kind === "open" ? open : write)(w.uaid, w.subscription, w.messageId, w.change)
  return {
    open,
    write,
    apply,
    fold: (event) => {
      const change = receiptChangeOf(event)
      return change === undefined ? Effect.succeed(false) : apply(change)
    }
  }
}
