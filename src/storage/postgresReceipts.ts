/**
 * Push receipts on PostgreSQL: the `{router_table}_receipts` table (`sqlTables.ts`), one row per
 * receipt subscription (`message` = `" "`, its `expiry` in seconds) and one status row per message
 * sent with it, written as on SQLite (`sqliteReceipts.ts`): reads leave out expired rows, an
 * outcome is written once (`outcome IS NULL` in the statement's condition), only the write that
 * opens a message's row may make it (an upsert), every other write is an UPDATE of the row there.
 */
import type * as Effect from "effect/Effect"
import type { StatusUpdate } from "../domain/receipt.ts"
import { isVisible, META_SORT_KEY } from "./model.ts"
import { placeholders, type PostgresConnection, type Query } from "./postgresPool.ts"
import { ident, receiptExpiryOf, statusFromRow, updateColumns } from "./sqlTables.ts"
import type { StorageError } from "./Storage.ts"
import { receiptTableName, type StorageOptions } from "./tables.ts"

export const makePostgresReceipts = (
  { run }: PostgresConnection,
  atNow: <A>(operation: string, body: (query: Query, now: number) => Promise<A>) => Effect.Effect<A, StorageError>,
  options: StorageOptions
) => {
  const table = ident(receiptTableName(options))

  const createReceiptSubscription = (id: string, expiry: number) =>
    run("createReceiptSubscription", async (query) => {
      await query(
        `INSERT INTO ${table} (subscription, message, expiry) VALUES ($1, $2, $3)
         ON CONFLICT (subscription, message) DO UPDATE SET expiry = excluded.expiry`,
        [id, META_SORT_KEY, expiry]
      )
    })

  const touchReceiptSubscription = (id: string, expiry: number) =>
    atNow("touchReceiptSubscription", async (query, now) =>
      (await query(`UPDATE ${table} SET expiry = $1 WHERE subscription = $2 AND message = $3 AND expiry > $4`, [
        expiry,
        id,
        META_SORT_KEY,
        Math.floor(now / 1000)
      ])).rowCount > 0)

  /** A status write: `open` may make the row (an upsert); otherwise an UPDATE of the row that is there. */
  const writeMessageStatus = (operation: string, open: boolean) => (subscription: string, messageId: string, update: StatusUpdate) =>
    run(operation, async (query) => {
      const columns = updateColumns(update)
      const values = columns.map(([, value]) => value)
      if (open) {
        const names = ["subscription", "message", ...columns.map(([c]) => c)]
        const onConflict = columns.length === 0
          ? "DO NOTHING"
          : `DO UPDATE SET ${columns.map(([c]) => `${c} = excluded.${c}`).join(", ")}${update.outcome !== undefined ? " WHERE r.outcome IS NULL" : ""}`
        return (await query(
          `INSERT INTO ${table} AS r (${names.join(", ")}) VALUES (${placeholders(names.length)}) ON CONFLICT (subscription, message) ${onConflict}`,
          [subscription, messageId, ...values]
        )).rowCount > 0
      }
      if (columns.length === 0) {
        return (await query(`SELECT 1 FROM ${table} WHERE subscription = $1 AND message = $2`, [subscription, messageId])).rows.length > 0
      }
      const n = columns.length
      return (await query(
        `UPDATE ${table} SET ${columns.map(([c], i) => `${c} = $${i + 1}`).join(", ")} WHERE subscription = $${n + 1} AND message = $${n + 2}${
          update.outcome !== undefined ? " AND outcome IS NULL" : ""
        }`,
        [...values, subscription, messageId]
      )).rowCount > 0
    })
  const openMessageStatus = writeMessageStatus("openMessageStatus", true)
  const updateMessageStatus = writeMessageStatus("updateMessageStatus", false)

  const getMessageStatus = (subscription: string, messageId: string) =>
    atNow("getMessageStatus", async (query, now) => {
      const row = (await query(`SELECT * FROM ${table} WHERE subscription = $1 AND message = $2`, [subscription, messageId])).rows[0]
      return row === undefined || !isVisible(receiptExpiryOf(row), now) ? undefined : statusFromRow(row)
    })

  const readReceiptSubscription = (id: string) =>
    atNow("readReceiptSubscription", async (query, now) => {
      const { rows } = await query(`SELECT * FROM ${table} WHERE subscription = $1`, [id])
      const expiry = receiptExpiryOf(rows.find((row) => row["message"] === META_SORT_KEY) ?? { expiry: null })
      if (expiry === undefined || !isVisible(expiry, now)) return undefined
      const statuses = rows.filter((row) => row["message"] !== META_SORT_KEY && isVisible(receiptExpiryOf(row), now)).map(statusFromRow)
      return { expiry, statuses }
    })

  const deleteMessageStatuses = (subscription: string, messageIds: ReadonlyArray<string>) =>
    run("deleteMessageStatuses", async (query) => {
      if (messageIds.length === 0) return
      await query(`DELETE FROM ${table} WHERE subscription = $1 AND message = ANY($2::text[])`, [subscription, messageIds])
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
