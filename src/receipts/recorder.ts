/**
 * What the connection node learns about messages sent with a receipt — delivered, saved at a
 * disconnect, acked, nacked, expired on the way — written to their status rows: the node's domain
 * events folded (`receiptChangeOf`, `fold.ts`) and applied by the receipt book, so the protocol
 * stays as it is. The node's `EventLog` is wrapped, and the writes run on background fibers of this
 * layer: a session cannot wait for storage. Messages without a receipt cost one property read per
 * event. (The endpoint applies the same fold on its request path: `endpoint/receipts.ts`.)
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
import { METRICS } from "../observability/catalog.ts"
import { EventLog } from "../observability/EventLog.ts"
import { type Counter, Metrics } from "../observability/Metrics.ts"
import { Storage } from "../storage/Storage.ts"
import { Permits } from "../platform/permits.ts"
import { makeReceiptBook, RECEIPT_RETENTION_SECONDS, type ReceiptBook } from "./book.ts"
import { receiptChangeOf, type ReceiptWrite } from "./fold.ts"

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

/** One write of the fold, retried, within `timeoutMs`; a failure is logged. */
const writeWithin = (book: ReceiptBook, timeoutMs: number) => (change: ReceiptWrite) =>
  book.apply(change).pipe(
    Effect.retry({ schedule: Schedule.exponential("100 millis"), times: 4 }),
    Effect.timeoutOrElse({
      duration: timeoutMs,
      orElse: () => Effect.logWarning("a receipt status write got no answer in time").pipe(Effect.annotateLogs({ timeout_ms: timeoutMs }))
    }),
    Effect.catchTag("StorageError", (error) => Effect.logWarning("a receipt status could not be written", error)),
    Effect.asVoid
  )

/** A write dropped: counted, and logged one line now, then one per interval while writes are still being dropped. */
const makeDrop = (runLog: (effect: Effect.Effect<void>) => unknown, droppedCount: Counter | undefined, waiting: () => number, maxQueued: number) => {
  let droppedSinceLog = 0
  let logging = false
  const logDrops: Effect.Effect<void> = Effect.suspend(() => {
    if (droppedSinceLog === 0) {
      logging = false
      return Effect.void
    }
    const dropped = droppedSinceLog
    droppedSinceLog = 0
    return Effect.logWarning("receipt status writes dropped: too many waiting (storage slow or not answering)").pipe(
      Effect.annotateLogs({ dropped, waiting: waiting(), max_waiting: maxQueued }),
      Effect.andThen(Effect.sleep(DROP_LOG_INTERVAL_MS)),
      Effect.andThen(logDrops)
    )
  })
  return () => {
    droppedCount?.inc()
    droppedSinceLog++
    if (!logging) {
      logging = true
      runLog(logDrops)
    }
  }
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
      const metrics = Option.getOrUndefined(yield* Effect.serviceOption(Metrics))
      /** Each subscription's waiting writes, in order of arrival; the first is being written. */
      const lanes = new Map<string, Array<ReceiptWrite>>()
      let queued = 0
      const unsample = metrics?.sampled(METRICS.receiptWritesQueued.name, {}, () => queued)
      if (unsample !== undefined) yield* Effect.addFinalizer(() => Effect.sync(unsample))
      const permits = new Permits(CONCURRENCY)
      const writers = yield* FiberSet.make()
      const run = yield* FiberSet.runtime(writers)<never>()
      const runLog = yield* FiberSet.runtime(yield* FiberSet.make())<never>()

      const write = writeWithin(book, bounds.writeTimeoutMs ?? WRITE_TIMEOUT_MS)
      /** A subscription's writes, one after another, until its lane is empty. */
      const drain = (subscription: string, lane: Array<ReceiptWrite>): Effect.Effect<void> =>
        Effect.suspend(() => {
          const next = lane[0]
          if (next === undefined) {
            lanes.delete(subscription)
            return Effect.void
          }
          return permits.withPermit(write(next)).pipe(
            Effect.ensuring(Effect.sync(() => {
              lane.shift()
              queued--
            })),
            Effect.andThen(drain(subscription, lane))
          )
        })

      const drop = makeDrop(runLog, metrics?.counter(METRICS.receiptWritesDropped.name), () => queued, maxQueued)

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
