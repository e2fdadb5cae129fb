/**
 * Tables are never missing: every node that writes messages keeps the router table, the receipt
 * table and the active message tables (last, this and next month's, and on a month's last day the
 * month after's) present, checked when it starts, every hour after, and as soon as the active
 * tables change (a new day, or a clock that jumped), so the month turn finds its tables long in
 * place and no cron is needed. Creating is idempotent: nodes racing to create a table all end up
 * with the same one.
 *
 * Nodes do not check together: each looks ahead of its clock by a lead of its own, drawn at random
 * below `TABLE_CHECK_SPREAD` when it starts, so the tables a new day makes active are checked (and
 * made) in the half hour before that midnight, spread over it, and are there when it comes; and
 * its first hourly check comes at a random point of its first hour, so nodes started together do
 * not keep checking in the same second.
 *
 * Where this node may not create tables (an IAM role without `dynamodb:CreateTable`), it still
 * starts: it says which tables are missing and the command that makes them, says it again at
 * every check while they are missing, and `/__heartbeat__` reports them. Only storage that cannot
 * be reached at all stops a start.
 */
import * as Clock from "effect/Clock"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Random from "effect/Random"
import * as Schedule from "effect/Schedule"
import { createActiveTables, failureText, Storage, type StorageError, type StorageService, type TableStatus } from "./Storage.ts"

/** How often a node checks that its tables exist. */
const TABLE_CHECK_INTERVAL = Duration.hours(1)

/** What an operator runs to make the tables when the nodes may not. */
export const CREATE_TABLES_COMMAND = "npm run maintenance -- create-tables"

/**
 * The longest a node looks ahead of its clock: the nodes' checks of the tables a new day makes
 * active are spread over the half hour before that midnight (and done before it).
 */
export const TABLE_CHECK_SPREAD = Duration.minutes(30)

/** `clock` `aheadMs` later: the time the tables are looked at for (nothing else reads it). */
const clockAhead = (clock: Clock.Clock, aheadMs: number): Clock.Clock => {
  const aheadNanos = BigInt(aheadMs) * 1_000_000n
  return {
    currentTimeMillisUnsafe: () => clock.currentTimeMillisUnsafe() + aheadMs,
    currentTimeMillis: Effect.sync(() => clock.currentTimeMillisUnsafe() + aheadMs),
    currentTimeNanosUnsafe: () => clock.currentTimeNanosUnsafe() + aheadNanos,
    currentTimeNanos: Effect.sync(() => clock.currentTimeNanosUnsafe() + aheadNanos),
    monotonicTimeNanosUnsafe: () => clock.monotonicTimeNanosUnsafe(),
    monotonicTimeNanos: clock.monotonicTimeNanos,
    sleep: (duration) => clock.sleep(duration)
  }
}

/** `effect` with the tables it names taken `aheadMs` ahead of the clock (storage requests keep their own clock). */
const lookingAhead = (aheadMs: number) => <A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
  aheadMs === 0 ? effect : Clock.clockWith((clock) => Effect.provideService(effect, Clock.Clock, clockAhead(clock, aheadMs)))

/**
 * One check of the tables active `aheadMs` from now: which are missing, each created in turn. Fails
 * only when storage cannot be read at all; a table that cannot be created is logged (with the
 * command that makes it).
 */
const ensureTables = (aheadMs: number): Effect.Effect<void, StorageError, Storage> =>
  Effect.gen(function*() {
    const storage = yield* Storage
    const ahead = lookingAhead(aheadMs)
    const missing = (yield* ahead(storage.checkTables)).filter((status) => !status.ok).map((status) => status.table)
    if (missing.length === 0) return
    yield* ahead(createActiveTables).pipe(
      Effect.tap(() => Effect.logInfo("tables created").pipe(Effect.annotateLogs({ tables: missing.join(", ") }))),
      Effect.catchTag("StorageError", (error) =>
        Effect.logError(
          `tables missing and not created: ${missing.join(", ")}; run \`${CREATE_TABLES_COMMAND}\` with credentials that may ` +
            "create tables, or allow dynamodb:CreateTable to this node"
        ).pipe(Effect.annotateLogs({ reason: error.reason._tag, cause: failureText(error) })))
    )
  })

/** How often the keeper looks whether a check is due: a local computation, no storage request. */
const TICK = Duration.seconds(10)

/**
 * The keeper: a check of the tables active now before the node starts (storage unreachable → the
 * start fails), then, in the background for as long as the node runs, one of the tables active a
 * lead ahead (random, below `TABLE_CHECK_SPREAD`, drawn once) whenever they change or
 * `TABLE_CHECK_INTERVAL` has passed (by the Clock: a clock moved forward makes one due). The first
 * hourly check comes at a random point of the first hour.
 */
export const layerTableKeeper: Layer.Layer<never, StorageError, Storage> = Layer.effectDiscard(
  Effect.gen(function*() {
    const storage = yield* Storage
    const intervalMs = Duration.toMillis(TABLE_CHECK_INTERVAL)
    const leadMs = Math.floor((yield* Random.next) * Duration.toMillis(TABLE_CHECK_SPREAD))
    const ahead = lookingAhead(leadMs)
    yield* ensureTables(0)
    // As if the last check had been at a random point of the last hour.
    const startedAt = yield* Clock.currentTimeMillis
    let checked = { at: startedAt - Math.floor((yield* Random.next) * intervalMs), tables: (yield* storage.activeMessageTables).join() }
    const checkWhenDue = Effect.gen(function*() {
      const now = yield* Clock.currentTimeMillis
      const tables = (yield* ahead(storage.activeMessageTables)).join()
      if (tables === checked.tables && now - checked.at < intervalMs) return
      checked = { at: now, tables }
      yield* ensureTables(leadMs).pipe(Effect.catchTag("StorageError", (error) =>
        Effect.logWarning("checking the tables failed").pipe(Effect.annotateLogs({ reason: error.reason._tag, cause: failureText(error) }))))
    })
    yield* checkWhenDue.pipe(Effect.repeat(Schedule.spaced(TICK)), Effect.delay(TICK), Effect.forkScoped)
  })
)

// ── the tables' status, as health checks read it ───────────────────────────────────────────────

/** How long the health routes reuse the tables' status: a flood of health checks costs the store one check per this. */
export const TABLE_STATUS_TTL_MS = 5_000

/** The cached status of each storage, by time to live. */
const statusCaches = new WeakMap<StorageService, Map<number, Effect.Effect<ReadonlyArray<TableStatus>, StorageError>>>()

/**
 * `checkTables` of `storage` as the health routes (`/__heartbeat__`, `/health`, of both ports) read
 * it: checked at most once per `ttlMs` for the whole process (the all-in-one's two nodes share it),
 * the outcome — a failure too — reused meanwhile, and requests that come while a check runs wait
 * for that one. 0 reads it every time.
 */
export const cachedTableStatus = (
  storage: StorageService,
  ttlMs: number = TABLE_STATUS_TTL_MS
): Effect.Effect<ReadonlyArray<TableStatus>, StorageError> => {
  if (ttlMs <= 0) return storage.checkTables
  let byTtl = statusCaches.get(storage)
  if (byTtl === undefined) statusCaches.set(storage, byTtl = new Map())
  let cached = byTtl.get(ttlMs)
  if (cached === undefined) byTtl.set(ttlMs, cached = Effect.runSync(Effect.cachedWithTTL(storage.checkTables, Duration.millis(ttlMs))))
  return cached
}
