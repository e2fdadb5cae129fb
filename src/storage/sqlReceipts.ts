/**
 * Push receipts on the SQL stores: the `{router_table}_receipts` table (`sqlTables.ts`), one row
 * per receipt subscription (`message` = `" "`, its `expiry` in seconds) and one status row per
 * message sent with it, on either store's driver (`sqlDriver.ts`). Reads leave out expired rows.
 * Status rows are written field by field, an outcome once (`outcome IS NULL` in the statement's
 * condition). Only the write that opens a message's row may make it (an upsert); every other
 * write is an UPDATE of the row that is there, so a step that comes after the row was removed
 * (its receipt collected) cannot make it again.
 */
import type { StatusUpdate } from "../domain/receipt.ts"
import { isVisible, META_SORT_KEY } from "./model.ts"
import { jsonList } from "./sqlDialect.ts"
import { assignments, fromExcluded, placeholders, sql, type SqlDriver } from "./sqlDriver.ts"
import { atNow } from "./sqlMessages.ts"
import { ident, receiptExpiryOf, statusFromRow, updateColumns } from "./sqlTables.ts"
import { receiptTableName, type StorageOptions } from "./tables.ts"

export const makeSqlReceipts = ({ dialect, run }: SqlDriver, options: StorageOptions) => {
  const table = ident(receiptTableName(options))

  const createReceiptSubscription = (id: string, expiry: number) =>
    run("createReceiptSubscription", function*() {
      yield sql(
        `INSERT INTO ${table} (subscription, message, expiry) VALUES ($1, $2, $3)
         ON CONFLICT (subscription, message) DO UPDATE SET expiry = excluded.expiry`,
        id,
        META_SORT_KEY,
        expiry
      )
    })

  const touchReceiptSubscription = (id: string, expiry: number) =>
    atNow((now) =>
      run("touchReceiptSubscription", function*() {
        return (yield sql(
          `UPDATE ${table} SET expiry = $1 WHERE subscription = $2 AND message = $3 AND expiry > $4`,
          expiry,
          id,
          META_SORT_KEY,
          Math.floor(now / 1000)
        )).changes > 0
      })
    )

  /** A status write: `open` may make the row (an upsert); otherwise an UPDATE of the row that is there. */
  const writeMessageStatus = (operation: string, open: boolean) => (subscription: string, messageId: string, update: StatusUpdate) =>
    run(operation, function*() {
      const columns = updateColumns(update)
      const names = columns.map(([c]) => c)
      const values = columns.map(([, value]) => value)
      if (open) {
        const onConflict = columns.length === 0
          ? "DO NOTHING"
          : `DO UPDATE SET ${fromExcluded(names)}${update.outcome !== undefined ? " WHERE r.outcome IS NULL" : ""}`
        return (yield sql(
          `INSERT INTO ${table} AS r (subscription, message${names.map((c) => `, ${c}`).join("")}) VALUES (${placeholders(names.length + 2)})
           ON CONFLICT (subscription, message) ${onConflict}`,
          subscription,
          messageId,
          ...values
        )).changes > 0
      }
      if (columns.length === 0) return (yield sql(`SELECT 1 FROM ${table} WHERE subscription = $1 AND message = $2`, subscription, messageId)).rows.length > 0
      const n = columns.length
      return (yield sql(
        `UPDATE ${table} SET ${assignments(names)} WHERE subscription = $${n + 1} AND message = $${n + 2}${
          update.outcome !== undefined ? " AND outcome IS NULL" : ""
        }`,
        ...values,
        subscription,
        messageId
      )).changes > 0
    })
  const openMessageStatus = writeMessageStatus("openMessageStatus", true)
  const updateMessageStatus = writeMessageStatus("updateMessageStatus", false)

  const getMessageStatus = (subscription: string, messageId: string) =>
    atNow((now) =>
      run("getMessageStatus", function*() {
        const row = (yield sql(`SELECT * FROM ${table} WHERE subscription = $1 AND message = $2`, subscription, messageId)).rows[0]
        return row === undefined || !isVisible(receiptExpiryOf(row), now) ? undefined : statusFromRow(row)
      })
    )

  const readReceiptSubscription = (id: string) =>
    atNow((now) =>
      run("readReceiptSubscription", function*() {
        const { rows } = yield sql(`SELECT * FROM ${table} WHERE subscription = $1`, id)
        const expiry = receiptExpiryOf(rows.find((row) => row["message"] === META_SORT_KEY) ?? { expiry: null })
        if (expiry === undefined || !isVisible(expiry, now)) return undefined
        const statuses = rows.filter((row) => row["message"] !== META_SORT_KEY && isVisible(receiptExpiryOf(row), now)).map(statusFromRow)
        return { expiry, statuses }
      })
    )

  const deleteMessageStatuses = (subscription: string, messageIds: ReadonlyArray<string>) =>
    run("deleteMessageStatuses", function*() {
      if (messageIds.length === 0) return
      yield sql(
        `DELETE FROM ${table} WHERE subscription = $1 AND message IN (SELECT value FROM ${dialect.scalars(2)})`,
        subscription,
        jsonList(messageIds)
      )
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
