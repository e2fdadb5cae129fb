/**
 * Push receipts on the SQL stores: the `{router_table}_receipts` table (`sql/tables.ts`), one row
 * per receipt subscription (`message` = `" "`, its `expiry` in seconds) and one status row per
 * message sent with it, on either store's driver (`sql/driver.ts`). Reads leave out expired rows.
 * Status rows are written field by field, an outcome once (`outcome IS NULL` in the statement's
 * condition). Only the write that opens a message's row may make it (an upsert); every other
 * write is an UPDATE of the row that is there, so a step that comes after the row was removed
 * (its receipt collected) cannot make it again.
 */
import * as Effect from "effect/Effect"
import type { StatusUpdate } from "../../domain/receipt.ts"
import { isVisible, META_SORT_KEY } from "../model.ts"
import { type ReceiptRowReader, statusUpdateFields, subscriptionFromRows } from "../receiptRows.ts"
import { jsonList } from "./dialect.ts"
import { assignments, changed, found, fromExcluded, nothing, placeholders, type Row, sql, type SqlDriver } from "./driver.ts"
import { atNow } from "./messages.ts"
import { ident, receiptExpiryOf, statusFromRow } from "./tables.ts"
import { receiptTableName, type StorageOptions } from "../tables.ts"

const ROWS: ReceiptRowReader<Row> = { message: (row) => String(row["message"]), expiry: receiptExpiryOf, status: statusFromRow }

export const makeSqlReceipts = ({ dialect, one }: SqlDriver, options: StorageOptions) => {
  const table = ident(receiptTableName(options))

  /** A status write: `open` may make the row (an upsert); otherwise an UPDATE of the row that is there. */
  const writeMessageStatus = (operation: string, open: boolean) => (subscription: string, messageId: string, update: StatusUpdate) => {
    const columns = statusUpdateFields(update)
    const names = columns.map(([c]) => c)
    const values = columns.map(([, value]) => value)
    if (open) {
      const onConflict = columns.length === 0
        ? "DO NOTHING"
        : `DO UPDATE SET ${fromExcluded(names)}${update.outcome !== undefined ? " WHERE r.outcome IS NULL" : ""}`
      return one(
        operation,
        sql(
          `INSERT INTO ${table} AS r (subscription, message${names.map((c) => `, ${c}`).join("")}) VALUES (${placeholders(names.length + 2)})
           ON CONFLICT (subscription, message) ${onConflict}`,
          subscription,
          messageId,
          ...values
        ),
        changed
      )
    }
    if (columns.length === 0) return one(operation, sql(`SELECT 1 FROM ${table} WHERE subscription = $1 AND message = $2`, subscription, messageId), found)
    const n = columns.length
    const unlessDecided = update.outcome !== undefined ? " AND outcome IS NULL" : ""
    return one(
      operation,
      sql(`UPDATE ${table} SET ${assignments(names)} WHERE subscription = $${n + 1} AND message = $${n + 2}${unlessDecided}`, ...values, subscription, messageId),
      changed
    )
  }

  return {
    createReceiptSubscription: (id: string, expiry: number) =>
      one(
        "createReceiptSubscription",
        sql(
          `INSERT INTO ${table} (subscription, message, expiry) VALUES ($1, $2, $3)
           ON CONFLICT (subscription, message) DO UPDATE SET expiry = excluded.expiry`,
          id,
          META_SORT_KEY,
          expiry
        ),
        nothing
      ),

    touchReceiptSubscription: (id: string, expiry: number) =>
      atNow((now) =>
        one(
          "touchReceiptSubscription",
          sql(`UPDATE ${table} SET expiry = $1 WHERE subscription = $2 AND message = $3 AND expiry > $4`, expiry, id, META_SORT_KEY, Math.floor(now / 1000)),
          changed
        )
      ),

    openMessageStatus: writeMessageStatus("openMessageStatus", true),
    updateMessageStatus: writeMessageStatus("updateMessageStatus", false),

    getMessageStatus: (subscription: string, messageId: string) =>
      atNow((now) =>
        one("getMessageStatus", sql(`SELECT * FROM ${table} WHERE subscription = $1 AND message = $2`, subscription, messageId), ({ rows }) => {
          const row = rows[0]
          return row === undefined || !isVisible(receiptExpiryOf(row), now) ? undefined : statusFromRow(row)
        })
      ),

    readReceiptSubscription: (id: string) =>
      atNow((now) =>
        one("readReceiptSubscription", sql(`SELECT * FROM ${table} WHERE subscription = $1`, id), ({ rows }) => subscriptionFromRows(rows, now, ROWS))
      ),

    deleteMessageStatuses: (subscription: string, messageIds: ReadonlyArray<string>) =>
      messageIds.length === 0 ? Effect.void : one(
        "deleteMessageStatuses",
        sql(`DELETE FROM ${table} WHERE subscription = $1 AND message ${dialect.inList(2)}`, subscription, jsonList(messageIds)),
        nothing
      )
  }
}
