/**
 * A user's messages in an in-memory message table (`memory/rows.ts`), at the sort keys of
 * `model.ts`, with the DynamoDB layer's conditions: a topic message replaces an older one of its
 * topic, a timestamp message is written over nothing but its own row, no message over its own
 * tombstone. Expired rows and tombstones are left out of reads (expiry by the caller's Clock).
 */
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import { type MessageKey, type Notification, sortkeyMs } from "../../domain/notification.ts"
import { type MemoryStore, type MessageRow, messageTable, range, rowsOf, type UserRows } from "./rows.ts"
import {
  addsToChannel,
  expiryOf,
  isVisible,
  messageSortKey,
  nextFreeMs,
  type SaveOutcome,
  sortKeyMsOf,
  sortKeyOf,
  storedNotification,
  TIMESTAMP_END,
  timestampLowerBound,
  TOPIC_END,
  TOPIC_PREFIX
} from "../model.ts"
import { type AckedRow, saveManyMessagesEach } from "../Storage.ts"

/** What a read returns: unexpired messages, no tombstones. */
const readable = (row: MessageRow, now: number): boolean => row.cancelled !== true && isVisible(expiryOf(row), now)

export const makeMemoryMessages = (store: MemoryStore) => {
  /**
   * Topic messages replace an older one; a timestamp message is written over nothing but its own
   * row; nothing is written over a message's own tombstone.
   */
  const put = (rows: UserRows, message: Notification): SaveOutcome => {
    const key = messageSortKey(message)
    const existing = rows.messages.get(key)
    if (existing !== undefined) {
      if (existing.cancelled === true && existing.version === message.version) return "cancelled"
      if (message.topic === undefined) {
        if (existing.version !== message.version) return "taken"
      } else if (sortkeyMs(existing) > sortkeyMs(message)) return "superseded"
    }
    rows.messages.set(key, storedNotification(message))
    return "stored"
  }

  const saveMessage = Effect.fnUntraced(function*(uaid: string, table: string, message: Notification) {
    const t = yield* messageTable(store, "saveMessage", table)
    return put(rowsOf(t, uaid), message)
  })

  const saveMessages = Effect.fnUntraced(function*(uaid: string, table: string, messages: ReadonlyArray<Notification>) {
    const t = yield* messageTable(store, "saveMessages", table)
    const rows = rowsOf(t, uaid)
    const saved: Array<Notification> = []
    for (const message of messages) {
      let placed = message
      let outcome = put(rows, placed)
      while (outcome === "taken") outcome = put(rows, placed = nextFreeMs(placed))
      if (outcome === "stored") saved.push(placed)
    }
    return saved
  })

  const fetchTopicMessages = Effect.fnUntraced(function*(uaid: string, table: string, limit: number) {
    const t = yield* messageTable(store, "fetchTopicMessages", table)
    const now = yield* Clock.currentTimeMillis
    return range(t, uaid, TOPIC_PREFIX, TOPIC_END)
      .map(([, message]) => message)
      .filter((message) => readable(message, now))
      .slice(0, limit)
  })

  const countChannelMessages = Effect.fnUntraced(function*(uaid: string, table: string, channelId: string, atMost: number, replacing?: string) {
    const t = yield* messageTable(store, "countChannelMessages", table)
    const now = yield* Clock.currentTimeMillis
    const counted = range(t, uaid, TOPIC_PREFIX, TIMESTAMP_END).filter(([, message]) => readable(message, now) && addsToChannel(message, channelId, replacing))
    return Math.min(atMost, counted.length)
  })

  /**
   * One page of message rows after `lo` up to the last timestamp row: `limit` readable rows at most
   * (expired rows and tombstones are not counted: a page of them ending among topic rows would
   * leave the topic rows after it unread).
   */
  const messagePage = Effect.fnUntraced(function*(operation: string, uaid: string, table: string, lo: string, limit: number) {
    const t = yield* messageTable(store, operation, table)
    const now = yield* Clock.currentTimeMillis
    const page = range(t, uaid, lo, TIMESTAMP_END).filter(([, message]) => readable(message, now)).slice(0, limit)
    const last = page.at(-1)
    return {
      messages: page.map(([, message]) => message),
      lastSortKey: last === undefined ? undefined : sortKeyMsOf(last[0]),
      more: page.length === limit
    }
  })

  const fetchMessages = (uaid: string, table: string, limit: number) => messagePage("fetchMessages", uaid, table, TOPIC_PREFIX, limit)

  const fetchTimestampMessages = (uaid: string, table: string, after: number | undefined, limit: number) =>
    messagePage("fetchTimestampMessages", uaid, table, timestampLowerBound(after), limit)


  const deleteMessage = Effect.fnUntraced(function*(uaid: string, table: string, key: MessageKey, version?: string) {
    const t = yield* messageTable(store, "deleteMessage", table)
    const rows = t.get(uaid)
    const sortKey = sortKeyOf(key)
    const row = rows?.messages.get(sortKey)
    if (version !== undefined && (row?.version !== version || row.cancelled === true)) return false
    rows?.messages.delete(sortKey)
    return true
  })

  /** The row at `key`, if it holds the message of `version`, becomes its tombstone. */
  const bury = (rows: UserRows | undefined, key: MessageKey, version: string): boolean => {
    const sortKey = sortKeyOf(key)
    const row = rows?.messages.get(sortKey)
    if (rows === undefined || row === undefined || row.version !== version || row.cancelled === true) return false
    const { data: _data, headers: _headers, ...kept } = row
    rows.messages.set(sortKey, { ...kept, cancelled: true })
    return true
  }

  const cancelMessage = Effect.fnUntraced(function*(uaid: string, table: string, key: MessageKey, version: string) {
    return bury((yield* messageTable(store, "cancelMessage", table)).get(uaid), key, version)
  })

  const ackMessages = Effect.fnUntraced(function*(uaid: string, table: string, acked: ReadonlyArray<AckedRow>) {
    const rows = (yield* messageTable(store, "ackMessages", table)).get(uaid)
    for (const { key, version } of acked) bury(rows, key, version)
  })

  return {
    saveMessage,
    saveMessages,
    saveManyMessages: saveManyMessagesEach(saveMessages, 1),
    countChannelMessages,
    fetchTopicMessages,
    fetchMessages,
    fetchTimestampMessages,
    deleteMessage,
    ackMessages,
    cancelMessage
  }
}
