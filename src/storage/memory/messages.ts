/**
 * A user's messages in an in-memory message table (`memory/rows.ts`), at the sort keys of
 * `model.ts`: the row operations the message rules are written over (`messageRules.ts`), with the
 * write rule of the stores with conditional writes (`mayWriteOver`). Expired rows and tombstones are
 * left out of reads (expiry by the caller's Clock).
 */
import * as Effect from "effect/Effect"
import { makeMessageOperations, mayWriteOver, type MessageRows, saveOutcome } from "../messageRules.ts"
import { saveManyMessagesEach } from "../manySaves.ts"
import { expiryOf, isVisible, messageSortKey, storedNotification } from "../model.ts"
import { type MemoryStore, type MessageRow, messageTable, range, rowsOf } from "./rows.ts"

/** What a read returns: unexpired messages, no tombstones. */
const readable = (row: MessageRow, now: number): boolean => row.cancelled !== true && isVisible(expiryOf(row), now)

/** Whether `row` holds the message of `version`, not its tombstone. */
const holds = (row: MessageRow | undefined, version: string): row is MessageRow => row?.version === version && row.cancelled !== true

const memoryMessageRows = (store: MemoryStore): MessageRows => ({
  save: (operation, uaid, table, message) =>
    Effect.flatMap(messageTable(store, operation, table), (t) => {
      const rows = rowsOf(t, uaid)
      const key = messageSortKey(message)
      const put = Effect.sync(() => {
        const existing = rows.messages.get(key)
        if (existing !== undefined && !mayWriteOver(existing, message)) return false
        rows.messages.set(key, storedNotification(message))
        return true
      })
      const ownTombstone = () =>
        Effect.sync(() => {
          const row = rows.messages.get(key)
          return row?.cancelled === true && row.version === message.version
        })
      return Effect.gen(() => saveOutcome(message, put, ownTombstone))
    }),
  readable: (operation, uaid, table, lo, hi, limit, now) =>
    Effect.map(messageTable(store, operation, table), (t) =>
      range(t, uaid, lo, hi)
        .filter(([, row]) => readable(row, now))
        .slice(0, limit)
        .map(([sortKey, message]) => ({ sortKey, message }))),
  remove: (operation, uaid, table, sortKey, version) =>
    Effect.map(messageTable(store, operation, table), (t) => {
      const rows = t.get(uaid)
      if (version !== undefined && !holds(rows?.messages.get(sortKey), version)) return false
      rows?.messages.delete(sortKey)
      return true
    }),
  bury: (operation, uaid, table, sortKey, version) =>
    Effect.map(messageTable(store, operation, table), (t) => {
      const rows = t.get(uaid)
      const row = rows?.messages.get(sortKey)
      if (rows === undefined || !holds(row, version)) return false
      const { data: _data, headers: _headers, ...kept } = row
      rows.messages.set(sortKey, { ...kept, cancelled: true })
      return true
    })
})

export const makeMemoryMessages = (store: MemoryStore) => {
  const operations = makeMessageOperations(memoryMessageRows(store))
  return { ...operations, saveManyMessages: saveManyMessagesEach(operations.saveMessages, 1) }
}
