/**
 * The in-memory store's tables and rows, shared by its operations (`memory/layer.ts`): the router table
 * (one record per user, by uaid), the broadcast set, each month's message table (per user: its
 * channel set and its message rows by sort key, `model.ts`) and the receipt table (per
 * subscription: its expiry and its messages' status rows). A table is absent until `createTables`
 * makes it; an operation on a missing one fails as on DynamoDB, with a `StorageError` whose reason
 * is `MissingTable`.
 */
import * as Effect from "effect/Effect"
import type { Notification } from "../../domain/notification.ts"
import type { MessageStatus } from "../../domain/receipt.ts"
import type { UserRecord } from "../../domain/user.ts"
import { MissingTable, StorageError } from "../failures.ts"
import { receiptTableName, type StorageOptions } from "../tables.ts"

/** A message row: the message, or, `cancelled`, its tombstone (`model.ts`). */
export type MessageRow = Notification & { readonly cancelled?: true }

/** Per user and message table: its channel set (the meta row's) and its message rows by sort key. */
export interface UserRows {
  chids?: ReadonlySet<string>
  readonly messages: Map<string, MessageRow>
}

export type MessageTable = Map<string, UserRows>

/** A receipt subscription's rows: its own (`expiry`, absent until it is created) and its messages'. */
export interface ReceiptRows {
  expiry: number | undefined
  readonly statuses: Map<string, { readonly status: MessageStatus; readonly expiry: number | undefined }>
}

export interface MemoryStore {
  readonly options: StorageOptions
  /** Undefined until created. */
  router: Map<string, UserRecord> | undefined
  /** The broadcast set: id → version (an item of the router table on DynamoDB). */
  readonly broadcasts: Map<string, string>
  readonly messageTables: Map<string, MessageTable>
  /** Undefined until created. */
  receipts: Map<string, ReceiptRows> | undefined
}

export const makeMemoryStore = (options: StorageOptions): MemoryStore => ({
  options,
  router: undefined,
  broadcasts: new Map(),
  messageTables: new Map(),
  receipts: undefined
})

const notFound = (operation: string, table: string) =>
  new StorageError({ operation, reason: new MissingTable({ table }) })

export const routerTable = (store: MemoryStore, operation: string) =>
  store.router === undefined ? Effect.fail(notFound(operation, store.options.routerTable)) : Effect.succeed(store.router)

export const messageTable = (store: MemoryStore, operation: string, table: string) => {
  const t = store.messageTables.get(table)
  return t === undefined ? Effect.fail(notFound(operation, table)) : Effect.succeed(t)
}

export const receiptTable = (store: MemoryStore, operation: string) =>
  store.receipts === undefined ? Effect.fail(notFound(operation, receiptTableName(store.options))) : Effect.succeed(store.receipts)

/** A user's rows in a message table, made empty if it has none. */
export const rowsOf = (t: MessageTable, uaid: string): UserRows => {
  let rows = t.get(uaid)
  if (rows === undefined) {
    rows = { messages: new Map() }
    t.set(uaid, rows)
  }
  return rows
}

/** Message rows of a user, in sort-key order, with `lo < key < hi`. */
export const range = (t: MessageTable, uaid: string, lo: string, hi: string) =>
  Array.from(t.get(uaid)?.messages ?? [])
    .filter(([key]) => key > lo && key < hi)
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))

/** Everything a user has in a message table (none when there is no table). */
export const deleteUserRows = (store: MemoryStore, uaid: string, table: string | undefined) => {
  if (table !== undefined) store.messageTables.get(table)?.delete(uaid)
}
