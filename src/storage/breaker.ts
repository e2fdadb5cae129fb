/**
 * The storage breaker: a `StorageService` over another that stops sending operations to a store
 * that does not answer. It counts the failures that mean the store cannot be reached — a refused,
 * reset or unreachable connection (the failure to connect as much as a query's), a deadline
 * passed, the server shutting down (`unreachable`) — and after `threshold` of them in a row it
 * opens: every operation then fails at once with a `StorageError` whose reason is `BreakerOpen`,
 * without a request, so a dead database costs its nodes nothing and is
 * sent no reconnect storm. After a back-off (from 1 s, doubling up to `maxBackoffMs`, jittered) the
 * next operation is let through as the probe, the others still refused meanwhile: the store
 * answering it (with anything but an unreachable failure) closes the breaker, and the node works
 * on without a restart; an unreachable failure opens it again for a longer back-off.
 *
 * Any answer of the store, an error of the operation included (a failed condition, a missing table),
 * shows it is there: it resets the count. Interrupted operations count for nothing. Operations
 * still in flight when the breaker opens change nothing when they end: the probe decides.
 * Time is the Effect `Clock` (a `TestClock` drives it in tests), jitter the Effect `Random`.
 */
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import type * as Exit from "effect/Exit"
import * as Random from "effect/Random"
import * as Ref from "effect/Ref"
import { BreakerOpen, failureText, StorageError } from "./failures.ts"
import { mapStorageOperations, type StorageService } from "./Storage.ts"

export interface BreakerOptions {
  /** Unreachable failures in a row that open the breaker; 0: no breaker. */
  readonly threshold: number
  /** The longest wait between two probes (ms). */
  readonly maxBackoffMs: number
  /** Told when the breaker opens (true) and closes (false): the metric. */
  readonly onChange?: ((open: boolean) => void) | undefined
}

/** Default unreachable failures in a row that open the breaker. */
export const BREAKER_THRESHOLD = 5
/** Default longest wait between two probes (ms). */
export const BREAKER_MAX_BACKOFF_MS = 30_000
/** The first wait before a probe (ms); each probe that fails doubles it, up to the maximum. */
const FIRST_BACKOFF_MS = 1_000

/**
 * Whether a storage failure says the store cannot be reached (what the breaker counts) — no answer
 * within the deadline, or a connection refused, dropped or shut down — rather than that it answered
 * with an error. Each backend classifies its failures into these reasons.
 */
export const unreachable = (error: StorageError): boolean => error.reason._tag === "Timeout" || error.reason._tag === "Unavailable"

type BreakerState =
  | { readonly _tag: "Closed"; readonly failures: number }
  /** Refusing operations until `probeAt`; `since`: when it opened, `cause`: the failure that opened it. */
  | { readonly _tag: "Open"; readonly since: number; readonly cause: string; readonly backoffMs: number; readonly probeAt: number }
  /** One operation is the probe; the others are refused until it ends. */
  | { readonly _tag: "Probing"; readonly since: number; readonly cause: string; readonly backoffMs: number }

const CLOSED: BreakerState = { _tag: "Closed", failures: 0 }

/** What an operation may do: run (as the probe, or with the breaker closed), or fail at once, to be retried after `retryAfterMs`. */
type Admission = { readonly _tag: "Run"; readonly probe: boolean } | { readonly _tag: "Refused"; readonly retryAfterMs: number; readonly cause: string }

const RUN: Admission = { _tag: "Run", probe: false }
const PROBE: Admission = { _tag: "Run", probe: true }

/** How an operation's end counts: the store answered, could not be reached, or nothing is known (interrupted). */
type Outcome = "answered" | "unreachable" | "unknown"

const outcomeOf = (exit: Exit.Exit<unknown, unknown>): Outcome => {
  if (exit._tag === "Success") return "answered"
  const failure = exit.cause.reasons.find((reason) => reason._tag === "Fail")
  // Interrupted, or a defect of ours: nothing about the store.
  if (failure === undefined) return "unknown"
  const error = failure.error
  return error instanceof StorageError && unreachable(error) ? "unreachable" : "answered"
}

/** Operations answered from the clock, never a request: the breaker leaves them alone. */
const ANSWERED_WITHOUT_REQUEST: ReadonlySet<string> = new Set(["currentMessageTable", "activeMessageTables"])
/**
 * Operations that may run for minutes (a whole sweep, waiting for a table): refused while the
 * breaker is open, but never the probe, which would keep every other operation refused as long.
 */
const LONG_OPERATIONS: ReadonlySet<string> = new Set(["createTables", "dropMessageTable", "dropStaleUsers", "listMessageTables"])

/**
 * `storage` behind a breaker (see the header); with `threshold` 0, `storage` itself. Logs one line
 * when the breaker opens (the failure that opened it) and one when it closes (how long it was open).
 */
export const withStorageBreaker = (storage: StorageService, options: BreakerOptions): Effect.Effect<StorageService> =>
  Effect.gen(function*() {
    if (options.threshold <= 0) return storage
    const state = yield* Ref.make<BreakerState>(CLOSED)
    const backoffAfter = (backoffMs: number) => Math.min(options.maxBackoffMs, backoffMs * 2)
    /** Between half the back-off and all of it: nodes that opened together do not probe together. */
    const probeAfter = (backoffMs: number) => Effect.map(Random.next, (r) => Math.round(backoffMs * (0.5 + r / 2)))

    const admit = (name: string): Effect.Effect<Admission> =>
      Effect.flatMap(Clock.currentTimeMillis, (now) =>
        Ref.modify(state, (s): [Admission, BreakerState] => {
          switch (s._tag) {
            case "Closed":
              return [RUN, s]
            case "Open":
              if (now < s.probeAt || LONG_OPERATIONS.has(name)) return [{ _tag: "Refused", retryAfterMs: Math.max(0, s.probeAt - now), cause: s.cause }, s]
              return [PROBE, { _tag: "Probing", since: s.since, cause: s.cause, backoffMs: s.backoffMs }]
            case "Probing":
              return [{ _tag: "Refused", retryAfterMs: 0, cause: s.cause }, s]
          }
        }))

    const exitText = (exit: Exit.Exit<unknown, unknown>): string => {
      const failure = exit._tag === "Failure" ? exit.cause.reasons.find((reason) => reason._tag === "Fail") : undefined
      return failure !== undefined && failure.error instanceof StorageError ? failureText(failure.error) : "unknown"
    }

    const settle = (name: string, admission: Admission, exit: Exit.Exit<unknown, unknown>): Effect.Effect<void> => {
      const outcome = outcomeOf(exit)
      if (outcome === "unknown" && !(admission._tag === "Run" && admission.probe)) return Effect.void
      return Effect.gen(function*() {
        const now = yield* Clock.currentTimeMillis
        if (admission._tag === "Run" && admission.probe) {
          const current = yield* Ref.get(state)
          if (current._tag !== "Probing") return
          if (outcome === "answered") {
            yield* Ref.set(state, CLOSED)
            options.onChange?.(false)
            return yield* Effect.logInfo("storage breaker closed: the store answers again").pipe(
              Effect.annotateLogs({ openMs: now - current.since, operation: name })
            )
          }
          // Interrupted, the probe said nothing: the next operation probes again at once.
          const backoffMs = outcome === "unreachable" ? backoffAfter(current.backoffMs) : current.backoffMs
          const wait = outcome === "unreachable" ? yield* probeAfter(backoffMs) : 0
          yield* Ref.set(state, { _tag: "Open", since: current.since, cause: current.cause, backoffMs, probeAt: now + wait })
          return yield* Effect.logDebug("storage breaker probe failed").pipe(Effect.annotateLogs({ operation: name, probeInMs: wait }))
        }
        if (outcome === "answered") {
          return yield* Ref.update(state, (s) => (s._tag === "Closed" && s.failures > 0 ? CLOSED : s))
        }
        const wait = yield* probeAfter(FIRST_BACKOFF_MS)
        const cause = exitText(exit)
        const opens = yield* Ref.modify(state, (s): [boolean, BreakerState] => {
          if (s._tag !== "Closed") return [false, s]
          if (s.failures + 1 < options.threshold) return [false, { _tag: "Closed", failures: s.failures + 1 }]
          return [true, { _tag: "Open", since: now, cause, backoffMs: FIRST_BACKOFF_MS, probeAt: now + wait }]
        })
        if (!opens) return
        options.onChange?.(true)
        yield* Effect.logWarning("storage breaker opened: the store cannot be reached, storage operations fail at once until a probe reaches it").pipe(
          Effect.annotateLogs({ failures: options.threshold, operation: name, cause, probeInMs: wait })
        )
      })
    }

    return mapStorageOperations(storage, (name) => {
      if (ANSWERED_WITHOUT_REQUEST.has(name)) return (operation) => operation
      // Every operation wrapped here fails with a StorageError only: the breaker adds no new error type.
      return <A, E>(operation: Effect.Effect<A, E>) =>
        Effect.flatMap(admit(name), (admission) =>
          admission._tag === "Refused"
            ? Effect.fail(new StorageError({ operation: name, reason: new BreakerOpen({ retryAfterMs: admission.retryAfterMs, opened: admission.cause }) })) as Effect.Effect<never, E>
            : Effect.onExit(operation, (exit) => settle(name, admission, exit)))
    })
  })
