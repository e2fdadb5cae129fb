/**
 * The rows of push receipts as every store but the in-memory one keeps them (DynamoDB's items,
 * the SQL stores' rows): per receipt subscription, its own row (`message` = `META_SORT_KEY`, its
 * `expiry` in seconds) and one status row per message sent with it, one attribute or column per
 * field of its `MessageStatus` (`accepted_at`, `deadline`, `stored_at`, `delivered_at`, `outcome`,
 * `outcome_at`, `code`) and its `expiry`.
 */
import type { MessageStatus, ReceiptOutcome, StatusUpdate } from "../domain/receipt.ts"
import { RECEIPT_OUTCOMES } from "../domain/receipt.ts"
import { isVisible, META_SORT_KEY } from "./model.ts"

/** A status row's times, by the `MessageStatus` field each one is kept for. */
export const RECEIPT_TIME_FIELDS = {
  acceptedAt: "accepted_at",
  deadline: "deadline",
  storedAt: "stored_at",
  deliveredAt: "delivered_at"
} as const

const OUTCOMES: ReadonlySet<string> = new Set(RECEIPT_OUTCOMES)

/**
 * A status row read back: its message id, its numbers by attribute name (`number`), and its
 * outcome, kept only when it is one this version knows (with its time and code).
 */
export const statusFromFields = (messageId: string, number: (name: string) => number | undefined, outcome: string | undefined): MessageStatus => {
  const status: Record<string, unknown> = { messageId }
  for (const [field, name] of Object.entries(RECEIPT_TIME_FIELDS)) {
    const value = number(name)
    if (value !== undefined) status[field] = value
  }
  if (outcome !== undefined && OUTCOMES.has(outcome)) {
    status.outcome = outcome as ReceiptOutcome
    const at = number("outcome_at")
    if (at !== undefined) status.outcomeAt = at
    const code = number("code")
    if (code !== undefined) status.code = code
  }
  return status as unknown as MessageStatus
}

/** The attributes a status update sets, and their values (numbers, the outcome a string). */
export const statusUpdateFields = (update: StatusUpdate): ReadonlyArray<readonly [string, number | string]> => [
  ...(update.expiry !== undefined ? [["expiry", update.expiry] as const] : []),
  ...Object.entries(RECEIPT_TIME_FIELDS).flatMap(([field, attribute]) => {
    const value = update[field as keyof typeof RECEIPT_TIME_FIELDS]
    return value === undefined ? [] : [[attribute, value] as const]
  }),
  ...(update.outcome === undefined ? [] : [
    ["outcome", update.outcome.outcome] as const,
    ["outcome_at", update.outcome.at] as const,
    ...(update.outcome.code !== undefined ? [["code", update.outcome.code] as const] : [])
  ])
]

/** How a store's rows read: a row's `message`, its `expiry`, the status it holds. */
export interface ReceiptRowReader<Row> {
  readonly message: (row: Row) => string | undefined
  readonly expiry: (row: Row) => number | undefined
  readonly status: (row: Row) => MessageStatus
}

/**
 * A receipt subscription read from all its rows: its expiry and the statuses of its rows not
 * expired at `nowMs`; undefined when its own row is missing or expired.
 */
export const subscriptionFromRows = <Row>(rows: ReadonlyArray<Row>, nowMs: number, read: ReceiptRowReader<Row>) => {
  const own = rows.find((row) => read.message(row) === META_SORT_KEY)
  const expiry = own === undefined ? undefined : read.expiry(own)
  if (expiry === undefined || !isVisible(expiry, nowMs)) return undefined
  const statuses = rows.filter((row) => read.message(row) !== META_SORT_KEY && isVisible(read.expiry(row), nowMs)).map(read.status)
  return { expiry, statuses }
}
