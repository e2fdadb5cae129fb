/**
 * A worker whose supervisor is gone (killed, even with SIGKILL: the IPC channel closes with it)
 * stops rather than live on as an orphan holding a share of the ports, and says so once.
 *
 * - Its store elsewhere (DynamoDB, a storage server): the store is still there, so it stops as on
 *   SIGTERM: every client is closed with 1001 and the drain saves what they had not acked, within
 *   `shutdown_timeout`.
 * - Its store the embedded one its supervisor ran: the store died with the supervisor, and nothing
 *   can be saved any more. Its clients are still closed with 1001 at once (the drain's first step),
 *   so they reconnect; then it exits after `STORE_GONE_EXIT_MS` instead of waiting out the drain
 *   against a store that refuses every connection, and says nothing more: each failed write would be
 *   a warning about the same cause.
 */
import * as Effect from "effect/Effect"
import * as Logger from "effect/Logger"

/** With the embedded store gone, how long the clients' close frames (1001) get to go out before the worker exits. */
export const STORE_GONE_EXIT_MS = 1_000

type Loggers = ReadonlySet<Logger.Logger<unknown, any>>

/**
 * Watch for the supervisor's end; `loggers` are the worker's, and the node runs with the returned
 * ones: the same, silenced once the embedded store is known to be gone.
 */
export const stopWhenSupervisorIsGone = (storeIsTheSupervisors: boolean, loggers: Loggers): { readonly loggers: Loggers } => {
  let quiet = false
  const gated: Loggers = new Set([...loggers].map((logger) =>
    Logger.make((options) => {
      if (!quiet) logger.log(options)
    })
  ))
  process.once("disconnect", () => {
    quiet = storeIsTheSupervisors
    const line = storeIsTheSupervisors
      ? "worker stopping: its supervisor is gone, and the embedded store with it; its clients are closed (1001) and reconnect to a restarted node, what they had not acked is lost"
      : "worker stopping: its supervisor is gone; its clients are closed (1001) and what they had not acked is saved"
    Effect.runFork(Effect.logWarning(line).pipe(
      Effect.annotateLogs({ supervisor_pid: process.ppid }),
      Effect.provideService(Logger.CurrentLoggers, loggers)
    ))
    if (storeIsTheSupervisors) setTimeout(() => process.exit(1), STORE_GONE_EXIT_MS)
    process.kill(process.pid, "SIGTERM")
  })
  return { loggers: gated }
}
