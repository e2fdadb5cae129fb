/**
 * Push receipts on SQLite: the `{router_table}_receipts` table (`sqliteSchema.ts`), one row per
 * receipt subscription (`message` = `" "`, its `expiry` in seconds) and one status row per message
 * sent with it. Reads leave out expired rows. Status rows are written field by field, an outcome
 * once (`outcome IS NULL` in the statement's condition). Only the write that opens a message's row
 * may make it (an upsert); every other write is an UPDATE of the row that is there, so a step that
 * comes after the row was removed (its receipt collected) cannot make it again.
 */
import type * as Effect from "effect/Effect"
import type { StatusUpdate } from "../domain/receipt.ts"
import { isVisible, META_SORT_KEY } from "./model.ts"
import { type RunSql, type SqliteConnection } from "./sqliteSchema.ts"
import { ident, receiptExpiryOf, statusFromRow, updateColumns } from "./sqlTables.ts"
import type { StorageError } from "./Storage.ts"
import { receiptTableName, type StorageOptions } from "./tables.ts"

export const makeSqliteReceipts = (
  { statement, immediate }: SqliteConnection,
  run: RunSql,
  atNow: <A>(operation: string, body: (now: number) => A) => Effect.Effect<A, StorageError>,
  options: StorageOptions
) => {
  const table = ident(receiptTableName(options))

  const createReceiptSubscription = (id: string, expiry: number) =>
    run("createReceiptSubscription", () => {
      statement(`INSERT INTO ${table} (subscription, message, expiry) VALUES (?, ?, ?) ON CONFLICT DO UPDATE SET expiry = excluded.expiry`)
        .run(id, META_SORT_KEY, expiry)
    })

  const touchReceiptSubscription = (id: string, expiry: number) =>
    atNow("touchReceiptSubscription", (now) =>
      statement(`UPDATE ${table} SET expiry = ? WHERE subscription = ? AND message = ? AND expiry > ?`)
        .run(expiry, id, META_SORT_KEY, Math.floor(now / 1000)).changes > 0)

  /** A status write: `open` may make the row (an upsert); otherwise an UPDATE of the row that is there. */
  const writeMessageStatus = (operation: string, open: boolean) => (subscription: string, messageId: string, update: StatusUpdate) =>
    run(operation, () => {
      const columns = updateColumns(update)
      const unlessDecided = update.outcome !== undefined ? " AND outcome IS NULL" : ""
      const values = columns.map(([, value]) => value)
      if (open) {
        const names = ["subscription", "message", ...columns.map(([c]) => c)]
        const onConflict = columns.length === 0
          ? "DO NOTHING"
          : `DO UPDATE SET ${columns.map(([c]) => `${c} = excluded.${c}`).join(", ")} WHERE true${unlessDecided}`
        return statement(`INSERT INTO ${table} (${names.join(", ")}) VALUES (${names.map(() => "?").join(", ")}) ON CONFLICT ${onConflict}`)
          .run(subscription, messageId, ...values).changes > 0
      }
      if (columns.length === 0) return statement(`SELECT 1 FROM ${table} WHERE subscription = ? AND message = ?`).get(subscription, messageId) !== undefined
      return statement(`UPDATE ${table} SET ${columns.map(([c]) => `${c} = ?`).join(", ")} WHERE subscription = ? AND message = ?${unlessDecided}`)
        .run(...values, subscription, messageId).changes > 0
    })
  const openMessageStatus = writeMessageStatus("openMessageStatus", true)
  const updateMessageStatus = writeMessageStatus("updateMessageStatus", false)

  const getMessageStatus = (subscription: string, messageId: string) =>
    atNow("getMessageStatus", (now) => {
      const row = statement(`SELECT * FROM ${table} WHERE subscription = ? AND message = ?`).get(subscription, messageId)
      return row === undefined || !isVisible(receiptExpiryOf(row), now) ? undefined : statusFromRow(row)
    })

  const readReceiptSubscription = (id: string) =>
    atNow("readReceiptSubscription", (now) => {
      const rows = statement(`SELECT * FROM ${table} WHERE subscription = ?`).all(id)
      const expiry = receiptExpiryOf(rows.find((row) => row["message"] === META_SORT_KEY) ?? { expiry: null })
      if (expiry === undefined || !isVisible(expiry, now)) return undefined
      const statuses = rows.filter((row) => row["message"] !== META_SORT_KEY && isVisible(receiptExpiryOf(row), now)).map(statusFromRow)
      return { expiry, statuses }
    })

  const deleteMessageStatuses = (subscription: string, messageIds: ReadonlyArray<string>) =>
    run("deleteMessageStatuses", () => {
      if (messageIds.length === 0) return
      const remove = statement(`DELETE FROM ${table} WHERE subscription = ? AND message = ?`)
      immediate(() => {
        for (const id of messageIds) remove.run(subscription, id)
      })
    })

  return {
    createReceiptSubscription,
    touchReceiptSubscription,
    openMessageStatus,
    updateMessageStatus,
    getMessageStatus,
    readReceiptSubscription,
    deleteMessageStatuses
  }
}
