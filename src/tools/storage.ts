/**
 * Storage for the tools: the configured DynamoDB endpoint, or the embedded dynalite data under
 * `data_dir` when none is configured. Unlike the nodes' `storageLayer` (bin/app.ts), nothing is
 * created on the way in: a read-only diagnostic or a dry run must not create tables on a shared
 * cluster (nor need the IAM permission to).
 *
 * Embedded data belongs to one process at a time (LevelDB holds a lock on it): while the all-in-one
 * runs, a tool talks to that process's embedded server (it announces its endpoint beside the data);
 * otherwise the tool starts its own on the data.
 */
import { existsSync } from "node:fs"
import { join } from "node:path"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import type { Settings } from "../config/index.ts"
import { layerDynamo } from "../storage/dynamodb.ts"
import { EmbeddedDataError, runningEmbeddedEndpoint, startDynalite } from "../storage/embedded.ts"
import type { Storage, StorageError } from "../storage/Storage.ts"
import type { StorageOptions } from "../storage/tables.ts"
import { ToolFailure } from "./cli.ts"

export const storageOptionsOf = (settings: Settings): StorageOptions & { readonly timeoutMs: number } => ({
  routerTable: settings.routerTablename,
  messageTablePrefix: settings.messageTablename,
  noTableRotation: settings.noTableRotation,
  timeoutMs: Duration.toMillis(settings.storageTimeout)
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
      const running = runningEmbeddedEndpoint(dir)
      const endpoint = running ?? (yield* startDynalite(dir).pipe(
        Effect.catchTag("StorageError", (error) =>
          Effect.fail(
            error.cause instanceof EmbeddedDataError
              ? new ToolFailure({
                message: error.cause.inUse
                  ? `${error.cause.message}, which does not say where it serves it: stop that process, or point the tool at ` +
                    "a DynamoDB endpoint with --storage-endpoint"
                  : error.cause.message
              })
              : error
          ))
      ))
      return layerDynamo({ ...options, endpoint, region: "local" })
    })
  )
}
