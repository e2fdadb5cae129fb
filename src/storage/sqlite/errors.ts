/**
 * The SQLite store's failures: which SQLite errors are a lock held elsewhere, a full disk, a
 * missing table; how each becomes a `StorageError`; and the throttled log line of a full disk.
 */
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import { DiskFull, MissingTable, StorageError, Timeout, Unknown } from "../failures.ts"

export const isMissingTable = (cause: unknown): boolean => cause instanceof Error && cause.message.startsWith("no such table")

/** SQLITE_BUSY (5) or SQLITE_LOCKED (6), extended codes included: another connection holds the lock. */
export const isBusy = (cause: unknown): boolean => {
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
export const sqliteError = (path: string, operation: string, cause: unknown, timeoutMs: number): StorageError => {
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
export const fullDiskLog = (path: string) => {
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
