// Push receipts (RFC 8030 §5.1, §6) as a sender uses them, shared by the console page and the push
// command line (src/client/receipt.ts): making a receipt subscription, the headers of a push that
// asks for a receipt, and a message's status document in words. Only fetch: it runs in both.

/** The states after which a message's state no longer changes (its outcome). */
export const FINAL_STATES = ["acknowledged", "rejected", "expired", "deleted", "unsubscribed", "bridged"]

/** @param {{state: string}} status */
export const isFinal = (status) => FINAL_STATES.includes(status.state)

/**
 * A new receipt subscription at the service of a push `endpoint` (`POST {its origin}/receipts`):
 * its URL, or why there is none ("POST …/receipts answered 404: …").
 * @param {string} endpoint
 */
export const createReceiptSubscription = async (endpoint) => {
  const url = new URL("/receipts", endpoint).href
  const response = await fetch(url, { method: "POST" })
  const location = response.headers.get("location")
  if (response.status === 201 && location !== null) {
    await response.body?.cancel()
    return { subscription: location, problem: undefined }
  }
  const error = await response.json().catch(() => ({}))
  const reason = response.status === 404 ? "this push service makes no receipt subscriptions" : (error.message ?? response.statusText)
  return { subscription: undefined, problem: `POST ${url} answered ${response.status}: ${reason}` }
}

/**
 * The headers of a push asking for a receipt on `subscription`: the service answers 202 Accepted
 * (not 201) and sends the message's outcome there.
 * @param {string} subscription
 */
export const receiptHeaders = (subscription) => ({ "Push-Receipt": subscription, Prefer: "respond-async" })

/** @param {number} ms */
const delay = (ms) => {
  if (ms < 1000) return `${Math.round(ms)} ms`
  if (ms < 60_000) return `${(ms / 1000).toFixed(1)} s`
  const seconds = Math.round(ms / 1000)
  return `${Math.floor(seconds / 60)} min ${seconds % 60} s`
}

/**
 * The steps of a status document in words, each after the push was accepted, with the user agent's
 * code: "delivered 12 ms, acknowledged 30 ms after the push (code 100)"; "" before any step.
 * @param {{acceptedAt?: number, storedAt?: number, deliveredAt?: number, outcome?: string, outcomeAt?: number, code?: number}} status
 */
export const describeSteps = (status) => {
  const accepted = status.acceptedAt
  if (accepted === undefined) return ""
  const steps = [["stored", status.storedAt], ["delivered", status.deliveredAt], [status.outcome, status.outcomeAt]]
    .filter(([name, at]) => name !== undefined && at !== undefined)
    .map(([name, at]) => `${name} ${delay(at - accepted)}`)
  if (steps.length === 0) return ""
  const undelivered = status.outcome === "expired" && status.deliveredAt === undefined ? ", never delivered" : ""
  const code = status.code === undefined ? "" : ` (code ${status.code})`
  return `${steps.join(", ")} after the push${undelivered}${code}`
}

/**
 * A status document in one line: "acknowledged — delivered 12 ms, acknowledged 30 ms after the push (code 100)".
 * @param {{state: string, acceptedAt?: number, storedAt?: number, deliveredAt?: number, outcome?: string, outcomeAt?: number, code?: number}} status
 */
export const describeStatus = (status) => {
  const steps = describeSteps(status)
  return steps === "" ? status.state : `${status.state} — ${steps}`
}
