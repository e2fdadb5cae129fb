/**
 * `push send --receipt`: what became of the push (RFC 8030 §5.1, §6). Before the push, a receipt
 * subscription at the endpoint's service; after its 202, long polls of that subscription until this
 * message's receipt comes or the wait is over; then the receipt in one line and as JSON. Making the
 * subscription, the push's headers and the wording are the console page's (console/static/receipts.js).
 */
import * as Clock from "effect/Clock"
import * as Console from "effect/Console"
import * as Effect from "effect/Effect"
import { createReceiptSubscription, describeStatus, type StatusDocument } from "../console/static/receipts.js"
import { ToolFailure } from "../tools/cli.ts"
import { type SendResult, unreachable } from "./send.ts"

/** Exit codes of `send --receipt` beyond the tools' 0 (here: acknowledged), 1 and 2. */
export const RECEIPT_EXIT = {
  /** The receipt came with another outcome: rejected, expired, deleted, unsubscribed or bridged. */
  notAcknowledged: 3,
  /** No receipt within `--receipt-wait`. */
  none: 4
} as const

/** A `fetch` to the push service: status and body. */
const request = (url: string, init: RequestInit = {}) =>
  Effect.tryPromise({
    try: async (signal) => {
      const res = await fetch(url, { ...init, signal })
      return { status: res.status, body: await res.text() }
    },
    catch: unreachable(url)
  })

/** An answer's JSON body; one that is not JSON is a failure of the service at `url`. */
const json = <A>(url: string, body: string) =>
  Effect.try({ try: () => JSON.parse(body) as A, catch: () => new ToolFailure({ message: `${url} answered something that is not JSON: ${body.slice(0, 200)}` }) })

/** A new receipt subscription at the service of `endpoint`: its URL. */
export const subscribeReceipts = (endpoint: string): Effect.Effect<string, ToolFailure> =>
  Effect.tryPromise({
    try: () => createReceiptSubscription(endpoint),
    catch: unreachable(endpoint)
  }).pipe(Effect.flatMap(({ subscription, problem }) =>
    subscription === undefined
      ? Effect.fail(new ToolFailure({ message: `no receipt subscription: ${problem}` }))
      : Effect.succeed(subscription)
  ))

/** One long poll of the subscription: the receipts waiting there, after at most `waitSeconds`. */
const poll = (subscription: string, waitSeconds: number) =>
  Effect.flatMap(
    request(subscription, { headers: { accept: "application/json", prefer: `wait=${waitSeconds}` } }),
    ({ status, body }) => {
      if (status === 200) return Effect.map(json<{ readonly receipts: ReadonlyArray<StatusDocument> }>(subscription, body), (answer) => answer.receipts)
      const message = status === 404
        ? `the receipt subscription ${subscription} is gone (404, errno 118): it expired, so no receipt will come ` +
          "(a subscription left unused for receipt_subscription_idle is dropped)"
        : `GET ${subscription} answered ${status}: ${body}`
      return Effect.fail(new ToolFailure({ message }))
    }
  )

/** The receipt of `message` once it is at the subscription; undefined when none came within `waitSeconds`. */
const awaitReceipt = (subscription: string, message: string, waitSeconds: number) =>
  Effect.gen(function*() {
    const deadline = (yield* Clock.currentTimeMillis) + waitSeconds * 1000
    while (true) {
      // The service holds each poll for at most its receipt_max_wait: ask again until the deadline.
      const left = Math.max(0, Math.ceil((deadline - (yield* Clock.currentTimeMillis)) / 1000))
      const receipt = (yield* poll(subscription, left)).find((r) => r.message === message)
      if (receipt !== undefined || left === 0) return receipt
    }
  })

/** The message's status now (`GET` of its push message resource); undefined when the service keeps none. */
const statusNow = (message: string) =>
  Effect.flatMap(request(message), ({ status, body }) => (status === 200 ? json<StatusDocument>(message, body) : Effect.succeed(undefined)))

/** Prints a status document: one line for people, then the document. */
const printStatus = (line: string, status: StatusDocument | undefined) =>
  Effect.gen(function*() {
    yield* Console.log(line)
    if (status !== undefined) yield* Console.log(JSON.stringify(status))
  })

/**
 * After a push sent with a receipt: waits for its receipt, prints it (or, when none came in time,
 * where the message is) and gives the exit code.
 */
export const followReceipt = (subscription: string, sent: SendResult, waitSeconds: number): Effect.Effect<number, ToolFailure> =>
  Effect.gen(function*() {
    if (sent.status !== 202 || sent.location === null) {
      return yield* new ToolFailure({ message: `the push service answered ${sent.status} instead of 202 Accepted: it sends no receipt for this push` })
    }
    yield* Console.error(`waiting up to ${waitSeconds} s for the receipt (at ${subscription})`)
    const receipt = yield* awaitReceipt(subscription, sent.location, waitSeconds)
    if (receipt !== undefined) {
      yield* printStatus(`Receipt: ${describeStatus(receipt)}`, receipt)
      return receipt.state === "acknowledged" ? 0 : RECEIPT_EXIT.notAcknowledged
    }
    const now = yield* statusNow(sent.location)
    yield* printStatus(`Receipt: none within ${waitSeconds} s${now === undefined ? "" : `; the message is ${describeStatus(now)}`}`, now)
    return RECEIPT_EXIT.none
  })
