/**
 * What the SQL layer (`sql/storage.ts` and the files it assembles) asks of a database: run one
 * operation's statements, in a transaction or not. An operation is written once, as a generator
 * that yields its statements one by one and gets each one's result back (`Sql`); each store's
 * driver runs it its own way — SQLite's (`sqlite/driver.ts`) synchronously on the caller's thread,
 * PostgreSQL's (`postgres/layer.ts`) awaiting each statement on a pooled connection.
 */
import type * as Effect from "effect/Effect"
import type { SqlDialect } from "./dialect.ts"
import type { SqlValue } from "./tables.ts"
import type { StorageError } from "../Storage.ts"

export type Row = Readonly<Record<string, unknown>>

/** One statement: SQL with `$1`, `$2`, … placeholders, and their values. */
export interface Statement {
  readonly sql: string
  readonly values: ReadonlyArray<SqlValue>
  /** A missing table reads as no rows and changes nothing (the rows of a month's table already dropped). */
  readonly ifTableExists?: boolean
}

/** What a statement gave: its rows (a SELECT's, a RETURNING clause's) and how many rows it changed. */
export interface Result {
  readonly rows: ReadonlyArray<Row>
  readonly changes: number
}

/** An operation's statements: yields each, receives its `Result`, returns the operation's answer. */
export type Sql<A> = Generator<Statement, A, Result>

export const sql = (text: string, ...values: ReadonlyArray<SqlValue>): Statement => ({ sql: text, values })

export interface SqlDriver {
  readonly dialect: SqlDialect
  /**
   * Run an operation's statements (all in one transaction when `transaction`), the caller's
   * statements never interleaved with another operation's on the same connection; a failure is a
   * `StorageError` naming the operation.
   */
  readonly run: <A>(operation: string, body: () => Sql<A>, transaction?: boolean) => Effect.Effect<A, StorageError>
  /** An operation of one statement, its answer read from the statement's result (`run` without a generator's cost). */
  readonly one: <A>(operation: string, statement: Statement, answer: (result: Result) => A) => Effect.Effect<A, StorageError>
}

/** Whether a statement changed a row. */
export const changed = (result: Result): boolean => result.changes > 0
/** Whether a statement read a row. */
export const found = (result: Result): boolean => result.rows.length > 0
/** No answer: the statement is all. */
export const nothing = (_: Result): void => {}

/** `$from, $from+1, …`: `count` placeholders. */
export const placeholders = (count: number, from = 1): string => Array.from({ length: count }, (_, i) => `$${from + i}`).join(", ")

/** `column = $from, …`: an assignment per column. */
export const assignments = (columns: ReadonlyArray<string>, from = 1): string => columns.map((c, i) => `${c} = $${from + i}`).join(", ")

/** `column = excluded.column, …`: an upsert's update of every column given. */
export const fromExcluded = (columns: ReadonlyArray<string>): string => columns.map((c) => `${c} = excluded.${c}`).join(", ")
