/**
 * Group commit: a write runs at once, alone, while the database is free (its own commit: nothing
 * waits for a batch). One that finds another process holding the lock opens a batch: it and every
 * write that comes while the batch is open (the caller's next ones wait, the others' join) run in
 * one `BEGIN IMMEDIATE … COMMIT` when the lock is free — one round of the lock and one commit for
 * all of them, where each would otherwise wait, retry and take the lock on its own. The batch is
 * tried after 1, 2, 4 … ms (at most `BUSY_PAUSE_MAX_MS`); an operation still waiting at its own
 * deadline (`timeoutMs` after it came, on the monotonic clock: a step of the wall clock moves no
 * deadline) fails with reason `Timeout`; one whose fiber is interrupted before its batch runs is
 * taken out of it; `BATCH_MAX` at most commit together, the rest on the next turn of the event loop.
 *
 * In a batch each operation runs in a SAVEPOINT of its own: one that fails rolls back only its own
 * statements and its failure goes to its caller alone; the others commit. They run one after the
 * other, in the order they came, so a conditional write sees the writes before it as it would one
 * at a time. Each caller is answered after the commit: a read it issues next sees its write.
 */
import * as Effect from "effect/Effect"
import { StorageError, Timeout } from "../failures.ts"
import type { SqliteConnection } from "./connection.ts"
import { isBusy, sqliteError } from "./errors.ts"

/** The longest pause between two attempts of an operation that found the database locked (ms). */
export const BUSY_PAUSE_MAX_MS = 16

/**
 * The most operations one batch runs before it commits: ~50 µs each, so the write lock (and the
 * event loop) is held ~13 ms at most; operations past it go in the next batch, on the next turn.
 */
export const BATCH_MAX = 256

/** A write waiting for its batch: what it runs, until when it may wait for the lock (`performance.now()`), whom it answers. */
interface Pending {
  readonly operation: string
  readonly body: () => unknown
  readonly deadline: number
  readonly resume: (effect: Effect.Effect<unknown, StorageError>) => void
}

type Exit = { readonly ok: true; readonly value: unknown } | { readonly ok: false; readonly cause: unknown }

/**
 * What one attempt at a batch came to: committed (each operation answered), the lock held
 * elsewhere (none answered), or the transaction ended by SQLite under one operation (that one
 * answered, the `rest` to run again in a batch of their own).
 */
type Attempt =
  | { readonly outcome: "committed" }
  | { readonly outcome: "busy" }
  | { readonly outcome: "ended"; readonly rest: ReadonlyArray<Pending> }

const COMMITTED: Attempt = { outcome: "committed" }
const BUSY: Attempt = { outcome: "busy" }

/** One attempt at `batch` in one transaction, each operation in a savepoint of its own. */
const attemptBatch = (connection: SqliteConnection, batch: ReadonlyArray<Pending>, answer: (pending: Pending, exit: Exit) => void): Attempt => {
  const { db, statement } = connection
  const rollback = () => {
    if (db.isTransaction) statement("ROLLBACK").run()
  }
  try {
    statement("BEGIN IMMEDIATE").run()
  } catch (cause) {
    if (isBusy(cause)) return BUSY
    for (const pending of batch) answer(pending, { ok: false, cause })
    return COMMITTED
  }
  const exits: Array<Exit> = []
  for (let i = 0; i < batch.length; i++) {
    const pending = batch[i]!
    statement("SAVEPOINT operation").run()
    try {
      exits.push({ ok: true, value: pending.body() })
      statement("RELEASE operation").run()
    } catch (cause) {
      if (isBusy(cause) || !db.isTransaction) {
        rollback()
        if (isBusy(cause)) return BUSY
        // SQLite ended the transaction itself (a full disk, an I/O error): this operation
        // fails, the others run again in a batch of their own.
        answer(pending, { ok: false, cause })
        return { outcome: "ended", rest: [...batch.slice(0, i), ...batch.slice(i + 1)] }
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
    if (isBusy(cause)) return BUSY
    for (const pending of batch) answer(pending, { ok: false, cause })
    return COMMITTED
  }
  for (let i = 0; i < batch.length; i++) answer(batch[i]!, exits[i]!)
  return COMMITTED
}

/** The group commit of the database at `path` on `connection`: its writes, and what runs them as it closes. */
export const groupCommit = (path: string, connection: SqliteConnection, timeoutMs: number) => {
  let queue: Array<Pending> = []
  /** The open batch's next attempt: after a busy pause, or on the next turn (more than `BATCH_MAX` waited). */
  let next: ReturnType<typeof setImmediate> | ReturnType<typeof setTimeout> | undefined
  let pauseMs = 1

  const answer = (pending: Pending, exit: Exit) =>
    pending.resume(exit.ok ? Effect.succeed(exit.value) : Effect.fail(sqliteError(path, pending.operation, exit.cause, timeoutMs)))

  /** Another process held the lock until the operation's deadline. */
  const timedOut = (pending: Pending) => pending.resume(Effect.fail(new StorageError({ operation: pending.operation, reason: new Timeout({ timeoutMs }) })))

  const flush = () => {
    next = undefined
    if (queue.length === 0) return
    const batch = queue.splice(0, BATCH_MAX)
    const attempt = attemptBatch(connection, batch, answer)
    if (attempt.outcome !== "busy") {
      pauseMs = 1
      if (attempt.outcome === "ended") queue = [...attempt.rest, ...queue]
      if (queue.length > 0) next ??= setImmediate(flush)
      return
    }
    const now = performance.now()
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
        const pending: Pending = { operation, body, deadline: performance.now() + timeoutMs, resume: resume as Pending["resume"] }
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
    while (queue.length > 0 && connection.db.isOpen) {
      const batch = queue.splice(0, BATCH_MAX)
      const attempt = attemptBatch(connection, batch, answer)
      if (attempt.outcome === "busy") for (const pending of batch) timedOut(pending)
      if (attempt.outcome === "ended") queue = [...attempt.rest, ...queue]
    }
  }

  return { write, close }
}

export type GroupWrite = ReturnType<typeof groupCommit>["write"]
