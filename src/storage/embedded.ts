/**
 * The embedded default: dynalite (the DynamoDB API on LevelDB) inside this process, on
 * 127.0.0.1 and a free port, its data under a directory. The service talks to it through the same
 * DynamoDB layer as to AWS. LevelDB appends every write to its log before answering, so the data
 * survives a restart and a `kill -9` of the process (not a power cut: writes are not fsynced).
 */
import { mkdir } from "node:fs/promises"
import type { AddressInfo } from "node:net"
import dynalite from "dynalite"
import { Effect, Layer, type Scope } from "effect"
import { layerDynamo } from "./dynamodb.ts"
import { createActiveTables, type Storage, StorageError } from "./Storage.ts"
import type { StorageOptions } from "./tables.ts"

/**
 * Start dynalite with its LevelDB under `dataDir` (created if missing); the endpoint URL, e.g.
 * `http://127.0.0.1:41234`. Closing the scope stops the server and closes the database.
 */
export const startDynalite = (dataDir: string): Effect.Effect<string, StorageError, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.tryPromise({
      try: async () => {
        await mkdir(dataDir, { recursive: true })
        const server = dynalite({ path: dataDir, createTableMs: 0, deleteTableMs: 0, updateTableMs: 0 })
        await new Promise<void>((resolve, reject) => {
          server.once("error", reject)
          server.listen(0, "127.0.0.1", () => {
            server.off("error", reject)
            resolve()
          })
        })
        return server
      },
      catch: (cause) => new StorageError({ operation: "startDynalite", cause })
    }),
    (server) =>
      Effect.callback<void>((resume) => {
        server.close(() => resume(Effect.void))
      })
  ).pipe(Effect.map((server) => `http://127.0.0.1:${(server.address() as AddressInfo).port}`))

/**
 * Storage on an embedded dynalite under `dataDir`. The router and active message tables are
 * created on start and re-checked every hour, so that next month's table exists before the month
 * turns (nothing else creates tables in the all-in-one process).
 */
export const layerEmbedded = (options: StorageOptions & { readonly dataDir: string }): Layer.Layer<Storage, StorageError> =>
  Layer.unwrap(
    Effect.map(startDynalite(options.dataDir), (endpoint) => layerDynamo({ ...options, endpoint, region: "local" }))
  ).pipe(
    Layer.tap((context) =>
      Effect.gen(function*() {
        yield* createActiveTables
        yield* createActiveTables.pipe(
          Effect.catch((error) => Effect.logWarning("creating message tables failed", error)),
          Effect.delay("1 hour"),
          Effect.forever,
          Effect.forkScoped
        )
      }).pipe(Effect.provideContext(context))
    )
  )
