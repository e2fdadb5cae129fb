/**
 * The SQLite store's file, tables and rows (`node:sqlite`, built into Node): the same tables as on
 * DynamoDB (`model.ts`), one SQLite table each, columns named as the DynamoDB attributes — one table
 * per month too, so that rotation works as on DynamoDB (a month's table made ahead of its month,
 * listed, dropped at once when old) — and the broadcast set, an item of the router table there, in
 * a table of its own.
 *
 * - `{router}`: one row per user (its router record), `uaid` the key; `last_connect` indexed for
 *   the stale-user sweep.
 * - `{router}_broadcasts`: the broadcast set shared by every node, one row per broadcast id.
 * - `{router}_receipts`: push receipts, keyed by (`subscription`, `message`): a subscription's own
 *   row (`message` = `" "`, its `expiry`) and one status row per message sent with it.
 * - `{prefix}_{YYYY}_{MM}` (or `{prefix}` without rotation): a month's message table, keyed by
 *   (`uaid`, `chidmessageid`), the sort keys of `model.ts`: a user's channel rows (`00:{chid}`,
 *   no expiry) and its messages (`01:` topic, `02:` timestamp), each message with its `expiry`
 *   (seconds) — indexed, for the sweep that deletes expired rows.
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
 */
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import type * as Scope from "effect/Scope"
import { mkdirSync } from "node:fs"
import { dirname } from "node:path"
import { DatabaseSync, type SQLInputValue, type StatementSync } from "node:sqlite"
import { Worker } from "node:worker_threads"
import type { Notification } from "../domain/notification.ts"
import { liveClock, StorageTimeout } from "./dynamoRequests.ts"
import type { UserRecord } from "../domain/user.ts"
import { messageFields, messageFromFields, plainData, userFields, userFromFields } from "./model.ts"
import { StorageError } from "./Storage.ts"
import { isMessageTable, receiptTableName, type StorageOptions } from "./tables.ts"

/** The broadcast set's table: `{router}_broadcasts`. */
export const broadcastTableName = (options: StorageOptions): string => `${options.routerTable}_broadcasts`

/** A table name as an SQL identifier (double-quoted: any name is safe). */
export const ident = (name: string): string => `"${name.replaceAll("\"", "\"\"")}"`

export const routerTableSql = (table: string): ReadonlyArray<string> => [
  `CREATE TABLE IF NOT EXISTS ${ident(table)} (
    uaid TEXT PRIMARY KEY,
    connected_at INTEGER NOT NULL,
    router_type TEXT,
    router_data TEXT,
    node_id TEXT,
    last_connect INTEGER,
    current_month TEXT,
    record_version INTEGER,
    urgency TEXT
  )`,
  `CREATE INDEX IF NOT EXISTS ${ident(`${table}_last_connect`)} ON ${ident(table)} (last_connect) WHERE last_connect IS NOT NULL`
]

export const broadcastTableSql = (table: string): ReadonlyArray<string> => [
  `CREATE TABLE IF NOT EXISTS ${ident(table)} (id TEXT PRIMARY KEY, version TEXT NOT NULL)`
]

export const receiptTableSql = (table: string): ReadonlyArray<string> => [
  `CREATE TABLE IF NOT EXISTS ${ident(table)} (
    subscription TEXT NOT NULL,
    message TEXT NOT NULL,
    expiry INTEGER,
    accepted_at INTEGER,
    deadline INTEGER,
    stored_at INTEGER,
    delivered_at INTEGER,
    outcome TEXT,
    outcome_at INTEGER,
    code INTEGER,
    PRIMARY KEY (subscription, message)
  )`,
  `CREATE INDEX IF NOT EXISTS ${ident(`${table}_expiry`)} ON ${ident(table)} (expiry) WHERE expiry IS NOT NULL`
]

export const messageTableSql = (table: string): ReadonlyArray<string> => [
  `CREATE TABLE IF NOT EXISTS ${ident(table)} (
    uaid TEXT NOT NULL,
    chidmessageid TEXT NOT NULL,
    updateid TEXT,
    ttl INTEGER,
    timestamp INTEGER,
    expiry INTEGER,
    sortkey_timestamp INTEGER,
    urgency TEXT,
    receipt TEXT,
    data TEXT,
    headers TEXT,
    PRIMARY KEY (uaid, chidmessageid)
  )`,
  `CREATE INDEX IF NOT EXISTS ${ident(`${table}_expiry`)} ON ${ident(table)} (expiry) WHERE expiry IS NOT NULL`
]

/** The tables of the store that are not message tables: router, broadcasts, receipts. */
export const fixedTablesSql = (options: StorageOptions): ReadonlyArray<string> => [
  ...routerTableSql(options.routerTable),
  ...broadcastTableSql(broadcastTableName(options)),
  ...receiptTableSql(receiptTableName(options))
]

// ── the connection ───────────────────────────────────────────────────────────────────────────────

export interface SqliteConnection {
  readonly db: DatabaseSync
  /** A statement, prepared once per connection (a missing table makes preparing it fail). */
  readonly statement: (sql: string) => StatementSync
  /** Run `body` in a `BEGIN IMMEDIATE` transaction (the write lock taken first), committed unless it throws. */
  readonly immediate: <A>(body: () => A) => A
  readonly close: () => void
}

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
      prepared = db.prepare(sql)
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
): Effect.Effect<{ readonly connection: SqliteConnection; readonly run: RunSql }, StorageError, Scope.Scope> =>
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
    return { connection, run }
  }))

/** Delete every row a user has in one message table (none when the table is missing or not ours). */
export const deleteUserRows = (connection: SqliteConnection, options: StorageOptions, uaid: string, table: string | null | undefined) => {
  if (table === null || table === undefined || !isMessageTable(options, table)) return
  try {
    connection.statement(`DELETE FROM ${ident(table)} WHERE uaid = ?`).run(uaid)
  } catch (error) {
    if (!isMissingTable(error)) throw error
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

// ── router rows: one column per field of the record ───────────────────────────────────────────

export const userValue = (field: string, value: unknown): SQLInputValue =>
  value === undefined ? null : field === "routerData" ? JSON.stringify(plainData(value as Record<string, unknown>)) : value as SQLInputValue

export const userFromRow = (row: Record<string, SQLInputValue>): UserRecord => {
  const fields: Record<string, unknown> = {}
  for (const [field, column] of userFields) {
    const value = row[column]
    if (value !== null && value !== undefined) fields[field] = field === "routerData" ? JSON.parse(String(value)) : value
  }
  return userFromFields(String(row["uaid"]), fields)
}

export const USER_COLUMNS = userFields.map(([, column]) => column)

/** A record's row values: `uaid`, then `USER_COLUMNS` (absent fields NULL). */
export const userRow = (user: UserRecord): Array<SQLInputValue> => [user.uaid, ...userFields.map(([field]) => userValue(field, user[field]))]

// ── message rows ─────────────────────────────────────────────────────────────────────────────────

export const MESSAGE_COLUMNS = "uaid, chidmessageid, updateid, ttl, timestamp, expiry, sortkey_timestamp, urgency, receipt, data, headers"

/** A message's row values, in `MESSAGE_COLUMNS` order (absent fields NULL). */
export const messageValues = (uaid: string, n: Notification): Array<SQLInputValue> => {
  const f = messageFields(n)
  return [
    uaid,
    f.chidmessageid,
    f.updateid,
    f.ttl,
    f.timestamp,
    f.expiry,
    f.sortkey_timestamp ?? null,
    f.urgency ?? null,
    f.receipt ?? null,
    f.data ?? null,
    f.headers !== undefined ? JSON.stringify(f.headers) : null
  ]
}

export interface MessageRow {
  readonly chidmessageid: string
  readonly updateid: string | null
  readonly ttl: number | null
  readonly timestamp: number | null
  readonly expiry: number | null
  readonly sortkey_timestamp: number | null
  readonly urgency: string | null
  readonly receipt: string | null
  readonly data: string | null
  readonly headers: string | null
}

/** A message as it reads back (`messageFromFields`); undefined for rows that are not messages. */
export const messageFromRow = (row: MessageRow): Notification | undefined =>
  messageFromFields({
    chidmessageid: row.chidmessageid,
    updateid: row.updateid ?? undefined,
    ttl: row.ttl ?? undefined,
    timestamp: row.timestamp ?? undefined,
    sortkey_timestamp: row.sortkey_timestamp ?? undefined,
    urgency: row.urgency ?? undefined,
    receipt: row.receipt ?? undefined,
    data: row.data ?? undefined,
    headers: row.headers !== null ? JSON.parse(row.headers) as Record<string, string> : undefined
  })
