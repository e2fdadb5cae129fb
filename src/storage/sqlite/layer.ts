/**
 * Storage on SQLite (`node:sqlite`): the embedded default, one database file under `data_dir`
 * shared by every process of the host that uses it (the workers of a node, separate nodes). The
 * operations are those of every SQL store (`sql/storage.ts`); the file, the connection and how
 * statements run on it, `sqlite/driver.ts`.
 *
 * Every operation is a few synchronous statements on the caller's thread (the message passing to
 * a thread of its own would cost more than the statement). A write that finds another process
 * writing does not wait on the thread: it is tried again after a pause, the event loop free
 * meanwhile, until `storage_timeout` (then a `StorageError` whose reason is `Timeout`);
 * writes hold the lock for a few statements only, and those that wait for it commit together, in
 * one `BEGIN IMMEDIATE` transaction (group commit), each in a savepoint of its own. Transactions
 * are `BEGIN IMMEDIATE`: atomic across processes.
 */
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { STORAGE_TIMEOUT_MS } from "../deadlines.ts"
import { scopedSqlite } from "./driver.ts"
import { makeSqlStorage } from "../sql/storage.ts"
import { Storage, type StorageError } from "../Storage.ts"
import type { StorageOptions } from "../tables.ts"

export interface SqliteOptions extends StorageOptions {
  /** The database file (`:memory:` for one connection's private database). */
  readonly path: string
  /** How long an operation may be retried while another process writes (ms; default `STORAGE_TIMEOUT_MS`). */
  readonly timeoutMs?: number | undefined
}

export const layerSqlite = (options: SqliteOptions): Layer.Layer<Storage, StorageError> =>
  Layer.effect(
    Storage,
    Effect.flatMap(scopedSqlite(options.path, options.timeoutMs ?? STORAGE_TIMEOUT_MS), ({ driver }) => makeSqlStorage(driver, options))
  )
