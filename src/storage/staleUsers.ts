/**
 * The stale-user sweep as every store runs it: the `last_connect` index keys of the months it
 * looks at, and — on the stores that find every stale user first (the SQL stores, in memory) —
 * the drop of those users a small batch at a time, the running total told after each batch.
 */
import * as Effect from "effect/Effect"
import type { StaleUserSweep, StorageError } from "./Storage.ts"
import { lastConnectKeys, staleMonths } from "./tables.ts"

/** Users dropped per batch (one transaction on the SQL stores) by a stale-user sweep. */
export const STALE_BATCH = 25

/** The `last_connect` index keys of the months the sweep looks at, at `nowMs`. */
export const staleKeys = (nowMs: number, sweep: StaleUserSweep): ReadonlyArray<number> =>
  staleMonths(nowMs, sweep.monthsAgo, sweep.lookbackMonths).flatMap(lastConnectKeys)

/**
 * Drop the `stale` users a batch at a time (`drop`: how many of the batch it dropped, those still
 * stale); with `dryRun`, how many there are, nothing dropped.
 */
export const dropInBatches = <User>(
  stale: ReadonlyArray<User>,
  sweep: StaleUserSweep,
  drop: (batch: ReadonlyArray<User>) => Effect.Effect<number, StorageError>
): Effect.Effect<number, StorageError> =>
  Effect.gen(function*() {
    if (sweep.dryRun === true) return stale.length
    let dropped = 0
    for (let i = 0; i < stale.length; i += STALE_BATCH) {
      dropped += yield* drop(stale.slice(i, i + STALE_BATCH))
      if (sweep.onProgress !== undefined) yield* sweep.onProgress(dropped)
    }
    return dropped
  })
