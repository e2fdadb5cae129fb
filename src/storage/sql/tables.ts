/**
 * The tables of the SQL stores (SQLite, PostgreSQL) and their rows: the same tables as on DynamoDB
 * (`model.ts`), one SQL table each, columns named as the DynamoDB attributes — one table per month too, so that rotation works as on DynamoDB (a
 * month's table made ahead of its month, listed, dropped at once when old) — and the broadcast
 * set, an item of the router table there, in a table of its own.
 *
 * - `{router}`: one row per user (its router record), `uaid` the key; `last_connect` indexed for
 *   the stale-user sweep.
 * - `{router}_broadcasts`: the broadcast set shared by every node, one row per broadcast id.
 * - `{router}_receipts`: push receipts, keyed by (`subscription`, `message`): a subscription's own
 *   row (`message` = `" "`, its `expiry`) and one status row per message sent with it.
 * - `{prefix}_{YYYY}_{MM}` (or `{prefix}` without rotation): a month's message table, keyed by
 *   (`uaid`, `chidmessageid`), the sort keys of `model.ts`: a user's channel rows (`00:{chid}`,
 *   no expiry) and its messages (`01:` topic, `02:` timestamp), each message with its `expiry`
 *   (seconds) — indexed, for the sweep that deletes expired rows — and `cancelled` 1 on a
 *   cancelled or acked message's tombstone (a column added to tables made before it: `cancelledColumnSql`);
 *   the rows that are not tombstones indexed again for the user's reads (`liveIndexSql`).
 *
 * The column types that differ between the two (64-bit integers, key text compared byte by byte)
 * are the dialect's (`sql/dialect.ts`).
 */
import type { Notification } from "../../domain/notification.ts"
import type { MessageStatus } from "../../domain/receipt.ts"
import type { UserRecord } from "../../domain/user.ts"
import {
  CANCELLED,
  type MessageFields,
  messageFields,
  messageFromFields,
  plainData,
  userFields,
  userFromFields
} from "../model.ts"
import { statusFromFields } from "../receiptRows.ts"
import { type SqlDialect, SQLITE } from "./dialect.ts"
import { receiptTableName, type StorageOptions } from "../tables.ts"

export { POSTGRES, type SqlDialect, SQLITE } from "./dialect.ts"

/** A value bound to a statement or read from a row (both stores). */
export type SqlValue = null | number | string

/** The broadcast set's table: `{router}_broadcasts`. */
export const broadcastTableName = (options: StorageOptions): string => `${options.routerTable}_broadcasts`

/** A table name as an SQL identifier (double-quoted: any name is safe). */
export const ident = (name: string): string => `"${name.replaceAll("\"", "\"\"")}"`

export const routerTableSql = (table: string, d: SqlDialect = SQLITE): ReadonlyArray<string> => [
  `CREATE TABLE IF NOT EXISTS ${ident(table)} (
    uaid ${d.key} PRIMARY KEY,
    connected_at ${d.integer} NOT NULL,
    router_type TEXT,
    router_data TEXT,
    node_id TEXT,
    last_connect ${d.integer},
    current_month TEXT,
    record_version ${d.integer},
    urgency TEXT
  )`,
  `CREATE INDEX IF NOT EXISTS ${ident(`${table}_last_connect`)} ON ${ident(table)} (last_connect) WHERE last_connect IS NOT NULL`
]

export const broadcastTableSql = (table: string, d: SqlDialect = SQLITE): ReadonlyArray<string> => [
  `CREATE TABLE IF NOT EXISTS ${ident(table)} (id ${d.key} PRIMARY KEY, version TEXT NOT NULL)`
]

export const receiptTableSql = (table: string, d: SqlDialect = SQLITE): ReadonlyArray<string> => [
  `CREATE TABLE IF NOT EXISTS ${ident(table)} (
    subscription ${d.key} NOT NULL,
    message ${d.key} NOT NULL,
    expiry ${d.integer},
    accepted_at ${d.integer},
    deadline ${d.integer},
    stored_at ${d.integer},
    delivered_at ${d.integer},
    outcome TEXT,
    outcome_at ${d.integer},
    code ${d.integer},
    PRIMARY KEY (subscription, message)
  )`,
  `CREATE INDEX IF NOT EXISTS ${ident(`${table}_expiry`)} ON ${ident(table)} (expiry) WHERE expiry IS NOT NULL`
]

export const messageTableSql = (table: string, d: SqlDialect = SQLITE): ReadonlyArray<string> => [
  `CREATE TABLE IF NOT EXISTS ${ident(table)} (
    uaid ${d.key} NOT NULL,
    chidmessageid ${d.key} NOT NULL,
    updateid TEXT,
    ttl ${d.integer},
    timestamp ${d.integer},
    expiry ${d.integer},
    sortkey_timestamp ${d.integer},
    urgency TEXT,
    receipt TEXT,
    data TEXT,
    headers TEXT,
    cancelled ${d.integer},
    PRIMARY KEY (uaid, chidmessageid)
  )`,
  `CREATE INDEX IF NOT EXISTS ${ident(`${table}_expiry`)} ON ${ident(table)} (expiry) WHERE expiry IS NOT NULL`
]

/**
 * The indexes of a message table's rows that are not tombstones, which a user's page reads and a
 * channel's count use, made after the tombstone column (`cancelledColumnSql`), also on tables made
 * before it:
 * - `_live`, by key: a read seeks the user's first such row past the page's start and never meets
 *   a tombstone (an ack leaves one until the sweep, `TOMBSTONE_SECONDS` later);
 * - `_live_expiry`, the user's messages by expiry (no channel rows): a read that met expired rows
 *   (the sweep deletes them within a minute) and a count seek the user's first unexpired message,
 *   however many expired before it. `cancelled`, NULL in every entry, lets SQLite judge their
 *   condition in the index alone.
 */
export const liveIndexSql = (table: string): ReadonlyArray<string> => [
  `CREATE INDEX IF NOT EXISTS ${ident(`${table}_live`)} ON ${ident(table)} (uaid, chidmessageid, expiry) WHERE ${CANCELLED} IS NULL`,
  `CREATE INDEX IF NOT EXISTS ${ident(`${table}_live_expiry`)} ON ${ident(table)} (uaid, expiry, chidmessageid, ${CANCELLED})
    WHERE ${CANCELLED} IS NULL AND expiry IS NOT NULL`
]

/** The tombstone column, for a message table made without it (the caller checks first). */
export const cancelledColumnSql = (table: string, d: SqlDialect = SQLITE): string =>
  `ALTER TABLE ${ident(table)} ADD COLUMN ${CANCELLED} ${d.integer}`

/** The tables of the store that are not message tables: router, broadcasts, receipts. */
export const fixedTablesSql = (options: StorageOptions, d: SqlDialect = SQLITE): ReadonlyArray<string> => [
  ...routerTableSql(options.routerTable, d),
  ...broadcastTableSql(broadcastTableName(options), d),
  ...receiptTableSql(receiptTableName(options), d)
]

// ── router rows: one column per field of the record ───────────────────────────────────────────

export const userValue = (field: string, value: unknown): SqlValue =>
  value === undefined ? null : field === "routerData" ? JSON.stringify(plainData(value as Record<string, unknown>)) : value as SqlValue

export const userFromRow = (row: Readonly<Record<string, unknown>>): UserRecord => {
  const fields: Record<string, unknown> = {}
  for (const [field, column] of userFields) {
    const value = row[column]
    if (value !== null && value !== undefined) fields[field] = field === "routerData" ? JSON.parse(String(value)) : value
  }
  return userFromFields(String(row["uaid"]), fields)
}

export const USER_COLUMNS = userFields.map(([, column]) => column)

/** A record's row values: `uaid`, then `USER_COLUMNS` (absent fields NULL). */
export const userRow = (user: UserRecord): Array<SqlValue> => [user.uaid, ...userFields.map(([field]) => userValue(field, user[field]))]

// ── message rows ─────────────────────────────────────────────────────────────────────────────────

/** Every column of a message row; a save writes `cancelled` NULL (a message, not its tombstone). */
export const MESSAGE_COLUMNS = "uaid, chidmessageid, updateid, ttl, timestamp, expiry, sortkey_timestamp, urgency, receipt, data, headers, cancelled"

/** A message's row values, in `MESSAGE_COLUMNS` order (absent fields NULL). */
export const messageValues = (uaid: string, n: Notification): Array<SqlValue> => {
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
    f.headers !== undefined ? JSON.stringify(f.headers) : null,
    f.cancelled ?? null
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
  readonly cancelled: number | null
}

/** A message as it reads back (`messageFromFields`); undefined for rows that are not messages, and tombstones. */
export const messageFromRow = (row: MessageRow): Notification | undefined =>
  messageFromFields({
    chidmessageid: row.chidmessageid,
    updateid: row.updateid ?? undefined,
    ttl: row.ttl ?? undefined,
    timestamp: row.timestamp ?? undefined,
    sortkey_timestamp: row.sortkey_timestamp ?? undefined,
    urgency: (row.urgency ?? undefined) as MessageFields["urgency"],
    receipt: row.receipt ?? undefined,
    data: row.data ?? undefined,
    headers: row.headers !== null ? JSON.parse(row.headers) as Record<string, string> : undefined,
    cancelled: row.cancelled ?? undefined
  })

// ── receipt rows: one column per status field ─────────────────────────────────────────────────

type Row = Readonly<Record<string, unknown>>

export const statusFromRow = (row: Row): MessageStatus =>
  statusFromFields(
    String(row["message"]),
    (column) => (row[column] === null || row[column] === undefined ? undefined : Number(row[column])),
    typeof row["outcome"] === "string" ? row["outcome"] : undefined
  )

export const receiptExpiryOf = (row: Row): number | undefined => (row["expiry"] === null || row["expiry"] === undefined ? undefined : Number(row["expiry"]))
