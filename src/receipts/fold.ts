/**
 * Receipt status rows as a fold of domain events: the one map from an event of a message sent with
 * a receipt (its data name the `receipt` subscription) to the write it makes to that message's row.
 * Every node applies it through the receipt book (`book.ts`): a connection node in the background
 * (`recorder.ts`), the endpoint on the request path (`endpoint/receipts.ts`, `collection.ts`).
 * Events of messages without a receipt cost one property read.
 *
 * Who records what: the endpoint accepted, stored (offline, or under a new id: moved), expired at
 * once (TTL 0), bridged, deleted; a connection node delivered, stored at a disconnect, acked,
 * nacked, expired on the way; a collector settled (expired or unsubscribed, which no node sees).
 */
import type { DomainEvent } from "../domain/events.ts"
import { ackOutcome, type ReceiptOutcome, type StatusUpdate } from "../domain/receipt.ts"

/** A status change without its row's expiry, which the book works out. */
export type StatusChange = Omit<StatusUpdate, "expiry">

interface RowOf {
  readonly uaid: string
  readonly subscription: string
  readonly messageId: string
}

/**
 * One write to a message's status row. `open` makes the row if it is missing: only the steps every
 * other step comes after (the accept, and a message stored under a new id) open one, so a step
 * recorded after the receipt was collected (its row removed) cannot make the row again. `update`
 * changes a row that is there; `remove` takes away the row of an id the message no longer has.
 */
export type ReceiptWrite =
  | RowOf & { readonly kind: "open" | "update"; readonly change: StatusChange }
  | RowOf & { readonly kind: "remove" }

/** When a message accepted at `acceptedAt` (ms) with `ttl` (s) stops being deliverable, in ms: as `expiresAt` counts it, from the second it was accepted in. */
const deadlineOf = (acceptedAt: number, ttl: number): number => (Math.floor(acceptedAt / 1000) + ttl) * 1000

/** The receipt subscription an event's message was sent with, if any: only those events write rows. */
export const receiptSubscriptionOf = (event: DomainEvent): string | undefined => {
  const receipt = (event.data as { readonly receipt?: unknown }).receipt
  return typeof receipt === "string" ? receipt : undefined
}

/** The write an event makes to its message's status row; undefined for an event that changes none. */
export const receiptChangeOf = (event: DomainEvent): ReceiptWrite | undefined => {
  const receipt = receiptSubscriptionOf(event)
  if (receipt === undefined) return undefined
  const at = event.time
  const row = (messageId: string): RowOf => ({ uaid: event.uaid, subscription: receipt, messageId })
  const open = (messageId: string, change: StatusChange): ReceiptWrite => ({ ...row(messageId), kind: "open", change })
  const update = (messageId: string, change: StatusChange): ReceiptWrite => ({ ...row(messageId), kind: "update", change })
  const outcome = (messageId: string, outcome: ReceiptOutcome, code?: number): ReceiptWrite =>
    update(messageId, { outcome: { outcome, at, ...(code === undefined ? {} : { code }) } })
  switch (event.type) {
    case "notification.accepted.1":
      return open(event.data.version, { acceptedAt: at, deadline: deadlineOf(at, event.data.ttl) })
    case "notification.stored.1": {
      const { acceptedAt, ttl } = event.data
      return acceptedAt === undefined || ttl === undefined
        ? update(event.data.version, { storedAt: at })
        : open(event.data.version, { acceptedAt, deadline: deadlineOf(acceptedAt, ttl), storedAt: at })
    }
    case "notification.moved.1":
      return { ...row(event.data.version), kind: "remove" }
    case "notification.delivered.1":
      return update(event.data.version, { deliveredAt: at })
    case "notification.acked.1":
      return outcome(event.data.version, ackOutcome(event.data.code), event.data.code)
    case "notification.nacked.1":
      return outcome(event.data.version, "rejected", event.data.code)
    case "notification.expired.1":
      return outcome(event.data.version, "expired")
    case "notification.bridged.1":
      return outcome(event.data.version, "bridged")
    case "notification.deleted.1":
      return outcome(event.data.version, "deleted")
    case "notification.settled.1":
      return outcome(event.data.version, event.data.outcome)
    default:
      return undefined
  }
}
