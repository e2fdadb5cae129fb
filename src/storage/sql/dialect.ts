/**
 * Where the SQL of the two SQL stores (SQLite, PostgreSQL) differs, in a few words and fragments;
 * everything else is the same statement on both (`sql/users.ts`, `sql/messages.ts`,
 * `sql/receipts.ts`, `sql/maintenance.ts`), written with PostgreSQL's `$1` placeholders (SQLite's
 * driver reads them as its own `?1`).
 *
 * A list bound as one value is a JSON array (`jsonList`): SQLite reads it with `json_each`,
 * PostgreSQL with `json_array_elements`, both as rows with a `value` column.
 */

/** The column types and statement fragments that differ between the SQL stores. */
export interface SqlDialect {
  /** 64-bit integers (ms since 1970 need them: SQLite's INTEGER is, PostgreSQL's is BIGINT). */
  readonly integer: string
  /**
   * Key text, compared byte by byte as DynamoDB's sort keys are (SQLite's TEXT does; PostgreSQL's
   * compares by the database's locale unless `COLLATE "C"`).
   */
  readonly key: string
  /** The rows of the JSON array of scalars bound as `$n`: a `value` column (text or integer). */
  readonly scalars: (n: number) => string
  /** The rows of the JSON array of arrays bound as `$n`: a `value` column, its items `value->>0`, `value->>1`, … */
  readonly tuples: (n: number) => string
  /**
   * `column` + this: the column is one of the JSON array of scalars bound as `$n` (of SQL `type`),
   * in a form that looks each one up in the column's index.
   */
  readonly inList: (n: number, type?: string) => string
  /** A column naming each row of a table physically, for deleting a batch of rows chosen by a subquery. */
  readonly rowId: string
  /** The names of the tables of the store (column `name`). */
  readonly tableNames: string
  /** The names of the columns of the table `$1` (column `name`). */
  readonly columnNames: string
  /**
   * What a transaction that creates tables takes first, so that nodes starting together do not
   * race to make the same table (SQLite: nothing, its `BEGIN IMMEDIATE` already excludes others).
   */
  readonly lockTables: ReadonlyArray<string>
  /**
   * What a transaction that counts a user's channel rows before adding one takes first: the
   * user's lock, `$1` naming it (SQLite: nothing, as above).
   */
  readonly lockUser: ReadonlyArray<string>
  /** What follows dropping a table (SQLite: giving its pages back to the file system). */
  readonly afterDropTable: ReadonlyArray<string>
}

export const SQLITE: SqlDialect = {
  integer: "INTEGER",
  key: "TEXT",
  scalars: (n) => `json_each($${n})`,
  tuples: (n) => `json_each($${n})`,
  inList: (n) => `IN (SELECT value FROM json_each($${n}))`,
  rowId: "rowid",
  tableNames: "SELECT name FROM sqlite_schema WHERE type = 'table'",
  columnNames: "SELECT name FROM pragma_table_info($1)",
  lockTables: [],
  lockUser: [],
  // On a file made with `auto_vacuum = INCREMENTAL`: the dropped table's pages leave the file.
  afterDropTable: ["PRAGMA incremental_vacuum"]
}

/** The advisory lock every PostgreSQL node takes to create tables (any number, the same on every node). */
const CREATE_TABLES_LOCK = 0x6175746f70757368n // "autopush"

export const POSTGRES: SqlDialect = {
  integer: "BIGINT",
  key: "TEXT COLLATE \"C\"",
  scalars: (n) => `json_array_elements_text($${n}::json) AS value`,
  tuples: (n) => `json_array_elements($${n}::json) AS value`,
  // `= ANY` of an array the planner sees as a value, not `IN` a set it would hash the table against.
  inList: (n, type = "TEXT") => `= ANY(ARRAY(SELECT CAST(value AS ${type}) FROM json_array_elements_text($${n}::json) AS value))`,
  rowId: "ctid",
  tableNames: "SELECT tablename AS name FROM pg_tables WHERE schemaname = current_schema()",
  columnNames: "SELECT column_name AS name FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = $1",
  lockTables: [`SELECT pg_advisory_xact_lock(${CREATE_TABLES_LOCK})`],
  lockUser: ["SELECT pg_advisory_xact_lock(hashtextextended($1, 0))"],
  afterDropTable: []
}

/** A list bound as one value (`SqlDialect.scalars`, `tuples`). */
export const jsonList = (values: ReadonlyArray<unknown>): string => JSON.stringify(values)
