/**
 * Push receipts (RFC 8030 §5.1, §6): what an application server learns about a message it sent with
 * `Push-Receipt`. A receipt subscription collects the final outcomes of its messages; each message's
 * status row records when it was accepted, stored and delivered, and its outcome once there is one.
 * The first outcome recorded is the message's outcome (an ack that arrives after the message was
 * deleted changes nothing).
 */

/**
 * The final outcomes: acknowledged by the user agent (the RFC's receipt); rejected by it (a nack, or
 * an ack with a failure code); expired undelivered; deleted by the sender; the subscription gone
 * (unsubscribed or dropped); handed to a bridge's platform (FCM, APNs, ADM), beyond which the service
 * sees nothing.
 */
export const RECEIPT_OUTCOMES = ["acknowledged", "rejected", "expired", "deleted", "unsubscribed", "bridged"] as const
export type ReceiptOutcome = (typeof RECEIPT_OUTCOMES)[number]

/** What an ack with this code means: 100 the user agent took the message (Firefox); other codes (101 decryption failed, 102 …) it could not. */
export const ackOutcome = (code: number): "acknowledged" | "rejected" => (code === 100 ? "acknowledged" : "rejected")

/** What is known of one message sent with a receipt (times in ms since the epoch). */
export interface MessageStatus {
  /** The message id (the last segment of its push message resource). */
  readonly messageId: string
  readonly acceptedAt?: number | undefined
  /** When its TTL runs out (ms). */
  readonly deadline?: number | undefined
  readonly storedAt?: number | undefined
  readonly deliveredAt?: number | undefined
  readonly outcome?: ReceiptOutcome | undefined
  readonly outcomeAt?: number | undefined
  /** The user agent's ack or nack code, for `acknowledged` and `rejected`. */
  readonly code?: number | undefined
}

/** A change to a message's status row: the fields given are set; an `outcome` only if it has none yet. */
export interface StatusUpdate {
  readonly acceptedAt?: number | undefined
  readonly deadline?: number | undefined
  readonly storedAt?: number | undefined
  readonly deliveredAt?: number | undefined
  readonly outcome?: { readonly outcome: ReceiptOutcome; readonly at: number; readonly code?: number | undefined } | undefined
  /** Until when the row is kept (seconds since the epoch: the storage TTL); absent: unchanged. */
  readonly expiry?: number | undefined
}

/** A receipt subscription as read: until when it lives (seconds), and the status rows of its messages. */
export interface ReceiptSubscription {
  readonly expiry: number
  readonly statuses: ReadonlyArray<MessageStatus>
}

/** Where a message is now: its outcome, or the furthest step it reached. */
export type MessageState = ReceiptOutcome | "delivered" | "stored" | "accepted"

export const stateOf = (status: MessageStatus): MessageState =>
  status.outcome ?? (status.deliveredAt !== undefined ? "delivered" : status.storedAt !== undefined ? "stored" : "accepted")

/**
 * The status a receipt answers with, as an HTTP status of the push message resource: 410 Gone for a
 * message the user agent acknowledged (RFC 8030 §6.2); 200 (the status document) for the others.
 */
export const receiptHttpStatus = (outcome: ReceiptOutcome): number => outcome === "acknowledged" ? 410 : 200
