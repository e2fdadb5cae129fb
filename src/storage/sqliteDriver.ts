/**
 * The SQLite store's file, connection and driver (`node:sqlite`, built into Node): how the SQL
 * layer's operations (`sqlDriver.ts`) run on it; its tables and rows are those of every SQL store
 * (`sqlTables.ts`).
 *
 * The file is opened in WAL mode with `synchronous=NORMAL`: readers never wait for the writer,
 * several processes on one host share it safely (each opens its own connection), a commit is one
 * append to the WAL (a power cut may lose the last commits, never corrupt the file). Writes that
 * are more than one statement run in `BEGIN IMMEDIATE` transactions (`immediate`), so a conditional
 * write is atomic across processes as on DynamoDB.
 *
 * A statement that finds another process writing does not wait on this thread (SQLite's busy
 * handler sleeps in the thread, which here runs the event loop): `busy_timeout` is 0, the
 * operation fails with SQLITE_BUSY before it has changed anything, and `scopedSqlite` runs it
 * again after 1, 2, 4, 8, 16, 16, … ms, the event loop free meanwhile, until `storage_timeout`.
 * Checkpoints, which wait for the disk, run on a thread of their own (`sqliteCheckpointThread.ts`).
 *
 * Every operation is a few synchronous statements on the caller's thread: measured with
 * `npm run bench:sqlite` (2-core VM, WAL, synchronous=NORMAL, 3 KB rows), on the main thread an
 * insert takes ~48 µs and a 10-row read ~31 µs of CPU; through a worker thread owning the
 * database the same calls take ~106 / ~89 µs one at a time, ~56 µs each with 50 in flight, and
 * ~75 µs of CPU across both threads — the message passing costs more than the statement.
 */
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import type * as Scope from "effect/Scope"
import { mkdirSync } from "node:fs"
import { dirname } from "node:path"
import { DatabaseSync, type StatementSync } from "node:sqlite"
import { Worker } from "node:worker_threads"
import { liveClock, StorageTimeout } from "./dynamoRequests.ts"
import { StorageError } from "./Storage.ts"
import type { Result, Sql, SqlDriver, Statement } from "./sqlDriver.ts"
import { SQLITE } from "./sqlDialect.ts"

// ── the connection ───────────────────────────────────────────────────────────────────────────────

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

/** `$1` placeholders as SQLite's numbered `?1` (the same numbers; quoted identifiers left as they are). */
const numbered = (sql: string): string => sql.replace(/"(?:[^"]|"")*"|\$(\d+)/g, (match, n: string | undefined) => n === undefined ? match : `?${n}`)

/**
 * Open (creating it and its directory when missing) the database at `path`; opening may wait up to
 * `openTimeoutMs` for another process's write.
 */
const openSqlite = (path: string, openTimeoutMs: number): SqliteConnection => {
  if (path !== ":memory:") mkdirSync(dirname(path), { recursive: true })
  const db = new DatabaseSync(path, { timeout: openTimeoutMs })
  // On a new file only (before its first table): pages freed by dropping a month's table can be
  // given back to the file system (`PRAGMA incremental_vacuum`, after each drop).
  db.exec("PRAGMA auto_vacuum = INCREMENTAL")
  db.exec("PRAGMA journal_mode = WAL")
  db.exec("PRAGMA synchronous = NORMAL")
  db.exec("PRAGMA busy_timeout = 0")
  // Checkpoints run on a thread of their own (`sqliteCheckpointThread.ts`), not in the statement
  // that commits; a log past 64 MiB is cut back after one.
  db.exec("PRAGMA wal_autocheckpoint = 0")
  db.exec("PRAGMA journal_size_limit = 67108864")
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

/** Run one operation's statements; a failure is a `StorageError` naming the operation. */
export type RunSql = <A>(operation: string, body: () => A) => Effect.Effect<A, StorageError>

/** The longest pause between two attempts of an operation that found the database locked (ms). */
const BUSY_PAUSE_MAX_MS = 16

/**
 * The database at `path` (`openSqlite`) for as long as the scope, and how operations run on it:
 * one that finds another process writing runs again after a pause (1, 2, 4 … ms, at most
 * `BUSY_PAUSE_MAX_MS`, on the live clock), until it has tried for `timeoutMs`; then it fails with
 * a `StorageTimeout`.
 */
export const scopedSqlite = (
  path: string,
  timeoutMs: number
): Effect.Effect<{ readonly connection: SqliteConnection; readonly run: RunSql; readonly driver: SqlDriver }, StorageError, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.try({ try: () => openSqlite(path, timeoutMs), catch: (cause) => sqliteError("open", cause, timeoutMs) }),
    (connection) => Effect.sync(() => connection.close())
  ).pipe(Effect.tap((connection) => path === ":memory:" ? Effect.void : checkpointThread(path, connection)), Effect.map((connection) => {
    const attempt = <A>(operation: string, body: () => A, deadline: number, pauseMs: number): Effect.Effect<A, StorageError> =>
      Effect.suspend(() => {
        try {
          return Effect.succeed(body())
        } catch (cause) {
          if (!isBusy(cause) || Date.now() >= deadline) return Effect.fail(sqliteError(operation, cause, timeoutMs))
          return Effect.sleep(pauseMs).pipe(
            Effect.provideService(Clock.Clock, liveClock),
            Effect.andThen(attempt(operation, body, deadline, Math.min(pauseMs * 2, BUSY_PAUSE_MAX_MS)))
          )
        }
      })
    const run: RunSql = (operation, body) => Effect.suspend(() => attempt(operation, body, Date.now() + timeoutMs, 1))
    return { connection, run, driver: sqliteDriver(connection, run) }
  }))

// ── the driver ───────────────────────────────────────────────────────────────────────────────────

const NOTHING: Result = { rows: [], changes: 0 }

/**
 * The SQL layer's operations on the connection, each statement run as it is yielded, synchronously:
 * no other operation's statement can come in between, and an operation that found the database
 * busy runs again from its start (`run`).
 */
const sqliteDriver = (connection: SqliteConnection, run: RunSql): SqlDriver => {
  /**
   * Whether each statement is read to its end (a SELECT, a RETURNING clause; a PRAGMA, which may
   * take a step per page, as `incremental_vacuum` does) or run (one step, its changes counted).
   */
  const reads = new Map<string, boolean>()
  const execute = (step: Statement): Result => {
    try {
      const prepared = connection.statement(step.sql)
      let returnsRows = reads.get(step.sql)
      if (returnsRows === undefined) reads.set(step.sql, returnsRows = prepared.columns().length > 0 || step.sql.startsWith("PRAGMA"))
      if (!returnsRows) return { rows: [], changes: Number(prepared.run(...step.values).changes) }
      const rows = prepared.all(...step.values)
      return { rows, changes: rows.length }
    } catch (error) {
      if (step.ifTableExists === true && isMissingTable(error)) return NOTHING
      throw error
    }
  }
  const interpret = <A>(body: () => Sql<A>): A => {
    const steps = body()
    let step = steps.next()
    while (step.done !== true) step = steps.next(execute(step.value))
    return step.value
  }
  return {
    dialect: SQLITE,
    run: (operation, body, transaction) =>
      run(operation, transaction === true ? () => connection.immediate(() => interpret(body)) : () => interpret(body)),
    one: (operation, statement, answer) => run(operation, () => answer(execute(statement)))
  }
}

const isMissingTable = (cause: unknown): boolean => cause instanceof Error && cause.message.startsWith("no such table")

/**
 * The checkpoint thread of the database at `path`, for as long as the scope (a last checkpoint as
 * it ends). Should the thread fail, the connection checkpoints as SQLite does by default.
 */
const checkpointThread = (path: string, connection: SqliteConnection): Effect.Effect<void, never, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.sync(() => {
      const worker = new Worker(new URL("./sqliteCheckpointThread.ts", import.meta.url), { workerData: path })
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

/** SQLITE_BUSY (5) or SQLITE_LOCKED (6), extended codes included: another connection holds the lock. */
const isBusy = (cause: unknown): boolean => {
  const code = (cause as { readonly errcode?: unknown } | undefined)?.errcode
  return typeof code === "number" && ((code & 0xff) === 5 || (code & 0xff) === 6)
}

/**
 * An SQLite failure as a `StorageError`: a missing table's cause is named
 * `ResourceNotFoundException` (as DynamoDB's), the lock still held by another process after
 * `timeoutMs` of attempts is a `StorageTimeout`.
 */
const sqliteError = (operation: string, cause: unknown, timeoutMs: number): StorageError => {
  if (isMissingTable(cause)) {
    const message = cause instanceof Error ? cause.message : String(cause)
    return new StorageError({ operation, cause: Object.assign(new Error(message), { name: "ResourceNotFoundException" }) })
  }
  return new StorageError({ operation, cause: isBusy(cause) ? new StorageTimeout(timeoutMs) : cause })
}
