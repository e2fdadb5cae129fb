/**
 * What both SQL stores (SQLite, PostgreSQL) do to rows nobody reads any more, and how often: the
 * sweep of expired rows, every `SWEEP_INTERVAL` of real time (as DynamoDB's TTL deletes by real
 * time), in batches of `SWEEP_BATCH`: message rows once expired (a tombstone `TOMBSTONE_SECONDS`
 * after its cancel or ack), so that what acked, cancelled and expired messages leave is deleted
 * within minutes and its pages are reused; receipt rows a day past their expiry. The statements
 * are `sql/maintenance.ts`'s.
 */
import * as Clock from "effect/Clock"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Schedule from "effect/Schedule"
import type * as Scope from "effect/Scope"
import { liveClock } from "../deadlines.ts"
import type { StorageError } from "../Storage.ts"

/** Expired rows deleted per transaction by the sweep. */
export const SWEEP_BATCH = 500
/** How long past its expiry a receipt row is kept before the sweep deletes it (seconds). */
export const SWEEP_GRACE_SECONDS = 86_400
export const SWEEP_INTERVAL = Duration.minutes(1)

/** Run `sweep` every `SWEEP_INTERVAL` of real time, for as long as the scope; a failed sweep is logged. */
export const sweepEvery = (sweep: (nowMs: number) => Effect.Effect<number, StorageError>): Effect.Effect<void, never, Scope.Scope> =>
  Effect.flatMap(Clock.currentTimeMillis, sweep).pipe(
    Effect.catchTag("StorageError", (error) => Effect.logWarning("sweeping expired rows failed", error).pipe(Effect.as(0))),
    Effect.repeat(Schedule.spaced(SWEEP_INTERVAL)),
    Effect.delay(SWEEP_INTERVAL),
    Effect.provideService(Clock.Clock, liveClock),
    Effect.forkScoped,
    Effect.asVoid
  )
