/**
 * The status document of a push message resource (`GET /m/{message_id}`, and each receipt handed
 * out): where the message is and when each step was, from its status row, or, for a message sent
 * without a receipt, from this process's message trace.
 */
import { ackOutcome, type MessageState, type MessageStatus, receiptHttpStatus, stateOf } from "../domain/receipt.ts"
import type { TraceDocument, TraceState } from "../observability/MessageTrace.ts"

const TRACE_STATES: Readonly<Record<TraceState, MessageState | undefined>> = {
  accepted: "accepted",
  routed: "accepted",
  stored: "stored",
  delivered: "delivered",
  bridged: "bridged",
  nacked: "rejected",
  acked: "acknowledged",
  expired: "expired",
  deleted: "deleted",
  failed: undefined
}

/** The times of a trace's steps, as a status row names them. */
const TRACE_TIMES: Readonly<Record<string, keyof MessageStatus>> = {
  "notification.accepted.1": "acceptedAt",
  "notification.stored.1": "storedAt",
  "notification.delivered.1": "deliveredAt"
}

/** A message's status as JSON: its push message resource (under `messageBase`), where it is, and when each step was. */
export const statusDocument = (messageBase: string) => (status: MessageStatus) => {
  const { messageId: _, ...times } = status
  return {
    message: messageBase + status.messageId,
    state: stateOf(status),
    ...(status.outcome === undefined ? {} : { status: receiptHttpStatus(status.outcome) }),
    ...times
  }
}

export type StatusDocument = ReturnType<ReturnType<typeof statusDocument>>

/** A status from this process's message trace (messages sent without a receipt). */
export const statusOfTrace = (messageId: string, document: TraceDocument): MessageStatus | undefined => {
  const state = TRACE_STATES[document.state]
  if (state === undefined) return undefined
  const status: Record<string, unknown> = { messageId }
  for (const event of document.events) {
    const field = TRACE_TIMES[event.type]
    if (field !== undefined) status[field] ??= event.time
  }
  if (state !== "accepted" && state !== "stored" && state !== "delivered") {
    const code = document.events.find((event) => event.type === "notification.acked.1" || event.type === "notification.nacked.1")?.data["code"]
    status.outcome = state === "acknowledged" && typeof code === "number" ? ackOutcome(code) : state
    status.outcomeAt = document.lastSeen
    if (typeof code === "number") status.code = code
  }
  return status as unknown as MessageStatus
}
