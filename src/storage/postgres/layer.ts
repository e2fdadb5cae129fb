/**
 * Storage on PostgreSQL (`db_dsn`): the store of fleets without AWS, shared by every node. The
 * operations are those of every SQL store (`sql/storage.ts`: one message table per month, as on
 * SQLite and DynamoDB); the pool, its errors and how a connection that failed is replaced,
 * `postgres/pool.ts`; here, how the SQL layer's operations run on a connection of the pool, and the
 * deadline of each (`storage_timeout`, waiting for a connection included).
 */
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { STORAGE_TIMEOUT_MS, withOperationDeadlines } from "../deadlines.ts"
import { type PostgresConnection, POSTGRES_POOL_SIZE, type Query, scopedPostgres, sqlState, UNDEFINED_TABLE } from "./pool.ts"
import { POSTGRES } from "../sql/dialect.ts"
import type { Result, Sql, SqlDriver, Statement } from "../sql/driver.ts"
import { makeSqlStorage } from "../sql/storage.ts"
import { Storage, type StorageError } from "../Storage.ts"
import type { StorageOptions } from "../tables.ts"

export interface PostgresOptions extends StorageOptions {
  /** `postgres://user:password@host:port/database` (libpq's URL form, with its query parameters: `sslmode`, …). */
  readonly dsn: string
  /** Connections of this process at most (default `POSTGRES_POOL_SIZE`). */
  readonly poolSize?: number | undefined
  /** Deadline of one operation, waiting for a connection included (ms; default `STORAGE_TIMEOUT_MS`). */
  readonly timeoutMs?: number | undefined
}

const NOTHING: Result = { rows: [], changes: 0 }

/**
 * The SQL layer's operations on the pool: each on one connection, its statements awaited one by
 * one. A statement on a table that may be missing runs, inside a transaction, under a savepoint:
 * the failure of a statement aborts a PostgreSQL transaction, unless rolled back to a savepoint.
 */
export const postgresDriver = ({ run, transaction }: PostgresConnection): SqlDriver => {
  const execute = async (query: Query, step: Statement, inTransaction: boolean): Promise<Result> => {
    if (step.ifTableExists !== true) {
      const { rows, rowCount } = await query(step.sql, step.values)
      return { rows, changes: rowCount }
    }
    if (inTransaction) await query("SAVEPOINT if_table_exists")
    try {
      const { rows, rowCount } = await query(step.sql, step.values)
      if (inTransaction) await query("RELEASE SAVEPOINT if_table_exists")
      return { rows, changes: rowCount }
    } catch (error) {
      if (sqlState(error) !== UNDEFINED_TABLE) throw error
      if (inTransaction) await query("ROLLBACK TO SAVEPOINT if_table_exists")
      return NOTHING
    }
  }
  const interpret = async <A>(query: Query, body: () => Sql<A>, inTransaction: boolean): Promise<A> => {
    const steps = body()
    let step = steps.next()
    while (step.done !== true) step = steps.next(await execute(query, step.value, inTransaction))
    return step.value
  }
  return {
    dialect: POSTGRES,
    run: (operation, body, inTransaction) =>
      run(operation, (query) => inTransaction === true ? transaction(query, () => interpret(query, body, true)) : interpret(query, body, false)),
    one: (operation, statement, answer) => run(operation, async (query) => answer(await execute(query, statement, false)))
  }
}

export const layerPostgres = (options: PostgresOptions): Layer.Layer<Storage, StorageError> =>
  Layer.effect(
    Storage,
    Effect.gen(function*() {
      const timeoutMs = options.timeoutMs ?? STORAGE_TIMEOUT_MS
      const connection = yield* scopedPostgres(options.dsn, { poolSize: options.poolSize ?? POSTGRES_POOL_SIZE, timeoutMs })
      return withOperationDeadlines(yield* makeSqlStorage(postgresDriver(connection), options), timeoutMs)
    })
  )
