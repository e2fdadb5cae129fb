/**
 * Storage for the tools: the configured DynamoDB endpoint, or the embedded dynalite data under
 * `data_dir` when none is configured. Unlike the nodes' `storageLayer` (bin/app.ts), nothing is
 * created on the way in: a read-only diagnostic or a dry run must not create tables on a shared
 * cluster (nor need the IAM permission to).
 *
 * Embedded data belongs to one process at a time: LevelDB holds a lock on it while the all-in-one
 * runs, and a second dynalite on the same folder fails on its first request. So the lock is tried
 * first, with the same `level` package dynalite opens it with, and a held lock is a clear error.
 */
import { existsSync } from "node:fs"
import { createRequire } from "node:module"
import { join } from "node:path"
import { Effect, Layer, Predicate } from "effect"
import type { Settings } from "../config/index.ts"
import { layerDynamo } from "../storage/dynamodb.ts"
import { startDynalite } from "../storage/embedded.ts"
import type { Storage, StorageError } from "../storage/Storage.ts"
import type { StorageOptions } from "../storage/tables.ts"
import { ToolFailure } from "./cli.ts"

export const storageOptionsOf = (settings: Settings): StorageOptions => ({
  routerTable: settings.routerTablename,
  messageTablePrefix: settings.messageTablename,
  noTableRotation: settings.noTableRotation
})

/** Where the all-in-one keeps its dynalite data: `data_dir/dynalite`. */
export const embeddedDataDir = (settings: Settings): string => join(settings.dataDir, "dynalite")

/** Where the all-in-one keeps the secrets it generated: `data_dir/secrets.json`. */
export const embeddedSecretsFile = (settings: Settings): string => join(settings.dataDir, "secrets.json")

/** Human description of the storage a tool talks to, for its output. */
export const storageDescription = (settings: Settings): string =>
  settings.storageEndpoint !== undefined
    ? `DynamoDB at ${settings.storageEndpoint}`
    : `embedded data under ${embeddedDataDir(settings)}`

interface LevelDb {
  open(options: { createIfMissing: boolean }): Promise<void>
  close(): Promise<void>
}

const codeOf = (error: unknown): string | undefined =>
  Predicate.hasProperty(error, "code") && Predicate.isString(error.code) ? error.code : undefined

/** Fails when another process holds the LevelDB lock of `dir` (a running all-in-one). */
const ensureUnlocked = (dir: string): Effect.Effect<void, ToolFailure> =>
  Effect.tryPromise({
    try: async () => {
      // dynalite's own `level`, whatever the hoisting: the lock is tried exactly as dynalite opens it.
      const fromDynalite = createRequire(createRequire(import.meta.url).resolve("dynalite"))
      const { Level } = fromDynalite("level") as { Level: new(path: string) => LevelDb }
      const db = new Level(dir)
      await db.open({ createIfMissing: true })
      await db.close()
    },
    catch: (error) => {
      const cause = Predicate.hasProperty(error, "cause") ? error.cause : undefined
      if (codeOf(cause) === "LEVEL_LOCKED" || codeOf(error) === "LEVEL_LOCKED") {
        return new ToolFailure({
          message: `the embedded data under ${dir} is in use (its LevelDB lock is held, most likely by a running ` +
            "autopush): stop that process first, or point the tool at a DynamoDB endpoint with --storage-endpoint"
        })
      }
      const detail = cause instanceof Error ? cause.message : error instanceof Error ? error.message : String(error)
      return new ToolFailure({ message: `cannot open the embedded data under ${dir}: ${detail}` })
    }
  })

/**
 * The Storage a tool uses. Embedded data must already exist unless `mayCreate` (create-tables):
 * pointing a read or a drop at an empty folder is a mistake (wrong directory, forgotten
 * `--storage-endpoint`), not something to set up silently.
 */
export const toolStorageLayer = (
  settings: Settings,
  mayCreate = false
): Layer.Layer<Storage, StorageError | ToolFailure> => {
  const options = storageOptionsOf(settings)
  if (settings.storageEndpoint !== undefined) {
    return layerDynamo({ ...options, endpoint: settings.storageEndpoint, region: settings.awsRegion })
  }
  const dir = embeddedDataDir(settings)
  return Layer.unwrap(
    Effect.gen(function*() {
      if (!mayCreate && !existsSync(dir)) {
        return yield* new ToolFailure({
          message: `no storage: no storage_endpoint is configured (--storage-endpoint, AWS_ENDPOINT_URL_DYNAMODB, ` +
            `AUTOPUSH__STORAGE_ENDPOINT or an ini file) and there is no embedded data under ${dir} (data_dir is ${settings.dataDir})`
        })
      }
      if (existsSync(dir)) yield* ensureUnlocked(dir)
      const endpoint = yield* startDynalite(dir)
      return layerDynamo({ ...options, endpoint, region: "local" })
    })
  )
}
