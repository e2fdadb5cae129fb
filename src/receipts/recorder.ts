/**
 * What the connection node learns about messages sent with a receipt — delivered, saved at a
 * disconnect, acked, nacked, expired on the way — written to their status rows. A fold of the
 * node's domain events (those whose data name a `receipt`), so the protocol stays as it is: the
 * node's `EventLog` is wrapped, and the writes run on a background fiber of this layer, in order of
 * arrival, a few at a time. Messages without a receipt cost one property read per event.
 *
 * On shutdown the layer writes what is queued before it goes (a node killed outright loses the
 * writes still queued: those messages are reported expired once their TTL is out).
 */
import * as Cause from "effect/Cause"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as Queue from "effect/Queue"
import * as Schedule from "effect/Schedule"
import * as Pull from "effect/Pull"
import type { DomainEvent } from "../domain/events.ts"
import { ackOutcome } from "../domain/receipt.ts"
import { EventLog } from "../observability/EventLog.ts"
import { Storage } from "../storage/Storage.ts"
import { makeReceiptBook, RECEIPT_RETENTION_SECONDS, type StatusChange } from "./book.ts"

interface ReceiptWrite {
  readonly uaid: string
  readonly subscription: string
  readonly messageId: string
  readonly change: StatusChange
}

/** The status change an event makes, for a message with a receipt. */
const receiptChangeOf = (event: DomainEvent): ReceiptWrite | undefined => {
  const receipt = (event.data as { readonly receipt?: unknown }).receipt
  if (typeof receipt !== "string") return undefined
  const at = event.time
  const write = (messageId: string, change: StatusChange): ReceiptWrite => ({ uaid: event.uaid, subscription: receipt, messageId, change })
  switch (event.type) {
    case "notification.delivered.1":
      return write(event.data.version, { deliveredAt: at })
    case "notification.stored.1":
      return write(event.data.version, { storedAt: at })
    case "notification.acked.1":
      return write(event.data.version, {
        outcome: { outcome: ackOutcome(event.data.code), at, code: event.data.code }
      })
    case "notification.nacked.1":
      return write(event.data.version, { outcome: { outcome: "rejected", at, code: event.data.code } })
    case "notification.expired.1":
      return write(event.data.version, { outcome: { outcome: "expired", at } })
    default:
      return undefined
  }
}

/** Writes in flight at once. */
const CONCURRENCY = 16
/** How long shutdown waits for queued writes. */
const FLUSH_TIMEOUT_MS = 10_000

/** The node's `EventLog`, wrapped: every event goes on as before, and receipt changes to storage. */
export const receiptRecording = (retentionSeconds: number = RECEIPT_RETENTION_SECONDS): Layer.Layer<EventLog, never, EventLog | Storage> =>
  Layer.effect(
    EventLog,
    Effect.gen(function*() {
      const inner = yield* EventLog
      const book = makeReceiptBook(yield* Storage, inner, retentionSeconds)
      const queue = yield* Queue.unbounded<ReceiptWrite, Cause.Done>()
      const write = ({ uaid, subscription, messageId, change }: ReceiptWrite) =>
        book.write(uaid, subscription, messageId, change).pipe(
          Effect.retry({ schedule: Schedule.exponential("100 millis"), times: 4 }),
          Effect.catchTag("StorageError", (error) => Effect.logWarning("a receipt status could not be written", error))
        )
      const worker = yield* Effect.forkScoped(
        Queue.takeAll(queue).pipe(
          Effect.flatMap((batch) => Effect.forEach(batch, write, { concurrency: CONCURRENCY, discard: true })),
          Effect.forever,
          Pull.catchDone(() => Effect.void)
        )
      )
      // Runs before the worker is interrupted: what is queued is written first.
      yield* Effect.addFinalizer(() =>
        Queue.end(queue).pipe(Effect.andThen(Fiber.await(worker)), Effect.timeoutOrElse({ duration: FLUSH_TIMEOUT_MS, orElse: () => Effect.void }))
      )
      return EventLog.of({
        record: (event) => {
          inner.record(event)
          const change = receiptChangeOf(event)
          if (change !== undefined) Queue.offerUnsafe(queue, change)
        }
      })
    })
  )
