/**
 * The PostgreSQL store's connections: one bounded pool per process (`pg`, node-postgres), and how
 * an operation runs on it. An operation takes a connection from the pool, runs its statements
 * and gives it back; a connection that failed (the server went away) is closed instead, and the
 * pool opens a new one for a later operation — so nodes carry on by themselves once the server
 * is back. An operation as a whole, waiting for a connection included, has the deadline
 * `storage_timeout` (`withOperationDeadlines`: past it, reason `Timeout`), and so has every
 * statement on the server (`statement_timeout`).
 *
 * A failure's reason is read from its SQLSTATE code only (never the message text), `postgresReason`:
 * a missing table (42P01) is `MissingTable`, a statement cancelled by `statement_timeout` (57014)
 * `Timeout`, a failed connection (no SQLSTATE, class 08, 57P) `Unavailable`, ….
 */
import * as Effect from "effect/Effect"
import type * as Scope from "effect/Scope"
import pg from "pg"
import {
  Contention,
  Denied,
  DiskFull,
  failureText,
  Invalid,
  MissingTable,
  StorageError,
  type StorageFailure,
  Throttled,
  Timeout,
  Unavailable,
  Unknown
} from "../failures.ts"

/** One statement on the operation's connection: its rows and how many rows it changed. */
export type Query = (sql: string, values?: ReadonlyArray<unknown>) => Promise<{ readonly rows: ReadonlyArray<Record<string, unknown>>; readonly rowCount: number }>

/** Run one operation's statements on a connection of the pool; a failure is a `StorageError` naming the operation. */
export type RunPostgres = <A>(operation: string, body: (query: Query) => Promise<A>) => Effect.Effect<A, StorageError>

export interface PostgresConnection {
  readonly run: RunPostgres
  /** Run `body` in one transaction: committed when it returns, rolled back when it throws. */
  readonly transaction: <A>(query: Query, body: () => Promise<A>) => Promise<A>
}

/** Default connections per process. */
export const POSTGRES_POOL_SIZE = 10
/** How much longer than an operation's deadline a wait for a connection or an answer may take on the client (ms). */
const CLIENT_MARGIN_MS = 500
/** How long a connection may stay idle in the pool before it is closed (ms). */
const IDLE_MS = 30_000

/** The SQLSTATE code of a server error; undefined for anything else (a refused or dropped connection). */
export const sqlState = (cause: unknown): string | undefined => {
  const code = (cause as { readonly code?: unknown } | undefined)?.code
  return typeof code === "string" && /^[0-9A-Z]{5}$/.test(code) ? code : undefined
}

/** undefined_table */
export const UNDEFINED_TABLE = "42P01"
/** query_canceled: statement_timeout */
const QUERY_CANCELED = "57014"

/**
 * Whether a connection that saw `cause` can serve another operation: yes after an error of a
 * statement (the server answered); no when the connection itself failed (no SQLSTATE, class 08
 * connection exception, class 57P operator intervention: the server shut down).
 */
const connectionIsSound = (cause: unknown): boolean => {
  const state = sqlState(cause)
  return state !== undefined && !state.startsWith("08") && !state.startsWith("57P")
}

/** Why a statement or connection failed, by SQLSTATE (its class, the first two characters, for most). */
const postgresReason = (cause: unknown, timeoutMs: number): StorageFailure => {
  const state = sqlState(cause)
  if (state === undefined || !connectionIsSound(cause)) return new Unavailable()
  if (state === UNDEFINED_TABLE) return new MissingTable({})
  if (state === QUERY_CANCELED) return new Timeout({ timeoutMs })
  if (state === "53100") return new DiskFull({ database: "the PostgreSQL database" })
  if (state === "53300" || state === "53400") return new Throttled()
  if (state === "40001" || state === "40P01" || state === "55P03") return new Contention()
  const stateClass = state.slice(0, 2)
  if (stateClass === "28" || state === "42501") return new Denied()
  if (stateClass === "22" || stateClass === "23" || stateClass === "42") return new Invalid()
  return stateClass === "53" ? new Unavailable() : new Unknown()
}

/** A PostgreSQL failure as a `StorageError` (see the header), the server's error kept as its cause. */
export const postgresError = (operation: string, cause: unknown, timeoutMs: number): StorageError =>
  new StorageError({ operation, reason: postgresReason(cause, timeoutMs), cause })

/** BIGINT columns (ms since 1970, counts) read as numbers: all are below 2^53. */
const INT8_OID = 20
const typeParser = ((oid: number, format?: string) =>
  oid === INT8_OID ? (value: string) => Number(value) : pg.types.getTypeParser(oid, format as "text")) as typeof pg.types.getTypeParser

const ignore = () => {}

/**
 * A pool of at most `poolSize` connections to `dsn` for as long as the scope, checked with one
 * statement first (a wrong password, a database that does not exist or a server that cannot be
 * reached fails here, operation `connect`), and how operations run on it.
 */
export const scopedPostgres = (
  dsn: string,
  options: { readonly poolSize: number; readonly timeoutMs: number }
): Effect.Effect<PostgresConnection, StorageError, Scope.Scope> =>
  Effect.gen(function*() {
    const { timeoutMs } = options
    const pool = yield* Effect.acquireRelease(
      Effect.sync(() => {
        const pool = new pg.Pool({
          connectionString: dsn,
          max: options.poolSize,
          // A little past the operation's deadline, which comes first and fails the operation with a
          // reason Timeout; this bounds a wait for a connection outside an operation (the check at
          // start, the sweep) and ends a connection attempt that never completes.
          connectionTimeoutMillis: timeoutMs + CLIENT_MARGIN_MS,
          idleTimeoutMillis: IDLE_MS,
          statement_timeout: timeoutMs,
          // A statement the server never answers (it stopped answering, the network dropped the
          // connection silently) fails on the client too, and its connection is closed
          // (`connectionIsSound`): the bound of the operations without a deadline (creating
          // tables, the sweep).
          query_timeout: timeoutMs + CLIENT_MARGIN_MS,
          application_name: "autopush",
          types: { getTypeParser: typeParser }
        })
        // An idle connection the server closed (a restart, a failover): the pool drops it.
        pool.on("error", ignore)
        return pool
      }),
      // Closing waits for the connections in use to come back, for as long as a statement may
      // take: a server that stopped answering does not hold the process's stop.
      (pool) =>
        Effect.promise(() =>
          Promise.race([pool.end().catch(ignore), new Promise<void>((resolve) => setTimeout(resolve, timeoutMs).unref())])
        )
    )

    const withConnection = async <A>(body: (query: Query) => Promise<A>): Promise<A> => {
      const client = await pool.connect()
      // The server may close the connection between two statements of this operation: the next
      // statement fails, and the connection is closed rather than given back.
      client.on("error", ignore)
      const query: Query = async (sql, values) => {
        const result = await client.query(sql, values as Array<unknown> | undefined)
        return { rows: result.rows, rowCount: result.rowCount ?? 0 }
      }
      try {
        const result = await body(query)
        client.off("error", ignore)
        client.release()
        return result
      } catch (error) {
        client.off("error", ignore)
        client.release(connectionIsSound(error) ? undefined : true)
        throw error
      }
    }

    const run: RunPostgres = (operation, body) =>
      Effect.tryPromise({ try: () => withConnection(body), catch: (cause) => postgresError(operation, cause, timeoutMs) })

    const transaction = async <A>(query: Query, body: () => Promise<A>): Promise<A> => {
      await query("BEGIN")
      try {
        const result = await body()
        await query("COMMIT")
        return result
      } catch (error) {
        await query("ROLLBACK").catch(ignore)
        throw error
      }
    }

    yield* run("connect", (query) => query("SELECT 1"))
    return { run, transaction }
  })

/** What an operator reads of a failure to reach PostgreSQL at start: what is wrong, then the cause. */
const CONNECT_HINTS: ReadonlyArray<readonly [(code: string) => boolean, string]> = [
  [(code) => code === "28P01" || code === "28000", "the server refused the user name or password"],
  [(code) => code === "3D000", "no such database"],
  [(code) => code === "ECONNREFUSED" || code === "ENOTFOUND" || code === "EAI_AGAIN" || code === "EHOSTUNREACH", "the server cannot be reached"]
]

/** A start-up failure of the PostgreSQL store as one line (a hint by SQLSTATE or system error code, then the cause). */
export const postgresFailure = (error: StorageError): string => {
  const code = (error.cause as { readonly code?: unknown } | undefined)?.code
  const hint = typeof code === "string" ? CONNECT_HINTS.find(([matches]) => matches(code))?.[1] : undefined
  const state = sqlState(error.cause)
  const cause = state !== undefined && error.cause instanceof Error ? `${error.cause.message} (SQLSTATE ${state})` : failureText(error)
  return hint === undefined ? cause : `${hint}: ${cause}`
}
