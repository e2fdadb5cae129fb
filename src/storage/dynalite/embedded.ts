/**
 * Embedded dynalite: the DynamoDB API on LevelDB on a thread of this process (`dynalite/thread.ts`),
 * on 127.0.0.1 and a free port, its data under a directory — what `npm run storage` serves, and
 * what the all-in-one runs on dynalite data an earlier version left in `data_dir` (new data goes
 * to SQLite: `sqlite/layer.ts`). The service talks
 * to it through the same DynamoDB layer as to AWS. LevelDB appends every write to its log before
 * answering, so the data survives a restart and a `kill -9` of the process (not a power cut: writes
 * are not fsynced). The thread dies with the process: nothing is left holding the data.
 *
 * While it runs, `{data dir}/../embedded.json` names its endpoint and the process, so the operator's
 * tools can use the running server instead of failing on the held LevelDB lock.
 */
import { readFileSync, rmSync } from "node:fs"
import { writePrivateFile } from "../../platform/privateFile.ts"
import { listenFailure } from "../../platform/listen.ts"
import { dirname, join } from "node:path"
import type { Worker } from "node:worker_threads"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import type * as Scope from "effect/Scope"
import { layerDynamo } from "../dynamo/layer.ts"
import { dynaliteWorker } from "./worker.ts"
import { type Storage, StorageError } from "../Storage.ts"
import { Unknown } from "../failures.ts"
import type { StartupError } from "../../platform/startup.ts"
import { layerTableKeeper } from "../tableKeeper.ts"
import type { StorageOptions } from "../tables.ts"

/** Why the embedded data cannot be used: another process holds it, or it cannot be opened. */
export class EmbeddedDataError extends Error {
  readonly inUse: boolean
  constructor(message: string, inUse: boolean) {
    super(message)
    this.name = "EmbeddedDataError"
    this.inUse = inUse
  }
}

type ThreadMessage =
  | { readonly port: number }
  | { readonly error: { readonly message: string; readonly code?: unknown } }
  | { readonly closed: true }

/** Where the server listens: by default 127.0.0.1 at a free port (only this process uses it). */
interface DynaliteListen {
  readonly host: string
  readonly port: number
  /** The option that sets `port`, named when the port is in use. */
  readonly option: string
}

const startThread = (dataDir: string, listen: DynaliteListen) =>
  Effect.callback<{ readonly worker: Worker; readonly port: number }, StorageError>((resume) => {
    const worker = dynaliteWorker()
    worker.postMessage({ open: dataDir, host: listen.host, listenPort: listen.port })
    const failed = (error: EmbeddedDataError | Error | StartupError) => {
      void worker.terminate()
      resume(Effect.fail(new StorageError({ operation: "startDynalite", reason: new Unknown(), cause: error })))
    }
    worker.once("error", failed)
    worker.once("message", (message: ThreadMessage) => {
      worker.off("error", failed)
      if ("port" in message) return resume(Effect.succeed({ worker, port: message.port }))
      if ("error" in message) {
        failed(
          message.error.code === "LEVEL_LOCKED"
            ? new EmbeddedDataError(`the embedded data under ${dataDir} is in use by another process`, true)
            : message.error.code === "EADDRINUSE"
            ? listenFailure(listen.option, listen.host, listen.port, message.error)
            : new EmbeddedDataError(`cannot open the embedded data under ${dataDir}: ${message.error.message}`, false)
        )
      }
    })
  })

const stopThread = (worker: Worker) =>
  Effect.callback<void>((resume) => {
    // A request still in flight when the database closes makes dynalite throw on its thread: the
    // thread is going away, so that is not a failure to report (nor a stack trace on a start that
    // failed for another reason).
    worker.on("error", () => {})
    const done = () => resume(Effect.void)
    const timer = setTimeout(() => void worker.terminate().then(done, done), 10_000)
    worker.once("exit", () => {
      clearTimeout(timer)
      done()
    })
    worker.postMessage("close")
  })

/**
 * Start dynalite with its LevelDB under `dataDir` (created if missing); the endpoint URL this
 * machine reaches it by, e.g. `http://127.0.0.1:41234`. Closing the scope stops the server and
 * closes the database.
 */
export const startDynalite = (
  dataDir: string,
  listen: DynaliteListen = { host: "127.0.0.1", port: 0, option: "storage_port" }
): Effect.Effect<string, StorageError, Scope.Scope> =>
  Effect.acquireRelease(startThread(dataDir, listen), ({ worker }) => stopThread(worker)).pipe(
    Effect.map(({ port }) => `http://${localHostOf(listen.host)}:${port}`)
  )

/** The address this machine reaches a server listening on `host` by (any address: the loopback). */
const localHostOf = (host: string): string =>
  host === "0.0.0.0" || host === "" ? "127.0.0.1" : host === "::" ? "[::1]" : host.includes(":") ? `[${host}]` : host

/** Where a running embedded server announces itself, beside its data directory. */
export const embeddedEndpointFile = (dataDir: string): string => join(dirname(dataDir), "embedded.json")

/** The endpoint of the embedded server that runs on `dataDir` now, if one does. */
export const runningEmbeddedEndpoint = (dataDir: string): string | undefined => {
  try {
    const { pid, endpoint } = JSON.parse(readFileSync(embeddedEndpointFile(dataDir), "utf8")) as { pid: number; endpoint: string }
    process.kill(pid, 0) // throws when no such process
    return endpoint
  } catch {
    return undefined
  }
}

export const announceEmbedded = (dataDir: string, endpoint: string) =>
  Effect.acquireRelease(
    // Beside the data directory, which may be in a shared one: written as a private file, through a
    // temporary one of a random name, never through a link someone put at its path.
    Effect.promise(() => writePrivateFile(embeddedEndpointFile(dataDir), JSON.stringify({ pid: process.pid, endpoint }))),
    () => Effect.sync(() => rmSync(embeddedEndpointFile(dataDir), { force: true }))
  )

/**
 * Storage on an embedded dynalite under `dataDir`, its tables kept present (`tableKeeper.ts`):
 * created on start, checked every hour.
 */
export const layerEmbedded = (
  options: StorageOptions & { readonly dataDir: string; readonly timeoutMs?: number | undefined }
): Layer.Layer<Storage, StorageError> =>
  Layer.unwrap(
    Effect.gen(function*() {
      const endpoint = yield* startDynalite(options.dataDir)
      yield* announceEmbedded(options.dataDir, endpoint)
      return layerDynamo({ ...options, endpoint, region: "local" })
    })
  ).pipe(Layer.tap((context) => Layer.build(layerTableKeeper).pipe(Effect.provideContext(context))))
