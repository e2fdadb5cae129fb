/**
 * The SQLite store's driver (`node:sqlite`, built into Node): how the SQL layer's operations
 * (`sql/driver.ts`) run on its connection (`sqlite/connection.ts`); its tables and rows are those
 * of every SQL store (`sql/tables.ts`).
 *
 * The file is opened in WAL mode with `synchronous=NORMAL`: readers never wait for the writer,
 * several processes on one host share it safely (each opens its own connection), a commit is one
 * append to the WAL (a power cut may lose the last commits, never corrupt the file). Writes that
 * are more than one statement run in `BEGIN IMMEDIATE` transactions (`immediate`), so a conditional
 * write is atomic across processes as on DynamoDB. Writes that find another process writing wait
 * together and commit together, each in a savepoint of its own (`sqlite/groupCommit.ts`).
 *
 * A statement that finds another process writing does not wait on this thread (SQLite's busy
 * handler sleeps in the thread, which here runs the event loop): `busy_timeout` is 0, the
 * operation (or the batch) fails with SQLITE_BUSY before it has changed anything, and runs again
 * after 1, 2, 4, 8, 16, 16, … ms, the event loop free meanwhile, until `storage_timeout`.
 * Checkpoints, which wait for the disk, run on a thread of their own (`sqlite/checkpointThread.ts`).
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
import { liveClock } from "../deadlines.ts"
import type { StorageError } from "../Storage.ts"
import type { Result, Sql, SqlDriver, Statement } from "../sql/driver.ts"
import { SQLITE } from "../sql/dialect.ts"
import { checkpointThread, openSqlite, type SqliteConnection } from "./connection.ts"
import { fullDiskLog, isBusy, isMissingTable, sqliteError } from "./errors.ts"
import { BUSY_PAUSE_MAX_MS, type GroupWrite, groupCommit } from "./groupCommit.ts"

/** Run one operation's statements; a failure is a `StorageError` naming the operation. */
export type RunSql = <A>(operation: string, body: () => A) => Effect.Effect<A, StorageError>

/**
 * The database at `path` (`openSqlite`) for as long as the scope, and how operations run on it:
 * one that finds another process writing runs again after a pause (1, 2, 4 … ms, at most
 * `BUSY_PAUSE_MAX_MS`, on the live clock), until it has tried for `timeoutMs` (on the monotonic
 * clock: a step of the wall clock moves no deadline); then it fails with reason `Timeout`.
 */
export const scopedSqlite = (
  path: string,
  timeoutMs: number
): Effect.Effect<{ readonly connection: SqliteConnection; readonly run: RunSql; readonly driver: SqlDriver }, StorageError, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.try({ try: () => openSqlite(path, timeoutMs), catch: (cause) => sqliteError(path, "open", cause, timeoutMs) }),
    (connection) => Effect.sync(() => connection.close())
  ).pipe(Effect.tap((connection) => path === ":memory:" ? Effect.void : checkpointThread(path, connection)), Effect.flatMap((connection) => {
    const full = fullDiskLog(path)
    const attempt = <A>(operation: string, body: () => A, deadline: number, pauseMs: number): Effect.Effect<A, StorageError> =>
      Effect.suspend(() => {
        try {
          return Effect.succeed(body())
        } catch (cause) {
          if (!isBusy(cause) || performance.now() >= deadline) return Effect.fail(sqliteError(path, operation, cause, timeoutMs))
          return Effect.sleep(pauseMs).pipe(
            Effect.provideService(Clock.Clock, liveClock),
            Effect.andThen(attempt(operation, body, deadline, Math.min(pauseMs * 2, BUSY_PAUSE_MAX_MS)))
          )
        }
      })
    const run: RunSql = (operation, body) => full.noted(Effect.suspend(() => attempt(operation, body, performance.now() + timeoutMs, 1)))
    return Effect.acquireRelease(Effect.sync(() => groupCommit(path, connection, timeoutMs)), (group) => Effect.sync(group.close)).pipe(
      Effect.map((group) => {
        const write: typeof group.write = (operation, body, transaction) => full.noted(group.write(operation, body, transaction))
        return { connection, run, driver: sqliteDriver(connection, run, write) }
      })
    )
  }))

// ── the driver ───────────────────────────────────────────────────────────────────────────────────

const NOTHING: Result = { rows: [], changes: 0 }

/** A statement that only reads (SQLite's reads here are all SELECTs). */
const reads = (step: Statement): boolean => /^\s*SELECT\b/i.test(step.sql)

/**
 * The SQL layer's operations on the connection, each statement run as it is yielded, synchronously:
 * no other operation's statement can come in between. An operation that writes (its first
 * statement not a SELECT, or a transaction) goes to the group commit (`sqlite/groupCommit.ts`); one that
 * starts with a read runs at once, each statement its own commit (`run`: run again from its start
 * if it found the database busy) — the reads, which WAL lets through while another process
 * writes, and the sweep, whose deletes commit batch by batch.
 */
const sqliteDriver = (connection: SqliteConnection, run: RunSql, write: GroupWrite): SqlDriver => {
  /**
   * Whether each statement is read to its end (a SELECT, a RETURNING clause; a PRAGMA, which may
   * take a step per page, as `incremental_vacuum` does) or run (one step, its changes counted).
   */
  const returning = new Map<string, boolean>()
  const execute = (step: Statement): Result => {
    try {
      const prepared = connection.statement(step.sql)
      let returnsRows = returning.get(step.sql)
      if (returnsRows === undefined) returning.set(step.sql, returnsRows = prepared.columns().length > 0 || step.sql.startsWith("PRAGMA"))
      if (!returnsRows) return { rows: [], changes: Number(prepared.run(...step.values).changes) }
      const rows = prepared.all(...step.values)
      return { rows, changes: rows.length }
    } catch (error) {
      if (step.ifTableExists === true && isMissingTable(error)) return NOTHING
      throw error
    }
  }
  const interpret = <A>(steps: Sql<A>): A => {
    let step = steps.next()
    while (step.done !== true) step = steps.next(execute(step.value))
    return step.value
  }
  return {
    dialect: SQLITE,
    run: (operation, body, transaction) => {
      if (transaction === true) return write(operation, () => interpret(body()), true)
      return Effect.suspend(() => {
        // The first statement says which way: the generator has run nothing against the database yet.
        const first = body().next()
        if (first.done === true) return Effect.succeed(first.value)
        return reads(first.value) ? run(operation, () => interpret(body())) : write(operation, () => interpret(body()), false)
      })
    },
    one: (operation, statement, answer) =>
      reads(statement) ? run(operation, () => answer(execute(statement))) : write(operation, () => answer(execute(statement)), false)
  }
}
