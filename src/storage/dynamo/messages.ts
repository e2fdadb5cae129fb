/**
 * A user's messages on the DynamoDB API, in each month's message table (keyed by `uaid` and
 * `chidmessageid`): topic messages at `01:{chid}:{topic}`, timestamp messages at
 * `02:{ms}:{chid}`, each with its `expiry` (`model.ts`). Saves are conditional writes, reads
 * Queries of one user's key range (expired rows left out by the caller's Clock, tombstones left
 * out), deletes single, a cancel or an ack an UpdateItem that makes the row its tombstone; and every
 * row a user has in a table deleted at once (`deleteUserRows`).
 */
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import { type MessageKey, type Notification, sortkeyMs } from "../../domain/notification.ts"
import type { DynamoClient } from "./client.ts"
import { type DynamoRequests, isNamed } from "./requests.ts"
import { messageKey, visibleMessages } from "./rows.ts"
import { type Item, messageToItem, N, S } from "../items.ts"
import {
  addsToChannel,
  CANCELLED,
  messageSortKey,
  nextFreeMs,
  type SaveOutcome,
  sortKeyMsOf,
  sortKeyOf,
  TIMESTAMP_END,
  timestampLowerBound,
  TOPIC_PREFIX
} from "../model.ts"
import { type AckedRow, saveManyMessagesEach, type StorageError } from "../Storage.ts"

/** Rows `saveMessages` writes at once: a save of one session is not to take all the client's sockets. */
const SAVE_CONCURRENCY = 16

export const makeMessages = (client: DynamoClient, { call, conditional, query, queryAll, batchWrite }: DynamoRequests) => {
  /** Delete every row (meta row included) a user has in one message table; a missing table has none. */
  const deleteUserRows = Effect.fnUntraced(function*(operation: string, uaid: string, table: string) {
    const keys = yield* queryAll(operation, {
      TableName: table,
      KeyConditionExpression: "#uaid = :uaid",
      ProjectionExpression: "#uaid, #chidmessageid",
      ExpressionAttributeNames: { "#uaid": "uaid", "#chidmessageid": "chidmessageid" },
      ExpressionAttributeValues: { ":uaid": S(uaid) },
      ConsistentRead: true
    }).pipe(Effect.catchIf(isNamed("ResourceNotFoundException"), () => Effect.succeed([])))
    yield* batchWrite(operation, table, keys.map((Key) => ({ DeleteRequest: { Key } })))
  })

  /** Whether the row at the message's key is its own tombstone (why a save's condition failed). */
  const ownTombstone = (operation: string, uaid: string, table: string, message: Notification) =>
    call(operation, (o) =>
      client.send(
        "GetItem", {
          TableName: table,
          Key: messageKey(uaid, messageSortKey(message)),
          ProjectionExpression: "#updateid, #cancelled",
          ExpressionAttributeNames: { "#updateid": "updateid", "#cancelled": CANCELLED },
          ConsistentRead: true
        },
        o
      )).pipe(Effect.map((result) => result.Item?.[CANCELLED] !== undefined && result.Item.updateid?.S === message.version))

  /**
   * A timestamp message only goes to a free sort key or over its own row (a save retried after an
   * answer was lost lands where it wrote); a topic message replaces an older one (rows of older
   * versions carry no ms: their `timestamp` seconds are compared); nothing goes over the message's
   * own tombstone (a condition that failed is told apart by one read of the row).
   */
  const putMessage = Effect.fnUntraced(function*(
    operation: string,
    uaid: string,
    table: string,
    message: Notification
  ): Effect.fn.Return<SaveOutcome, StorageError> {
    const condition = message.topic === undefined
      ? {
        ConditionExpression: "attribute_not_exists(#chidmessageid) OR (#updateid = :updateid AND attribute_not_exists(#cancelled))",
        ExpressionAttributeNames: { "#chidmessageid": "chidmessageid", "#updateid": "updateid", "#cancelled": CANCELLED },
        ExpressionAttributeValues: { ":updateid": S(message.version) }
      }
      : {
        ConditionExpression: "(attribute_not_exists(#chidmessageid) OR #sortkey <= :ms OR (attribute_not_exists(#sortkey) AND #timestamp <= :seconds))" +
          " AND NOT (#updateid = :updateid AND attribute_exists(#cancelled))",
        ExpressionAttributeNames: {
          "#chidmessageid": "chidmessageid",
          "#sortkey": "sortkey_timestamp",
          "#timestamp": "timestamp",
          "#updateid": "updateid",
          "#cancelled": CANCELLED
        },
        ExpressionAttributeValues: {
          ":ms": N(sortkeyMs(message)),
          ":seconds": N(Math.floor(sortkeyMs(message) / 1000)),
          ":updateid": S(message.version)
        }
      }
    const written = yield* conditional(call(operation, (o) =>
      client.send("PutItem", { TableName: table, Item: messageToItem(uaid, message), ...condition }, o)))
    if (written) return "stored"
    if (yield* ownTombstone(operation, uaid, table, message)) return "cancelled"
    return message.topic === undefined ? "taken" : "superseded"
  })

  const saveMessage = (uaid: string, table: string, message: Notification) => putMessage("saveMessage", uaid, table, message)

  /** One message at its key, or the next ms free or holding its own row; undefined when a newer message of its topic superseded it. */
  const place = Effect.fnUntraced(function*(uaid: string, table: string, message: Notification) {
    let placed = message
    let outcome = yield* putMessage("saveMessages", uaid, table, placed)
    while (outcome === "taken") outcome = yield* putMessage("saveMessages", uaid, table, placed = nextFreeMs(placed))
    return outcome === "stored" ? placed : undefined
  })

  /**
   * One conditional write per row, `SAVE_CONCURRENCY` at a time (thousands of rows within one
   * `storage_timeout`); rows that share a key in order, the first given keeping it (a row moved
   * to a later ms may still meet a row of another key there: the write's condition decides).
   */
  const saveMessages = Effect.fnUntraced(function*(uaid: string, table: string, messages: ReadonlyArray<Notification>) {
    const byKey = new Map<string, Array<number>>()
    messages.forEach((message, i) => {
      const key = messageSortKey(message)
      const indexes = byKey.get(key)
      if (indexes === undefined) byKey.set(key, [i])
      else indexes.push(i)
    })
    const placed: Array<Notification | undefined> = []
    yield* Effect.forEach(byKey.values(), (indexes) =>
      Effect.forEach(indexes, (i) => Effect.map(place(uaid, table, messages[i] as Notification), (n) => {
        placed[i] = n
      }), { discard: true }), { concurrency: SAVE_CONCURRENCY, discard: true })
    return placed.filter((n): n is Notification => n !== undefined)
  })

  /** The user's message rows read page by page until `atMost` of the channel's are counted or the rows end. */
  const countChannelMessages = Effect.fnUntraced(function*(uaid: string, table: string, channelId: string, atMost: number, replacing?: string) {
    const now = yield* Clock.currentTimeMillis
    let counted = 0
    let start: Item | undefined
    do {
      const page = yield* query("countChannelMessages", {
        TableName: table,
        KeyConditionExpression: "#uaid = :uaid AND #chidmessageid BETWEEN :lo AND :hi",
        ExpressionAttributeNames: { "#uaid": "uaid", "#chidmessageid": "chidmessageid" },
        ExpressionAttributeValues: { ":uaid": S(uaid), ":lo": S(TOPIC_PREFIX), ":hi": S(TIMESTAMP_END) },
        ConsistentRead: true,
        ExclusiveStartKey: start
      })
      counted += visibleMessages(page.Items ?? [], now).filter((n) => addsToChannel(n, channelId, replacing)).length
      start = page.LastEvaluatedKey
    } while (start !== undefined && counted < atMost)
    return Math.min(atMost, counted)
  })

  const fetchTopicMessages = Effect.fnUntraced(function*(uaid: string, table: string, limit: number) {
    const now = yield* Clock.currentTimeMillis
    const messages: Array<Notification> = []
    let start: Item | undefined
    do {
      const page = yield* query("fetchTopicMessages", {
        TableName: table,
        KeyConditionExpression: "#uaid = :uaid AND begins_with(#chidmessageid, :prefix)",
        ExpressionAttributeNames: { "#uaid": "uaid", "#chidmessageid": "chidmessageid" },
        ExpressionAttributeValues: { ":uaid": S(uaid), ":prefix": S(TOPIC_PREFIX) },
        ConsistentRead: true,
        Limit: limit,
        ExclusiveStartKey: start
      })
      messages.push(...visibleMessages(page.Items ?? [], now))
      start = page.LastEvaluatedKey
    } while (start !== undefined && messages.length < limit)
    return messages.slice(0, limit)
  })

  /**
   * One page of message rows from `lo` (never a row's own key) to the last timestamp row: `limit`
   * readable rows at most. Expired rows and tombstones are not counted — the Query's `Limit` counts
   * every row, so it is asked again after the last row read until `limit` readable ones came or the
   * rows ended: a page of them ending among topic rows would leave the topic rows after it unread.
   */
  const messagePage = Effect.fnUntraced(function*(operation: string, uaid: string, table: string, lo: string, limit: number) {
    const now = yield* Clock.currentTimeMillis
    const messages: Array<Notification> = []
    let last: string | undefined
    let start: Item | undefined
    do {
      const page = yield* query(operation, {
        TableName: table,
        KeyConditionExpression: "#uaid = :uaid AND #chidmessageid BETWEEN :lo AND :hi",
        ExpressionAttributeNames: { "#uaid": "uaid", "#chidmessageid": "chidmessageid" },
        ExpressionAttributeValues: { ":uaid": S(uaid), ":lo": S(lo), ":hi": S(TIMESTAMP_END) },
        ConsistentRead: true,
        Limit: limit - messages.length,
        ExclusiveStartKey: start
      })
      for (const item of page.Items ?? []) {
        const [message] = visibleMessages([item], now)
        if (message === undefined) continue
        messages.push(message)
        last = item.chidmessageid?.S
      }
      start = page.LastEvaluatedKey
    } while (start !== undefined && messages.length < limit)
    return {
      messages,
      lastSortKey: last === undefined ? undefined : sortKeyMsOf(last),
      more: messages.length === limit
    }
  })

  const fetchMessages = (uaid: string, table: string, limit: number) => messagePage("fetchMessages", uaid, table, TOPIC_PREFIX, limit)

  const fetchTimestampMessages = (uaid: string, table: string, after: number | undefined, limit: number) =>
    messagePage("fetchTimestampMessages", uaid, table, timestampLowerBound(after), limit)

  const deleteMessage = (uaid: string, table: string, key: MessageKey, version?: string) =>
    conditional(call("deleteMessage", (o) =>
      client.send(
        "DeleteItem", {
          TableName: table,
          Key: messageKey(uaid, sortKeyOf(key)),
          ...(version !== undefined
            ? {
              ConditionExpression: "#updateid = :updateid AND attribute_not_exists(#cancelled)",
              ExpressionAttributeNames: { "#updateid": "updateid", "#cancelled": CANCELLED },
              ExpressionAttributeValues: { ":updateid": S(version) }
            }
            : {})
        },
        o
      )))

  /** The row becomes its tombstone: data and headers removed, the flag set, key, version and expiry kept. */
  const bury = (operation: string, uaid: string, table: string, key: MessageKey, version: string) =>
    conditional(call(operation, (o) =>
      client.send(
        "UpdateItem", {
          TableName: table,
          Key: messageKey(uaid, sortKeyOf(key)),
          UpdateExpression: "SET #cancelled = :one REMOVE #data, #headers",
          ConditionExpression: "#updateid = :updateid AND attribute_not_exists(#cancelled)",
          ExpressionAttributeNames: { "#updateid": "updateid", "#cancelled": CANCELLED, "#data": "data", "#headers": "headers" },
          ExpressionAttributeValues: { ":updateid": S(version), ":one": N(1) }
        },
        o
      )))

  const cancelMessage = (uaid: string, table: string, key: MessageKey, version: string) => bury("cancelMessage", uaid, table, key, version)

  /**
   * One conditional UpdateItem per row, `SAVE_CONCURRENCY` at a time: a batch write has no update,
   * and a plain put could write over another message saved at that key since.
   */
  const ackMessages = (uaid: string, table: string, rows: ReadonlyArray<AckedRow>) =>
    Effect.forEach(rows, ({ key, version }) => bury("ackMessages", uaid, table, key, version), {
      concurrency: SAVE_CONCURRENCY,
      discard: true
    })

  return {
    cancelMessage,
    deleteUserRows,
    saveMessage,
    saveMessages,
    // A conditional write per row (no conditional batch write): sessions' saves side by side, as many as one session's rows.
    saveManyMessages: saveManyMessagesEach(saveMessages, SAVE_CONCURRENCY),
    countChannelMessages,
    fetchTopicMessages,
    fetchMessages,
    fetchTimestampMessages,
    deleteMessage,
    ackMessages
  }
}
