/**
 * Stopping the node: the drain, and the accounting of sessions its deadline cut short.
 */
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import type { Server } from "node:http"
import type { SessionHandle, SessionRunner } from "../protocol/session.ts"
import { failureText, type NodeSession, type StorageError } from "../storage/Storage.ts"
import type { NodeFibers } from "./fibers.ts"
import type { NodeRegistryService } from "./registry.ts"

/** Whether the node is stopping; `cut`: sessions ended without their unacked messages saved. */
export interface StopAccounting {
  started: boolean
  readonly cut: number
}

/**
 * A session fiber that ended before its session closed (interrupted by the shutdown, or a defect
 * outside the session's boundary) is brought to its end in a fiber of the node's (`finishEnded`).
 * While the node stops, those that still could not save are counted and reported together
 * (`drain`), not in a line each: a node stopping under more than it can save in `shutdown_timeout`
 * may cut thousands.
 */
export const stopAccounting = (fibers: NodeFibers) => {
  const stopping = { started: false, cut: 0 }
  const countCut = () => Effect.sync(() => void stopping.cut++)
  const finishEnded = function(this: SessionRunner): void {
    if (!this.isClosed) fibers.run(stopping.started ? this.finish(countCut) : this.finish())
  }
  return { stopping: stopping as StopAccounting, finishEnded }
}

const monotonicMillis = Effect.map(Clock.monotonicTimeNanos, (nanos) => Number(nanos / 1_000_000n))

/** Sessions told to close at once, beyond those that have ended since the drain began. */
const CLOSING_AT_ONCE = 2_000
/** How often the drain tells the next sessions to close. */
const WAVE_MS = 20

/**
 * Tell the sessions to close (1001) in waves, in the order they connected: at most
 * `CLOSING_AT_ONCE` more than have ended so far, and never fewer than the share of the first half
 * of `timeoutMs` gone by (all of them by then). The clients' reconnects to other nodes come spread
 * over the stop instead of all in its first moment, and each wave's saves find the node free to
 * make them; a node that keeps up tells them all at once in effect.
 */
const closeInWaves = (handles: ReadonlyArray<SessionHandle>, registry: NodeRegistryService, began: number, timeoutMs: number) =>
  Effect.gen(function*() {
    let told = 0
    while (told < handles.length) {
      const ended = handles.length - registry.connections.size
      const due = Math.ceil(handles.length * Math.min(1, ((yield* monotonicMillis) - began) / (timeoutMs / 2)))
      const upTo = Math.min(handles.length, Math.max(ended + CLOSING_AT_ONCE, due))
      for (; told < upTo; told++) handles[told]!.mailbox.offer({ _tag: "Kick", kind: "shutdown" })
      if (told < handles.length) yield* Effect.sleep(WAVE_MS)
    }
  })

/**
 * Graceful drain: stop accepting connections, close every session with 1001 (Firefox reconnects,
 * elsewhere or here once restarted), in waves (`closeInWaves`); each session saves its unacked direct messages on the way out,
 * and from the moment it closes the router port answers 404 for it, so endpoints store instead.
 * Waits for the sessions up to `timeoutMs`; the rest are interrupted, and their cleanup still runs
 * (`interruptSessions` waits for it). Then the node takes its id out of the records of the sessions
 * it had, all at once (`leaveRecords`: a few transactions on SQL stores, where each session
 * clearing its own would cost a commit each), so that endpoints store for them rather than try a
 * node that is gone.
 */
export const drain = (
  { publicServer, stopAccepting, registry, sessionsDone, interruptSessions, timeoutMs, leaveRecords, stopping }: {
    readonly publicServer: Server
    readonly stopAccepting: () => void
    readonly registry: NodeRegistryService
    readonly sessionsDone: Effect.Effect<void>
    readonly interruptSessions: Effect.Effect<void>
    readonly timeoutMs: number
    readonly leaveRecords: (sessions: ReadonlyArray<NodeSession>) => Effect.Effect<number, StorageError>
    /** Set here when the drain starts. */
    readonly stopping: StopAccounting
  }
) =>
  Effect.gen(function*() {
    stopping.started = true
    // A deadline on the monotonic clock: a step of the wall clock does not move it.
    const began = yield* monotonicMillis
    publicServer.close()
    stopAccepting()
    const handles = [...registry.connections]
    const sessions = handles.length
    const identified: Array<NodeSession> = []
    for (const handle of handles) {
      if (handle.uaid !== undefined) identified.push({ uaid: handle.uaid, connectedAt: handle.connectedAt })
    }
    const waves = yield* Effect.forkChild(closeInWaves(handles, registry, began, timeoutMs))
    const done = yield* sessionsDone.pipe(Effect.timeoutOption(timeoutMs))
    yield* Fiber.interrupt(waves)
    if (done._tag === "None") yield* interruptSessions
    // What is left of `timeoutMs`, and at least a second: records not left by then name a node that
    // is gone, which endpoints find out for themselves (they store, and clear the node id).
    const leftMs = Math.max(1_000, began + timeoutMs - (yield* monotonicMillis))
    const left = yield* leaveRecords(identified).pipe(
      Effect.timeoutOrElse({ duration: leftMs, orElse: () => Effect.succeed(0) }),
      Effect.catchTag("StorageError", (error) =>
        Effect.as(
          Effect.logWarning("could not leave the router records of this node's sessions").pipe(
            Effect.annotateLogs({ sessions: identified.length, operation: error.operation, reason: error.reason._tag, cause: failureText(error) })
          ),
          0
        ))
    )
    if (stopping.cut > 0) {
      yield* Effect.logError("sessions ended before their unacked messages could be saved").pipe(
        Effect.annotateLogs({ sessions: stopping.cut, shutdown_timeout_ms: timeoutMs })
      )
    }
    yield* Effect.logInfo("connection node drained").pipe(
      Effect.annotateLogs({ sessions, complete: done._tag === "Some", remaining: registry.connections.size, records_left: left })
    )
  })
