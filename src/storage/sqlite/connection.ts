/**
 * The SQLite store's file and its connection: how the file is opened (its mode, WAL, the pragmas),
 * statements prepared once per connection, `BEGIN IMMEDIATE` transactions, and the thread that
 * checkpoints the file's log (`sqlite/checkpointThread.ts`).
 */
import * as Effect from "effect/Effect"
import type * as Scope from "effect/Scope"
import { closeSync, mkdirSync, openSync } from "node:fs"
import { dirname } from "node:path"
import { DatabaseSync, type StatementSync } from "node:sqlite"
import { Worker } from "node:worker_threads"

export interface SqliteConnection {
  readonly db: DatabaseSync
  /**
   * A statement, prepared once per connection (a missing table makes preparing it fail); `$1`
   * placeholders are read as SQLite's `?1`.
   */
  readonly statement: (sql: string) => StatementSync
  /** Run `body` in a `BEGIN IMMEDIATE` transaction (the write lock taken first), committed unless it throws. */
  readonly immediate: <A>(body: () => A) => A
  readonly close: () => void
}

/**
 * The write-ahead log's bound: the writers cut its file back to it (`journal_size_limit`) and the
 * checkpoint thread restarts a log grown past it.
 */
const WAL_BOUND_BYTES = 64 * 1024 * 1024

/**
 * The page size of a new file (an existing file keeps its own). A commit writes every page it
 * changed to the log whole, and a stored push changes about seven (its row's page and that page's
 * parent, its entries in the primary key, expiry and live-row indexes, the header, a pointer-map
 * page): at 1 KiB a stored 2 KB push appends ~11 KiB of log, at SQLite's default 4 KiB ~32 KiB. A
 * message row (its body in base64, ~2.8 KB for 2 KB) also fills its pages closer: a 4 KiB page
 * holds one such row and leaves the rest empty (`npm run bench:sqlite-space`).
 */
const PAGE_BYTES = 1024

/** `$1` placeholders as SQLite's numbered `?1` (the same numbers; quoted identifiers left as they are). */
const numbered = (sql: string): string => sql.replace(/"(?:[^"]|"")*"|\$(\d+)/g, (match, n: string | undefined) => n === undefined ? match : `?${n}`)

/**
 * Open (creating it and its directory when missing) the database at `path`; opening may wait up to
 * `openTimeoutMs` for another process's write. A new file is mode 0600, in a new directory of mode
 * 0700: it holds every client's uaid, which is all a client needs to say hello as that client.
 * SQLite gives its -wal, -shm and -journal files the database file's mode.
 */
export const openSqlite = (path: string, openTimeoutMs: number): SqliteConnection => {
  if (path !== ":memory:") {
    mkdirSync(dirname(path), { recursive: true, mode: 0o700 })
    // "a": made if missing, never truncated (another process may have made it meanwhile).
    closeSync(openSync(path, "a", 0o600))
  }
  const db = new DatabaseSync(path, { timeout: openTimeoutMs })
  // On a new file only (before its first table): pages of `PAGE_BYTES`, and pages freed by dropping
  // a month's table can be given back to the file system (`PRAGMA incremental_vacuum`, after each drop).
  db.exec(`PRAGMA page_size = ${PAGE_BYTES}`)
  db.exec("PRAGMA auto_vacuum = INCREMENTAL")
  db.exec("PRAGMA journal_mode = WAL")
  db.exec("PRAGMA synchronous = NORMAL")
  db.exec("PRAGMA busy_timeout = 0")
  // Checkpoints run on a thread of their own (`sqlite/checkpointThread.ts`), not in the statement
  // that commits; a log past 64 MiB is cut back after one.
  db.exec("PRAGMA wal_autocheckpoint = 0")
  db.exec(`PRAGMA journal_size_limit = ${WAL_BOUND_BYTES}`)
  const statements = new Map<string, StatementSync>()
  const statement = (sql: string) => {
    let prepared = statements.get(sql)
    if (prepared === undefined) {
      prepared = db.prepare(numbered(sql))
      statements.set(sql, prepared)
    }
    return prepared
  }
  const immediate = <A>(body: () => A): A => {
    db.exec("BEGIN IMMEDIATE")
    try {
      const result = body()
      db.exec("COMMIT")
      return result
    } catch (error) {
      if (db.isTransaction) db.exec("ROLLBACK")
      throw error
    }
  }
  return { db, statement, immediate, close: () => db.close() }
}

/**
 * The checkpoint thread of the database at `path`, for as long as the scope (a last checkpoint as
 * it ends). Should the thread fail, the connection checkpoints as SQLite does by default.
 */
export const checkpointThread = (path: string, connection: SqliteConnection): Effect.Effect<void, never, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.sync(() => {
      const worker = new Worker(new URL("./checkpointThread.ts", import.meta.url), { workerData: { path, walBoundBytes: WAL_BOUND_BYTES } })
      worker.unref()
      worker.on("error", () => {
        if (connection.db.isOpen) connection.db.exec("PRAGMA wal_autocheckpoint = 1000")
      })
      return worker
    }),
    (worker) =>
      Effect.callback<void>((resume) => {
        const timer = setTimeout(() => void worker.terminate(), 5_000)
        worker.once("exit", () => {
          clearTimeout(timer)
          resume(Effect.void)
        })
        worker.postMessage("close")
      })
  ).pipe(Effect.asVoid)
