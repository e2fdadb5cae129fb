/**
 * The in-memory receipt table (`memory/rows.ts`): per subscription, its expiry and its messages'
 * status rows, written with the DynamoDB layer's conditions (a status row's outcome is written
 * once; an update needs the row, an open makes it).
 */
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import type { MessageStatus, StatusUpdate } from "../../domain/receipt.ts"
import { type MemoryStore, receiptTable } from "./rows.ts"
import { isVisible } from "../model.ts"

export const makeMemoryReceipts = (store: MemoryStore) => {
  const createReceiptSubscription = Effect.fnUntraced(function*(id: string, expiry: number) {
    const table = yield* receiptTable(store, "createReceiptSubscription")
    table.set(id, { expiry, statuses: table.get(id)?.statuses ?? new Map() })
  })

  const touchReceiptSubscription = Effect.fnUntraced(function*(id: string, expiry: number) {
    const rows = (yield* receiptTable(store, "touchReceiptSubscription")).get(id)
    if (rows?.expiry === undefined || !isVisible(rows.expiry, yield* Clock.currentTimeMillis)) return false
    rows.expiry = expiry
    return true
  })

  /** A status write: `open` may make the row; otherwise the row must be there (as the DynamoDB condition). */
  const writeMessageStatus = (operation: string, open: boolean) =>
    Effect.fnUntraced(function*(subscription: string, messageId: string, update: StatusUpdate) {
      const table = yield* receiptTable(store, operation)
      const existing = table.get(subscription)?.statuses.get(messageId)
      if (existing === undefined && !open) return false
      let rows = table.get(subscription)
      if (rows === undefined) table.set(subscription, rows = { expiry: undefined, statuses: new Map() })
      const before = existing?.status ?? { messageId }
      if (update.outcome !== undefined && before.outcome !== undefined) return false
      const { outcome, expiry, ...times } = update
      const defined = Object.fromEntries(Object.entries(times).filter(([, v]) => v !== undefined))
      const status: MessageStatus = {
        ...before,
        ...defined,
        ...(outcome === undefined ? {} : {
          outcome: outcome.outcome,
          outcomeAt: outcome.at,
          ...(outcome.code === undefined ? {} : { code: outcome.code })
        })
      }
      rows.statuses.set(messageId, { status, expiry: expiry ?? existing?.expiry })
      return true
    })
  const openMessageStatus = writeMessageStatus("openMessageStatus", true)
  const updateMessageStatus = writeMessageStatus("updateMessageStatus", false)

  const getMessageStatus = Effect.fnUntraced(function*(subscription: string, messageId: string) {
    const row = (yield* receiptTable(store, "getMessageStatus")).get(subscription)?.statuses.get(messageId)
    return row === undefined || !isVisible(row.expiry, yield* Clock.currentTimeMillis) ? undefined : row.status
  })

  const readReceiptSubscription = Effect.fnUntraced(function*(id: string) {
    const rows = (yield* receiptTable(store, "readReceiptSubscription")).get(id)
    const now = yield* Clock.currentTimeMillis
    if (rows?.expiry === undefined || !isVisible(rows.expiry, now)) return undefined
    const statuses = Array.from(rows.statuses.values()).filter((row) => isVisible(row.expiry, now)).map((row) => row.status)
    return { expiry: rows.expiry, statuses }
  })

  const deleteMessageStatuses = Effect.fnUntraced(function*(subscription: string, messageIds: ReadonlyArray<string>) {
    const rows = (yield* receiptTable(store, "deleteMessageStatuses")).get(subscription)
    for (const id of messageIds) rows?.statuses.delete(id)
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
