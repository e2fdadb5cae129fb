/**
 * What the connection node learns about messages sent with a receipt — delivered, saved at a
 * disconnect, acked, nacked, expired on the way — written to their status rows. A fold of the
 * node's domain events (those whose data name a `receipt`), so the protocol stays as it is: the
 * node's `EventLog` is wrapped, and the writes run on background fibers of this layer. Messages
 * without a receipt cost one property read per event.
 *
 * Order: the writes of one receipt subscription run one after another, in order of arrival; up to
 * `CONCURRENCY` subscriptions are written at once. So on one node a message's steps land in the
 * order they happened. Across nodes (a message delivered by one, acked on another after a
 * reconnect) they may land in any order, which does not matter for correctness: every write here
 * only updates a row the endpoint opened, so a late step (a `delivered` after the ack, the
 * receipt collected and its row removed) is not written: it cannot make the row again without an
 * outcome, which would have the message reported a second time (`expired` or `unsubscribed`).
 *
 * Bounds: at most `MAX_QUEUED_WRITES` writes wait (all subscriptions); a write beyond is dropped,
 * counted (`notification.receipt.writes.dropped`) and logged at most once per `DROP_LOG_INTERVAL_MS`
 * (with the number dropped). A write, its retries included, gets up to `WRITE_TIMEOUT_MS`: a storage
 * that never answers holds a subscription's turn that long, not forever. A dropped or failed write
 * costs what a node killed outright costs: the message's step is missing, and a message whose
 * outcome was lost is reported `expired` once its TTL is out.
 *
 * On shutdown the layer writes what is queued before it goes, for up to `FLUSH_TIMEOUT_MS`.
 */
import * as Effect from "effect/Effect"
import * as FiberSet from "effect/FiberSet"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Schedule from "effect/Schedule"
import * as Semaphore from "effect/Semaphore"
import type { DomainEvent } from "../domain/events.ts"
import { ackOutcome } from "../domain/receipt.ts"
import { METRICS } from "../observability/catalog.ts"
import { EventLog } from "../observability/EventLog.ts"
import { Metrics } from "../observability/Metrics.ts"
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

/** Subscriptions written at once (one write each). */
const CONCURRENCY = 16
/** Writes waiting at most, all subscriptions together; a write beyond is dropped. */
const MAX_QUEUED_WRITES = 10_000
/** Longest one write may take, its retries included. */
const WRITE_TIMEOUT_MS = 30_000
/** Drops are logged at most this often (one line with their number). */
const DROP_LOG_INTERVAL_MS = 10_000
/** How long shutdown waits for queued writes. */
const FLUSH_TIMEOUT_MS = 10_000

/** The bounds, for tests (defaults: the constants above). */
interface RecorderBounds {
  readonly maxQueued?: number | undefined
  readonly writeTimeoutMs?: number | undefined
}

/** The node's `EventLog`, wrapped: every event goes on as before, and receipt changes to storage. */
export const receiptRecording = (
  retentionSeconds: number = RECEIPT_RETENTION_SECONDS,
  bounds: RecorderBounds = {}
): Layer.Layer<EventLog, never, EventLog | Storage> =>
  Layer.effect(
    EventLog,
    Effect.gen(function*() {
      const inner = yield* EventLog
      const book = makeReceiptBook(yield* Storage, inner, retentionSeconds)
      const maxQueued = bounds.maxQueued ?? MAX_QUEUED_WRITES
      const writeTimeoutMs = bounds.writeTimeoutMs ?? WRITE_TIMEOUT_MS
      const metrics = Option.getOrUndefined(yield* Effect.serviceOption(Metrics))
      const droppedCount = metrics?.counter(METRICS.receiptWritesDropped.name)
      /** Each subscription's waiting writes, in order of arrival; the first is being written. */
      const lanes = new Map<string, Array<ReceiptWrite>>()
      let queued = 0
      const unsample = metrics?.sampled(METRICS.receiptWritesQueued.name, {}, () => queued)
      if (unsample !== undefined) yield* Effect.addFinalizer(() => Effect.sync(unsample))
      const permits = Semaphore.makeUnsafe(CONCURRENCY)
      const writers = yield* FiberSet.make()
      const run = yield* FiberSet.runtime(writers)<never>()
      const runLog = yield* FiberSet.runtime(yield* FiberSet.make())<never>()

      const write = ({ uaid, subscription, messageId, change }: ReceiptWrite) =>
        book.write(uaid, subscription, messageId, change).pipe(
          Effect.retry({ schedule: Schedule.exponential("100 millis"), times: 4 }),
          Effect.timeoutOrElse({
            duration: writeTimeoutMs,
            orElse: () => Effect.logWarning("a receipt status write got no answer in time").pipe(Effect.annotateLogs({ timeout_ms: writeTimeoutMs }))
          }),
          Effect.catchTag("StorageError", (error) => Effect.logWarning("a receipt status could not be written", error)),
          Effect.asVoid
        )
      /** A subscription's writes, one after another, until its lane is empty. */
      const drain = (subscription: string, lane: Array<ReceiptWrite>): Effect.Effect<void> =>
        Effect.suspend(() => {
          const next = lane[0]
          if (next === undefined) {
            lanes.delete(subscription)
            return Effect.void
          }
          return Semaphore.withPermits(permits, 1)(write(next)).pipe(
            Effect.ensuring(Effect.sync(() => {
              lane.shift()
              queued--
            })),
            Effect.andThen(drain(subscription, lane))
          )
        })

      let droppedSinceLog = 0
      let logging = false
      /** One line now, then one per interval while writes are still being dropped. */
      const logDrops: Effect.Effect<void> = Effect.suspend(() => {
        if (droppedSinceLog === 0) {
          logging = false
          return Effect.void
        }
        const dropped = droppedSinceLog
        droppedSinceLog = 0
        return Effect.logWarning("receipt status writes dropped: too many waiting (storage slow or not answering)").pipe(
          Effect.annotateLogs({ dropped, waiting: queued, max_waiting: maxQueued }),
          Effect.andThen(Effect.sleep(DROP_LOG_INTERVAL_MS)),
          Effect.andThen(logDrops)
        )
      })
      const drop = () => {
        droppedCount?.inc()
        droppedSinceLog++
        if (!logging) {
          logging = true
          runLog(logDrops)
        }
      }

      // Runs before the writers are interrupted: what is queued is written first.
      yield* Effect.addFinalizer(() =>
        Effect.suspend(() => (queued === 0 ? Effect.void : FiberSet.awaitEmpty(writers))).pipe(
          Effect.timeoutOrElse({ duration: FLUSH_TIMEOUT_MS, orElse: () => Effect.void })
        )
      )
      return EventLog.of({
        record: (event) => {
          inner.record(event)
          const change = receiptChangeOf(event)
          if (change === undefined) return
          if (queued >= maxQueued) return drop()
          queued++
          const lane = lanes.get(change.subscription)
          if (lane !== undefined) return void lane.push(change)
          const fresh = [change]
          lanes.set(change.subscription, fresh)
          run(drain(change.subscription, fresh))
        }
      })
    })
  )
