/**
 * The SQLite store's file, connection and driver (`node:sqlite`, built into Node): how the SQL
 * layer's operations (`sql/driver.ts`) run on it; its tables and rows are those of every SQL store
 * (`sql/tables.ts`).
 *
 * The file is opened in WAL mode with `synchronous=NORMAL`: readers never wait for the writer,
 * several processes on one host share it safely (each opens its own connection), a commit is one
 * append to the WAL (a power cut may lose the last commits, never corrupt the file). Writes that
 * are more than one statement run in `BEGIN IMMEDIATE` transactions (`immediate`), so a conditional
 * write is atomic across processes as on DynamoDB. Writes that find another process writing wait
 * together and commit together, each in a savepoint of its own (`groupCommit`).
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
import { closeSync, mkdirSync, openSync } from "node:fs"
import { dirname } from "node:path"
import { DatabaseSync, type StatementSync } from "node:sqlite"
import { Worker } from "node:worker_threads"
import { liveClock } from "../deadlines.ts"
import { DiskFull, MissingTable, StorageError, Timeout, Unknown } from "../failures.ts"
import type { Result, Sql, SqlDriver, Statement } from "../sql/driver.ts"
import { SQLITE } from "../sql/dialect.ts"

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

/**
 * The write-ahead log's bound: the writers cut its file back to it (`journal_size_limit`) and the
 * checkpoint thread restarts a log grown past it.
 */
const WAL_BOUND_BYTES = 64 * 1024 * 1024

/** `$1` placeholders as SQLite's numbered `?1` (the same numbers; quoted identifiers left as they are). */
const numbered = (sql: string): string => sql.replace(/"(?:[^"]|"")*"|\$(\d+)/g, (match, n: string | undefined) => n === undefined ? match : `?${n}`)

/**
 * Open (creating it and its directory when missing) the database at `path`; opening may wait up to
 * `openTimeoutMs` for another process's write. A new file is mode 0600, in a new directory of mode
 * 0700: it holds every client's uaid, which is all a client needs to say hello as that client.
 * SQLite gives its -wal, -shm and -journal files the database file's mode.
 */
const openSqlite = (path: string, openTimeoutMs: number): SqliteConnection => {
  if (path !== ":memory:") {
    mkdirSync(dirname(path), { recursive: true, mode: 0o700 })
    // "a": made if missing, never truncated (another process may have made it meanwhile).
    closeSync(openSync(path, "a", 0o600))
  }
  const db = new DatabaseSync(path, { timeout: openTimeoutMs })
  // On a new file only (before its first table): pages freed by dropping a month's table can be
  // given back to the file system (`PRAGMA incremental_vacuum`, after each drop).
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

/** Run one operation's statements; a failure is a `StorageError` naming the operation. */
export type RunSql = <A>(operation: string, body: () => A) => Effect.Effect<A, StorageError>

/** The longest pause between two attempts of an operation that found the database locked (ms). */
const BUSY_PAUSE_MAX_MS = 16

/**
 * The database at `path` (`openSqlite`) for as long as the scope, and how operations run on it:
 * one that finds another process writing runs again after a pause (1, 2, 4 … ms, at most
 * `BUSY_PAUSE_MAX_MS`, on the live clock), until it has tried for `timeoutMs`; then it fails with
 * reason `Timeout`.
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
          if (!isBusy(cause) || Date.now() >= deadline) return Effect.fail(sqliteError(path, operation, cause, timeoutMs))
          return Effect.sleep(pauseMs).pipe(
            Effect.provideService(Clock.Clock, liveClock),
            Effect.andThen(attempt(operation, body, deadline, Math.min(pauseMs * 2, BUSY_PAUSE_MAX_MS)))
          )
        }
      })
    const run: RunSql = (operation, body) => full.noted(Effect.suspend(() => attempt(operation, body, Date.now() + timeoutMs, 1)))
    return Effect.acquireRelease(Effect.sync(() => groupCommit(path, connection, timeoutMs)), (group) => Effect.sync(group.close)).pipe(
      Effect.map((group) => {
        const write: typeof group.write = (operation, body, transaction) => full.noted(group.write(operation, body, transaction))
        return { connection, run, driver: sqliteDriver(connection, run, write) }
      })
    )
  }))

// ── group commit ─────────────────────────────────────────────────────────────────────────────────

/**
 * The most operations one batch runs before it commits: ~50 µs each, so the write lock (and the
 * event loop) is held ~13 ms at most; operations past it go in the next batch, on the next turn.
 */
export const BATCH_MAX = 256

/** A write waiting for its batch: what it runs, until when it may wait for the lock, whom it answers. */
interface Pending {
  readonly operation: string
  readonly body: () => unknown
  readonly deadline: number
  readonly resume: (effect: Effect.Effect<unknown, StorageError>) => void
}

/** What one attempt at a batch came to: committed (each operation answered), or the lock held elsewhere. */
type Attempt = "committed" | "busy"

/**
 * Group commit: a write runs at once, alone, while the database is free (its own commit: nothing
 * waits for a batch). One that finds another process holding the lock opens a batch: it and every
 * write that comes while the batch is open (the caller's next ones wait, the others' join) run in
 * one `BEGIN IMMEDIATE … COMMIT` when the lock is free — one round of the lock and one commit for
 * all of them, where each would otherwise wait, retry and take the lock on its own. The batch is
 * tried after 1, 2, 4 … ms (at most `BUSY_PAUSE_MAX_MS`); an operation still waiting at its own
 * deadline (`timeoutMs` after it came) fails with reason `Timeout`; one whose fiber is
 * interrupted before its batch runs is taken out of it; `BATCH_MAX` at most commit together, the
 * rest on the next turn of the event loop.
 *
 * In a batch each operation runs in a SAVEPOINT of its own: one that fails rolls back only its own
 * statements and its failure goes to its caller alone; the others commit. They run one after the
 * other, in the order they came, so a conditional write sees the writes before it as it would one
 * at a time. Each caller is answered after the commit: a read it issues next sees its write.
 */
const groupCommit = (path: string, connection: SqliteConnection, timeoutMs: number) => {
  const { db, statement } = connection
  let queue: Array<Pending> = []
  /** The open batch's next attempt: after a busy pause, or on the next turn (more than `BATCH_MAX` waited). */
  let next: ReturnType<typeof setImmediate> | ReturnType<typeof setTimeout> | undefined
  let pauseMs = 1

  const answer = (pending: Pending, exit: { readonly ok: true; readonly value: unknown } | { readonly ok: false; readonly cause: unknown }) =>
    pending.resume(exit.ok ? Effect.succeed(exit.value) : Effect.fail(sqliteError(path, pending.operation, exit.cause, timeoutMs)))

  /** Another process held the lock until the operation's deadline. */
  const timedOut = (pending: Pending) => pending.resume(Effect.fail(new StorageError({ operation: pending.operation, reason: new Timeout({ timeoutMs }) })))

  const rollback = () => {
    if (db.isTransaction) statement("ROLLBACK").run()
  }

  /** One attempt at `batch`: every operation answered, or none (the lock was held elsewhere). */
  const attempt = (batch: ReadonlyArray<Pending>): Attempt => {
    try {
      statement("BEGIN IMMEDIATE").run()
    } catch (cause) {
      if (isBusy(cause)) return "busy"
      for (const pending of batch) answer(pending, { ok: false, cause })
      return "committed"
    }
    const exits: Array<{ readonly ok: true; readonly value: unknown } | { readonly ok: false; readonly cause: unknown }> = []
    for (let i = 0; i < batch.length; i++) {
      const pending = batch[i]!
      statement("SAVEPOINT operation").run()
      try {
        exits.push({ ok: true, value: pending.body() })
        statement("RELEASE operation").run()
      } catch (cause) {
        if (isBusy(cause) || !db.isTransaction) {
          rollback()
          if (isBusy(cause)) return "busy"
          // SQLite ended the transaction itself (a full disk, an I/O error): this operation
          // fails, the others run again in a batch of their own.
          answer(pending, { ok: false, cause })
          queue = [...batch.slice(0, i), ...batch.slice(i + 1), ...queue]
          next ??= setImmediate(flush)
          return "committed"
        }
        statement("ROLLBACK TO operation").run()
        statement("RELEASE operation").run()
        exits.push({ ok: false, cause })
      }
    }
    try {
      statement("COMMIT").run()
    } catch (cause) {
      rollback()
      if (isBusy(cause)) return "busy"
      for (const pending of batch) answer(pending, { ok: false, cause })
      return "committed"
    }
    for (let i = 0; i < batch.length; i++) answer(batch[i]!, exits[i]!)
    return "committed"
  }

  const flush = () => {
    next = undefined
    if (queue.length === 0) return
    const batch = queue.splice(0, BATCH_MAX)
    if (attempt(batch) === "committed") {
      pauseMs = 1
      if (queue.length > 0) next ??= setImmediate(flush)
      return
    }
    const now = Date.now()
    const waiting = batch.filter((pending) => {
      if (now < pending.deadline) return true
      timedOut(pending)
      return false
    })
    queue = [...waiting, ...queue]
    if (queue.length > 0) retryLater()
  }

  /** The batch's next attempt after a pause, each pause twice the last (at most `BUSY_PAUSE_MAX_MS`). */
  const retryLater = () => {
    next ??= setTimeout(flush, pauseMs)
    pauseMs = Math.min(pauseMs * 2, BUSY_PAUSE_MAX_MS)
  }

  /**
   * Run `body` (its statements; in a transaction of its own when `transaction` and alone): at once
   * while no batch is open and the database is free, else in the open batch.
   */
  const write = <A>(operation: string, body: () => A, transaction: boolean): Effect.Effect<A, StorageError> =>
    Effect.suspend(() => {
      if (next === undefined && queue.length === 0) {
        try {
          return Effect.succeed(transaction ? connection.immediate(body) : body())
        } catch (cause) {
          if (!isBusy(cause)) return Effect.fail(sqliteError(path, operation, cause, timeoutMs))
          pauseMs = 1
        }
      }
      return Effect.callback<A, StorageError>((resume, _signal) => {
        const pending: Pending = { operation, body, deadline: Date.now() + timeoutMs, resume: resume as Pending["resume"] }
        queue.push(pending)
        if (next === undefined) retryLater()
        return Effect.sync(() => {
          const at = queue.indexOf(pending)
          if (at >= 0) queue.splice(at, 1)
        })
      })
    })

  /** The writes still waiting run now (the connection is about to close). */
  const close = () => {
    if (next !== undefined) {
      clearTimeout(next as ReturnType<typeof setTimeout>)
      clearImmediate(next as ReturnType<typeof setImmediate>)
    }
    next = undefined
    while (queue.length > 0 && db.isOpen) {
      const batch = queue.splice(0, BATCH_MAX)
      if (attempt(batch) === "busy") {
        for (const pending of batch) timedOut(pending)
      }
    }
  }

  return { write, close }
}

// ── the driver ───────────────────────────────────────────────────────────────────────────────────

const NOTHING: Result = { rows: [], changes: 0 }

/** A statement that only reads (SQLite's reads here are all SELECTs). */
const reads = (step: Statement): boolean => /^\s*SELECT\b/i.test(step.sql)

/**
 * The SQL layer's operations on the connection, each statement run as it is yielded, synchronously:
 * no other operation's statement can come in between. An operation that writes (its first
 * statement not a SELECT, or a transaction) goes to the group commit (`groupCommit`); one that
 * starts with a read runs at once, each statement its own commit (`run`: run again from its start
 * if it found the database busy) — the reads, which WAL lets through while another process
 * writes, and the sweep, whose deletes commit batch by batch.
 */
const sqliteDriver = (connection: SqliteConnection, run: RunSql, write: ReturnType<typeof groupCommit>["write"]): SqlDriver => {
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

const isMissingTable = (cause: unknown): boolean => cause instanceof Error && cause.message.startsWith("no such table")

/**
 * The checkpoint thread of the database at `path`, for as long as the scope (a last checkpoint as
 * it ends). Should the thread fail, the connection checkpoints as SQLite does by default.
 */
const checkpointThread = (path: string, connection: SqliteConnection): Effect.Effect<void, never, Scope.Scope> =>
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

/** SQLITE_BUSY (5) or SQLITE_LOCKED (6), extended codes included: another connection holds the lock. */
const isBusy = (cause: unknown): boolean => {
  const code = (cause as { readonly errcode?: unknown } | undefined)?.errcode
  return typeof code === "number" && ((code & 0xff) === 5 || (code & 0xff) === 6)
}

/** SQLITE_FULL (13): the database cannot grow, its disk is full (or it reached `max_page_count`). */
const isFull = (cause: unknown): boolean => {
  const code = (cause as { readonly errcode?: unknown } | undefined)?.errcode
  return typeof code === "number" && (code & 0xff) === 13
}

/**
 * An SQLite failure of the database at `path` as a `StorageError`, SQLite's error kept as its cause:
 * a missing table is `MissingTable`, the lock still held by another process after `timeoutMs` of
 * attempts `Timeout`, a full disk `DiskFull`.
 */
const sqliteError = (path: string, operation: string, cause: unknown, timeoutMs: number): StorageError => {
  const reason = isMissingTable(cause)
    ? new MissingTable({})
    : isBusy(cause)
    ? new Timeout({ timeoutMs })
    : isFull(cause)
    ? new DiskFull({ database: path })
    : new Unknown()
  return new StorageError({ operation, reason, cause })
}

/** A full disk is said at most this often: one line, with the operations it refused since the line before. */
export const FULL_DISK_LINE_EVERY_MS = 60_000

/**
 * The log of the database's full disk: its first refused operation is said at once, the next ones
 * counted and said with the next line, at most one every `FULL_DISK_LINE_EVERY_MS` (by the Clock):
 * every request refused for it would otherwise be a line of its own.
 */
const fullDiskLog = (path: string) => {
  let lastLineAt: number | undefined
  let refused = 0
  const note = Effect.flatMap(Clock.currentTimeMillis, (now) => {
    refused++
    if (lastLineAt !== undefined && now - lastLineAt < FULL_DISK_LINE_EVERY_MS) return Effect.void
    const count = refused
    refused = 0
    lastLineAt = now
    return Effect.logError(
      `the disk holding ${path} is full: ${count} storage operation${count === 1 ? "" : "s"} refused since the last line ` +
        `(one a minute at most), answered 503 to their senders; free space on that disk (option data_dir)`
    ).pipe(Effect.annotateLogs({ database: path, refused: count }))
  })
  /** `effect`, its failure for a full disk noted. */
  const noted = <A>(effect: Effect.Effect<A, StorageError>): Effect.Effect<A, StorageError> =>
    Effect.tapError(effect, (error) => error.reason._tag === "DiskFull" ? note : Effect.void)
  return { noted }
}
