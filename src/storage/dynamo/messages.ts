/**
 * A user's messages on the DynamoDB API, in each month's message table (keyed by `uaid` and
 * `chidmessageid`): topic messages at `01:{chid}:{topic}`, timestamp messages at
 * `02:{ms}:{chid}`, each with its `expiry` (`model.ts`). The row operations the message rules are
 * written over (`messageRules.ts`): saves are conditional writes, reads Queries of one user's key
 * range (expired rows left out by the caller's Clock, tombstones left out), deletes single, a cancel
 * or an ack an UpdateItem that makes the row its tombstone; saves and acks of many rows done
 * concurrently; and every row a user has in a table deleted at once (`deleteUserRows`).
 */
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import { type Notification, sortkeyMs } from "../../domain/notification.ts"
import type { DynamoClient } from "./client.ts"
import type { DynamoRequests } from "./requests.ts"
import { messageKey, visibleMessages } from "./rows.ts"
import { type Item, messageToItem, N, S } from "../items.ts"
import { makeMessageOperations, type MessageRows, type ReadRow, saveKeepingTheId, saveOutcome } from "../messageRules.ts"
import { CANCELLED, messageSortKey, sortKeyOf } from "../model.ts"
import { type AckedRow, hasReason } from "../Storage.ts"
import { saveManyMessagesEach } from "../manySaves.ts"

/** Rows `saveMessages` and `ackMessages` write at once: a save of one session is not to take all the client's sockets. */
const SAVE_CONCURRENCY = 16

/** The write rule (`mayWriteOver`) as a PutItem's condition (rows of older versions carry no ms: their `timestamp` seconds are compared). */
const putCondition = (message: Notification) =>
  message.topic === undefined
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

/** The condition of a delete or a bury with a version: the row holds that message, not its tombstone. */
const holdsVersion = (version: string) => ({
  ConditionExpression: "#updateid = :updateid AND attribute_not_exists(#cancelled)",
  ExpressionAttributeNames: { "#updateid": "updateid", "#cancelled": CANCELLED },
  ExpressionAttributeValues: { ":updateid": S(version) }
})

const dynamoMessageRows = (client: DynamoClient, { call, conditional, query }: DynamoRequests): MessageRows => ({
  /** A conditional PutItem; a condition that failed is told apart by one read of the row. */
  save: (operation, uaid, table, message) =>
    Effect.gen(() =>
      saveOutcome(
        message,
        conditional(call(operation, (o) => client.send("PutItem", { TableName: table, Item: messageToItem(uaid, message), ...putCondition(message) }, o))),
        () =>
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
      )
    ),
  /**
   * A Query's `Limit` counts every row, so it is asked again after the last row read until `limit`
   * readable ones came or the rows ended; BETWEEN takes its bounds, which are left out.
   */
  readable: Effect.fnUntraced(function*(operation, uaid, table, lo, hi, limit, now) {
    const rows: Array<ReadRow> = []
    let start: Item | undefined
    do {
      const page = yield* query(operation, {
        TableName: table,
        KeyConditionExpression: "#uaid = :uaid AND #chidmessageid BETWEEN :lo AND :hi",
        ExpressionAttributeNames: { "#uaid": "uaid", "#chidmessageid": "chidmessageid" },
        ExpressionAttributeValues: { ":uaid": S(uaid), ":lo": S(lo), ":hi": S(hi) },
        ConsistentRead: true,
        Limit: limit - rows.length,
        ExclusiveStartKey: start
      })
      for (const item of page.Items ?? []) {
        const sortKey = item.chidmessageid?.S
        const [message] = visibleMessages([item], now)
        if (message !== undefined && sortKey !== undefined && sortKey !== lo && sortKey !== hi) rows.push({ sortKey, message })
      }
      start = page.LastEvaluatedKey
    } while (start !== undefined && rows.length < limit)
    return rows
  }),
  remove: (operation, uaid, table, sortKey, version) =>
    conditional(call(operation, (o) =>
      client.send("DeleteItem", { TableName: table, Key: messageKey(uaid, sortKey), ...(version !== undefined ? holdsVersion(version) : {}) }, o))),
  /** Data and headers removed, the flag set, key, version and expiry kept (DynamoDB's TTL takes it when the message would have expired). */
  bury: (operation, uaid, table, sortKey, version) => {
    const condition = holdsVersion(version)
    return conditional(call(operation, (o) =>
      client.send(
        "UpdateItem", {
          TableName: table,
          Key: messageKey(uaid, sortKey),
          UpdateExpression: "SET #cancelled = :one REMOVE #data, #headers",
          ConditionExpression: condition.ConditionExpression,
          ExpressionAttributeNames: { ...condition.ExpressionAttributeNames, "#data": "data", "#headers": "headers" },
          ExpressionAttributeValues: { ...condition.ExpressionAttributeValues, ":one": N(1) }
        },
        o
      )))
  }
})

export const makeMessages = (client: DynamoClient, requests: DynamoRequests) => {
  const { queryAll, batchWrite } = requests
  const rows = dynamoMessageRows(client, requests)

  /** Delete every row (meta row included) a user has in one message table; a missing table has none. */
  const deleteUserRows = Effect.fnUntraced(function*(operation: string, uaid: string, table: string) {
    const keys = yield* queryAll(operation, {
      TableName: table,
      KeyConditionExpression: "#uaid = :uaid",
      ProjectionExpression: "#uaid, #chidmessageid",
      ExpressionAttributeNames: { "#uaid": "uaid", "#chidmessageid": "chidmessageid" },
      ExpressionAttributeValues: { ":uaid": S(uaid) },
      ConsistentRead: true
    }).pipe(Effect.catchIf(hasReason("MissingTable"), () => Effect.succeed([])))
    yield* batchWrite(operation, table, keys.map((Key) => ({ DeleteRequest: { Key } })))
  })

  const operations = makeMessageOperations(rows, {
    /**
     * One conditional write per row, `SAVE_CONCURRENCY` at a time (thousands of rows within one
     * `storage_timeout`); rows that share a key in order, the first given keeping it (a row moved
     * to a later ms may still meet a row of another key there: the write's condition decides).
     */
    saveMessages: Effect.fnUntraced(function*(uaid: string, table: string, messages: ReadonlyArray<Notification>) {
      const save = (message: Notification) => rows.save("saveMessages", uaid, table, message)
      const placed: Array<Notification | undefined> = []
      const byKey = Map.groupBy(messages.keys(), (i) => messageSortKey(messages[i] as Notification))
      yield* Effect.forEach(byKey.values(), (indexes) =>
        Effect.forEach(indexes, (i) => Effect.map(saveKeepingTheId(save, messages[i] as Notification), (n) => {
          placed[i] = n
        }), { discard: true }), { concurrency: SAVE_CONCURRENCY, discard: true })
      return placed.filter((n): n is Notification => n !== undefined)
    }),
    /**
     * One conditional UpdateItem per row, `SAVE_CONCURRENCY` at a time: a batch write has no
     * update, and a plain put could write over another message saved at that key since.
     */
    ackMessages: (uaid: string, table: string, acked: ReadonlyArray<AckedRow>) =>
      Effect.flatMap(Clock.currentTimeMillis, (now) =>
        Effect.forEach(acked, ({ key, version }) => rows.bury("ackMessages", uaid, table, sortKeyOf(key), version, now), {
          concurrency: SAVE_CONCURRENCY,
          discard: true
        }))
  })
  // A conditional write per row (no conditional batch write): sessions' saves side by side, as many as one session's rows.
  return { deleteUserRows, ...operations, saveManyMessages: saveManyMessagesEach(operations.saveMessages, SAVE_CONCURRENCY) }
}
