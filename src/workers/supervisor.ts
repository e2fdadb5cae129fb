/**
 * The process that runs a node as several workers: it starts them (the same entrypoint, the same
 * flags, plus each one's private ports), waits until every one is ready, replaces a worker that
 * dies, and on shutdown stops them all at once, each draining its own clients. The workers share the
 * public ports with SO_REUSEPORT: the kernel hands each new connection to one of them, with no
 * process in between, and a worker that dies simply stops being handed any.
 */
import { type ChildProcess, fork } from "node:child_process"
import * as Data from "effect/Data"
import * as Deferred from "effect/Deferred"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Scope from "effect/Scope"
import type { Role, Settings } from "../config/options.ts"
import { builtRouterUrl } from "../config/load.ts"
import { StartupError } from "../platform/startup.ts"
import { WORKER_ENV, type WorkerContext, workerFlags, type WorkerMessage, workerPortOption, workerPorts } from "./worker.ts"

export interface SupervisorOptions {
  readonly role: Role
  readonly settings: Settings
  readonly count: number
  /** The node's own flags, given to every worker before its own. */
  readonly argv: ReadonlyArray<string>
  /** The embedded store this process runs for the workers, if it runs one. */
  readonly storageEndpoint?: string | undefined
}

/** A worker could not start: the line it said why with, which the supervisor prints as it is, once. */
export class WorkerStartError extends Data.TaggedError("WorkerStartError")<{ readonly line: string }> {}

/** Platforms whose SO_REUSEPORT spreads connections over the sockets sharing a port (Node's `reusePort`). */
const SPREADING_PLATFORMS: ReadonlyArray<NodeJS.Platform> = ["linux", "freebsd"]

/** A worker that dies this soon after its start is restarted after a growing delay, not at once. */
const STABLE_AFTER_MS = 60_000
const FIRST_RESTART_DELAY_MS = 1_000
const MAX_RESTART_DELAY_MS = 30_000

/**
 * How many times in a row a worker has died young, counting the death of one that lived `livedMs`
 * (measured on a monotonic clock: a wall-clock step, NTP or a faked date, must not reset or prolong it).
 */
export const restartsAfter = (restarts: number, livedMs: number): number => livedMs >= STABLE_AFTER_MS ? 0 : restarts + 1

/** The delay before restarting a worker that died young `restarts` times in a row: 1 s, 2 s, 4 s … 30 s. */
export const restartDelayMs = (restarts: number): number =>
  Math.min(MAX_RESTART_DELAY_MS, FIRST_RESTART_DELAY_MS * 2 ** Math.max(0, restarts - 1))

/** Why these settings cannot run as `count` workers, if they cannot. */
export const workersRefusal = (role: Role, settings: Settings, count: number): string | undefined => {
  if (count <= 1) return undefined
  if (!SPREADING_PLATFORMS.includes(process.platform)) {
    return `workers = ${count} needs ports shared by several processes (SO_REUSEPORT spreading connections: Linux, FreeBSD); on ${process.platform} run workers = 1`
  }
  if (role !== "autoendpoint" && settings.routerUrl !== builtRouterUrl(settings)) {
    return `router_url names one process, but each of the ${count} workers has its own router port (router_port + i): unset router_url and set router_hostname (and router_scheme) instead`
  }
  const last = workerPorts(role, settings, count).at(-1) ?? 0
  if (last > 65_535) return `${count} workers need ports up to ${last} from ${workerPortOption(role)} on, past 65535: choose a lower ${workerPortOption(role)}`
  return undefined
}

/** How a worker's life ended. */
interface WorkerEnd {
  readonly ready: boolean
  /** The line a worker that could not start sent. */
  readonly failure: string | undefined
  readonly code: number | null
  readonly signal: NodeJS.Signals | null
}

const endText = (end: WorkerEnd): string => end.signal !== null ? `killed by ${end.signal}` : `exited with code ${end.code}`

/** Start worker `index`: detached from the terminal's process group, so that Ctrl-C reaches the supervisor only, which stops the workers in order. */
const spawnWorker = (options: SupervisorOptions, index: number): ChildProcess => {
  const context: WorkerContext = { index, count: options.count, storageEndpoint: options.storageEndpoint }
  return fork(process.argv[1] ?? "", [...options.argv, ...workerFlags(options.role, options.settings, index, options.count)], {
    env: { ...process.env, [WORKER_ENV]: JSON.stringify(context) },
    execArgv: process.execArgv,
    stdio: ["ignore", "inherit", "inherit", "ipc"],
    detached: true
  })
}

/** Wait for a worker to end, calling `onReady` when it says it is ready. */
const watchWorker = (child: ChildProcess, onReady: () => void) =>
  Effect.callback<WorkerEnd>((resume) => {
    let ready = false
    let failure: string | undefined
    child.on("message", (message: WorkerMessage) => {
      if (message.type === "ready") {
        ready = true
        onReady()
      } else if (message.type === "failed") failure = message.line
    })
    // A worker that cannot be started at all (no such file): an error, then maybe no exit.
    child.once("error", (error) => resume(Effect.succeed({ ready, failure: failure ?? error.message, code: null, signal: null })))
    child.once("exit", (code, signal) => resume(Effect.succeed({ ready, failure, code, signal })))
  })

/** Stop a worker: SIGTERM (it drains its clients, up to `shutdown_timeout`), then SIGKILL if it is still there. */
const stopWorker = (child: ChildProcess, graceMs: number) =>
  Effect.callback<void>((resume) => {
    if (child.exitCode !== null || child.signalCode !== null) return resume(Effect.void)
    const timer = setTimeout(() => child.kill("SIGKILL"), graceMs)
    child.once("exit", () => {
      clearTimeout(timer)
      resume(Effect.void)
    })
    child.kill("SIGTERM")
  })

/**
 * Keep worker `index` running: start it, and when it ends, start it again (after a delay that grows
 * while it keeps dying young). Its first start failing fails `firstReady`, and this loop ends.
 */
const keepWorker = (options: SupervisorOptions, index: number, firstReady: Deferred.Deferred<void, WorkerStartError>) =>
  Effect.gen(function*() {
    // A worker gets its own drain time, and a little more to exit, before it is killed.
    const graceMs = Duration.toMillis(options.settings.shutdownTimeout) + 5_000
    let restarts = 0
    for (;;) {
      const startedAt = performance.now()
      const end = yield* Effect.scoped(Effect.gen(function*() {
        const child = yield* Effect.acquireRelease(Effect.sync(() => spawnWorker(options, index)), (child) => stopWorker(child, graceMs))
        yield* Effect.logDebug("worker started").pipe(Effect.annotateLogs({ worker: index, pid: child.pid }))
        return yield* watchWorker(child, () => Deferred.doneUnsafe(firstReady, Effect.void))
      }))
      if (!(yield* Deferred.isDone(firstReady))) {
        return yield* Deferred.fail(firstReady, new WorkerStartError({ line: end.failure ?? `cannot start: worker ${index} ${endText(end)} before it was ready` }))
      }
      restarts = restartsAfter(restarts, performance.now() - startedAt)
      const delayMs = restartDelayMs(restarts)
      yield* Effect.logWarning(`worker ${index} ${endText(end)}; starting a new one in ${delayMs / 1000} s (its clients reconnect to the other workers meanwhile)`).pipe(
        Effect.annotateLogs({ worker: index, ...(end.failure === undefined ? {} : { reason: end.failure }) })
      )
      yield* Effect.sleep(delayMs)
    }
  })

/**
 * Run `count` workers for the scope's lifetime: succeeds once every one is ready, fails with the
 * first one's reason when one cannot start. Closing the scope stops them all, in parallel.
 */
export const superviseWorkers = (options: SupervisorOptions): Effect.Effect<void, StartupError | WorkerStartError, Scope.Scope> =>
  Effect.gen(function*() {
    const refusal = workersRefusal(options.role, options.settings, options.count)
    if (refusal !== undefined) return yield* new StartupError({ message: refusal })
    // The workers' own scope, closed in parallel: a scope's finalizers otherwise run one after the
    // other, and each worker would be sent SIGTERM only once the previous one had drained and exited.
    const workers = yield* Scope.fork(yield* Effect.scope, "parallel")
    const readies = yield* Effect.forEach(Array.from({ length: options.count }, (_, i) => i), (index) =>
      Effect.gen(function*() {
        const ready = yield* Deferred.make<void, WorkerStartError>()
        yield* Effect.forkIn(keepWorker(options, index, ready), workers)
        return ready
      }))
    yield* Effect.forEach(readies, (ready) => Deferred.await(ready), { concurrency: "unbounded", discard: true })
  })
