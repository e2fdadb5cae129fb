/**
 * Storage for the tools: the configured PostgreSQL (`db_dsn`) or DynamoDB endpoint, or the embedded data under `data_dir`
 * when none is configured: its SQLite database (opened beside the running nodes: SQLite lets
 * several processes share the file), or dynalite data an earlier version wrote. Unlike the nodes' `storageLayer` (bin/app.ts), nothing is
 * created on the way in: a read-only diagnostic or a dry run must not create tables on a shared
 * cluster (nor need the IAM permission to).
 *
 * Embedded dynalite data belongs to one process at a time (LevelDB holds a lock on it): while the all-in-one
 * runs, a tool talks to that process's embedded server (it announces its endpoint beside the data);
 * otherwise the tool starts its own on the data.
 */
import { existsSync } from "node:fs"
import { readFile } from "node:fs/promises"
import { join } from "node:path"
import * as Data from "effect/Data"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Stream from "effect/Stream"
import type * as Scope from "effect/Scope"
import type { Settings } from "../config/index.ts"
import { type DynamoOptions, layerDynamo } from "../storage/dynamo/layer.ts"
import { layerDynamoTableCopy } from "../storage/dynamo/export.ts"
import { TableCopy } from "../storage/tableCopy.ts"
import { EmbeddedDataError, runningEmbeddedEndpoint, startDynalite } from "../storage/dynalite/embedded.ts"
import { layerPostgres, type PostgresOptions } from "../storage/postgres/layer.ts"
import { layerSqlite, type SqliteOptions } from "../storage/sqlite/layer.ts"
import { layerSqliteTableCopy } from "../storage/sqlite/export.ts"
import { type Storage, StorageError } from "../storage/Storage.ts"
import { Unsupported } from "../storage/failures.ts"
import type { StorageOptions } from "../storage/tables.ts"
import { ToolFailure } from "./cli.ts"
import { writePrivateFile } from "../platform/privateFile.ts"

export const storageOptionsOf = (settings: Settings): StorageOptions & { readonly timeoutMs: number } => ({
  routerTable: settings.routerTablename,
  messageTablePrefix: settings.messageTablename,
  noTableRotation: settings.noTableRotation,
  timeoutMs: Duration.toMillis(settings.storageTimeout)
})

/** PostgreSQL at `dsn` (`db_dsn`), with the pool `db_pool_size` bounds. */
export const postgresOptionsOf = (settings: Settings, dsn: string): PostgresOptions => ({
  ...storageOptionsOf(settings),
  dsn,
  poolSize: settings.dbPoolSize
})

/** Where a PostgreSQL URL points, without its user and password: `host:port/database`. */
export const postgresWhere = (dsn: string): string => {
  const url = new URL(dsn)
  return `${url.host}${url.pathname === "/" ? "" : url.pathname}`
}

/** Whether storage is shared by nodes on other hosts: DynamoDB (`storage_endpoint`) or PostgreSQL (`db_dsn`), not the embedded data. */
export const usesStoreServer = (settings: Settings): boolean => settings.storageEndpoint !== undefined || settings.dbDsn !== undefined

/** Where earlier versions of the all-in-one kept their dynalite data: `data_dir/dynalite`. */
export const embeddedDataDir = (settings: Settings): string => join(settings.dataDir, "dynalite")

/** Where the embedded store keeps its SQLite database: `data_dir/autopush.sqlite` (and its `-wal` and `-shm` files). */
export const embeddedSqliteFile = (settings: Settings): string => join(settings.dataDir, "autopush.sqlite")

/**
 * Which embedded store `data_dir` holds: SQLite (the default, and what a new directory gets), or
 * dynalite data an earlier version wrote (`data_dir/dynalite` with LevelDB's `CURRENT` file) and no
 * SQLite database beside it, which keeps running as it is until it is migrated
 * (`MIGRATE_EMBEDDED`): never a new, empty store in its place.
 */
export const embeddedStoreOf = (settings: Settings): "sqlite" | "dynalite" =>
  existsSync(join(embeddedDataDir(settings), "CURRENT")) && !existsSync(embeddedSqliteFile(settings)) ? "dynalite" : "sqlite"

/** How an operator moves dynalite data of an earlier version to SQLite (README, Operations). */
export const MIGRATE_EMBEDDED = "stop the server; `npm run maintenance -- export --out data.jsonl`; move the dynalite directory aside " +
  "(`mv data/dynalite data/dynalite.old`); `npm run maintenance -- import --in data.jsonl`; start again (README: Operations, Embedded storage)"

/** Whether storage is the embedded SQLite database (no storage_endpoint, no dynalite data of an earlier version). */
export const usesEmbeddedSqlite = (settings: Settings): boolean =>
  !usesStoreServer(settings) && embeddedStoreOf(settings) === "sqlite"

/** Where the all-in-one keeps the secrets it generated: `data_dir/secrets.json`. */
export const embeddedSecretsFile = (settings: Settings): string => join(settings.dataDir, "secrets.json")

/** The keys the all-in-one generated (`crypto_key` signs endpoints: losing it breaks every endpoint). */
export interface EmbeddedSecrets {
  readonly crypto_key: ReadonlyArray<string>
  readonly auth_keys: ReadonlyArray<string>
}

/** `secrets.json` cannot be read or written; the message says which file and what to do. */
export class SecretsFileError extends Data.TaggedError("SecretsFileError")<{ readonly message: string }> {}

const keyList = (value: unknown): ReadonlyArray<string> | undefined =>
  Array.isArray(value) && value.length > 0 && value.every((k) => typeof k === "string" && k.length > 0) ? value : undefined

/**
 * The secrets the all-in-one kept in `path`; undefined when there is no such file (a first start).
 * A file that is there but unusable is an error, never a reason to make new keys: the endpoints
 * made with the old ones would all stop working.
 */
export const readEmbeddedSecrets = (path: string): Effect.Effect<EmbeddedSecrets | undefined, SecretsFileError> =>
  Effect.tryPromise({
    try: () => readFile(path, "utf8"),
    catch: (cause) => cause
  }).pipe(
    Effect.catch((cause) =>
      (cause as NodeJS.ErrnoException).code === "ENOENT"
        ? Effect.succeed(undefined)
        : Effect.fail(new SecretsFileError({ message: `cannot read ${path} (option data_dir): ${(cause as Error).message}` }))
    ),
    Effect.flatMap((text) => {
      if (text === undefined) return Effect.succeed(undefined)
      const unusable = (why: string) =>
        Effect.fail(
          new SecretsFileError({
            message: `${path} is not usable (${why}): restore it from a backup, or remove it to have new keys made ` +
              "(every endpoint made with the old keys then stops working) (option data_dir)"
          })
        )
      let parsed: unknown
      try {
        parsed = JSON.parse(text)
      } catch {
        return unusable("not JSON")
      }
      const record = parsed as { readonly crypto_key?: unknown; readonly auth_keys?: unknown } | null
      const cryptoKey = keyList(record?.crypto_key)
      const authKeys = keyList(record?.auth_keys)
      if (cryptoKey === undefined || authKeys === undefined) return unusable("crypto_key and auth_keys must be lists of keys")
      return Effect.succeed({ crypto_key: cryptoKey, auth_keys: authKeys })
    })
  )

/**
 * Keep `secrets` in `path` (mode 0600), atomically: a private temporary file (random name, created
 * exclusively: `privateFile.ts`) renamed over it, never half a file.
 */
export const writeEmbeddedSecrets = (path: string, secrets: EmbeddedSecrets): Effect.Effect<void, SecretsFileError> =>
  Effect.tryPromise({
    try: () => writePrivateFile(path, JSON.stringify(secrets, null, 2)),
    catch: (cause) => new SecretsFileError({ message: `cannot keep the generated keys in ${path} (option data_dir): ${(cause as Error).message}` })
  })

/** Human description of the storage a tool talks to, for its output. */
export const storageDescription = (settings: Settings): string =>
  settings.dbDsn !== undefined
    ? `PostgreSQL at ${postgresWhere(settings.dbDsn)}`
    : settings.storageEndpoint !== undefined
    ? `DynamoDB at ${settings.storageEndpoint}`
    : usesEmbeddedSqlite(settings)
    ? `embedded SQLite database ${embeddedSqliteFile(settings)}`
    : `embedded data under ${embeddedDataDir(settings)}`

/**
 * Where a tool's storage is. Embedded data must already exist unless `mayCreate` (create-tables,
 * import): pointing a read or a drop at an empty folder is a mistake (wrong directory, forgotten
 * `--storage-endpoint`), not something to set up silently.
 */
const toolStorageOptions = (
  settings: Settings,
  mayCreate: boolean
): Effect.Effect<DynamoOptions, StorageError | ToolFailure, Scope.Scope> => {
  const options = storageOptionsOf(settings)
  if (settings.storageEndpoint !== undefined) {
    return Effect.succeed({ ...options, endpoint: settings.storageEndpoint, region: settings.awsRegion })
  }
  const dir = embeddedDataDir(settings)
  return Effect.gen(function*() {
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
    return { ...options, endpoint, region: "local" }
  })
}

/** The embedded SQLite database, which must exist unless `mayCreate` (as `toolStorageOptions`). */
const toolSqliteOptions = (settings: Settings, mayCreate: boolean): Effect.Effect<SqliteOptions, ToolFailure> => {
  const path = embeddedSqliteFile(settings)
  return !mayCreate && !existsSync(path)
    ? Effect.fail(
      new ToolFailure({
        message: `no storage: no storage_endpoint is configured (--storage-endpoint, AWS_ENDPOINT_URL_DYNAMODB, ` +
          `AUTOPUSH__STORAGE_ENDPOINT or an ini file) and there is no embedded database ${path} (data_dir is ${settings.dataDir})`
      })
    )
    : Effect.succeed({ ...storageOptionsOf(settings), path })
}

/** The Storage a tool uses. */
export const toolStorageLayer = (
  settings: Settings,
  mayCreate = false
): Layer.Layer<Storage, StorageError | ToolFailure> =>
  settings.dbDsn !== undefined
    ? layerPostgres(postgresOptionsOf(settings, settings.dbDsn))
    : usesEmbeddedSqlite(settings)
    ? Layer.unwrap(Effect.map(toolSqliteOptions(settings, mayCreate), layerSqlite))
    : Layer.unwrap(Effect.map(toolStorageOptions(settings, mayCreate), layerDynamo))

/**
 * Whole-table reads and writes are the embedded database's and DynamoDB's: on PostgreSQL, export and
 * import say to use its own tools (every other command works).
 */
const postgresHasNoTableCopies = Layer.succeed(TableCopy, {
  scan: () => Stream.fail(noTableCopies("export")),
  countUsers: () => Effect.fail(noTableCopies("import")),
  putItems: () => Effect.fail(noTableCopies("import"))
})

const noTableCopies = (operation: string) =>
  new StorageError({
    operation,
    reason: new Unsupported(),
    cause: new Error(
      "export and import move the embedded database and DynamoDB tables; PostgreSQL's own tools back up and copy its data (pg_dump, pg_restore)"
    )
  })

/** The Storage a tool uses, and whole-table reads and writes on the same store (export, import). */
export const toolTablesLayer = (
  settings: Settings,
  mayCreate: boolean
): Layer.Layer<Storage | TableCopy, StorageError | ToolFailure> =>
  settings.dbDsn !== undefined
    ? Layer.merge(layerPostgres(postgresOptionsOf(settings, settings.dbDsn)), postgresHasNoTableCopies)
    : usesEmbeddedSqlite(settings)
    ? Layer.unwrap(Effect.map(toolSqliteOptions(settings, mayCreate), (options) => Layer.merge(layerSqlite(options), layerSqliteTableCopy(options))))
    : Layer.unwrap(Effect.map(toolStorageOptions(settings, mayCreate), (options) => Layer.merge(layerDynamo(options), layerDynamoTableCopy(options))))
