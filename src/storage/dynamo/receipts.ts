/**
 * Push receipts on the DynamoDB API: one table, `{router_table}_receipts`, hash key `subscription`
 * (the receipt subscription id), range key `message`: the subscription's own row (`" "`, its expiry)
 * and one status row per message sent with it (range key = the message id). Every row has `expiry`
 * (seconds; the table's TTL attribute where the server has TTL), and reads leave out expired rows.
 * Status rows are written by `UpdateItem` only, field by field, an outcome once. Only the write
 * that opens a message's row may make it; every other write has the condition that the row is
 * there, so a step that comes after the row was removed (its receipt collected) cannot make it
 * again without an outcome, which would have the message reported a second time.
 */
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import type { MessageStatus, StatusUpdate } from "../../domain/receipt.ts"
import type { DynamoClient } from "./client.ts"
import type { DynamoRequests } from "./requests.ts"
import { type Item, N, num, S } from "../items.ts"
import { isVisible, META_SORT_KEY } from "../model.ts"
import { type ReceiptRowReader, statusFromFields, statusUpdateFields, subscriptionFromRows } from "../receiptRows.ts"
import { receiptTableName, type StorageOptions } from "../tables.ts"

const statusFromItem = (item: Item): MessageStatus =>
  statusFromFields(item.message?.S ?? "", (attribute) => num(item[attribute]), item.outcome?.S)

const ITEMS: ReceiptRowReader<Item> = { message: (item) => item.message?.S, expiry: (item) => num(item.expiry), status: statusFromItem }

const key = (subscription: string, message: string): Item => ({ subscription: S(subscription), message: S(message) })

/** The receipt table's operations of the `Storage` service on the DynamoDB API. */
export const makeDynamoReceipts = (client: DynamoClient, { call, conditional, queryAll, batchWrite }: DynamoRequests, options: StorageOptions) => {
  const table = receiptTableName(options)

  const createReceiptSubscription = (id: string, expiry: number) =>
    call("createReceiptSubscription", (o) =>
      client.send("PutItem", { TableName: table, Item: { ...key(id, META_SORT_KEY), expiry: N(expiry) } }, o)).pipe(Effect.asVoid)

  const touchReceiptSubscription = Effect.fnUntraced(function*(id: string, expiry: number) {
    const now = Math.floor((yield* Clock.currentTimeMillis) / 1000)
    return yield* conditional(call("touchReceiptSubscription", (o) =>
      client.send(
        "UpdateItem", {
          TableName: table,
          Key: key(id, META_SORT_KEY),
          UpdateExpression: "SET #expiry = :expiry",
          ConditionExpression: "attribute_exists(#subscription) AND #expiry > :now",
          ExpressionAttributeNames: { "#expiry": "expiry", "#subscription": "subscription" },
          ExpressionAttributeValues: { ":expiry": N(expiry), ":now": N(now) }
        },
        o
      )))
  })

  /** A status write: `open` may make the row; otherwise the row must be there. False when the condition did not hold. */
  const writeMessageStatus = (operation: string, open: boolean) => (subscription: string, messageId: string, update: StatusUpdate) => {
    const names: Record<string, string> = {}
    const values: Item = {}
    const sets: Array<string> = []
    for (const [attribute, value] of statusUpdateFields(update)) {
      names[`#${attribute}`] = attribute
      values[`:${attribute}`] = typeof value === "string" ? S(value) : N(value)
      sets.push(`#${attribute} = :${attribute}`)
    }
    const conditions: Array<string> = []
    if (!open) {
      names["#subscription"] = "subscription"
      conditions.push("attribute_exists(#subscription)")
    }
    if (update.outcome !== undefined) conditions.push("attribute_not_exists(#outcome)")
    return conditional(call(operation, (o) =>
      client.send(
        "UpdateItem", {
          TableName: table,
          Key: key(subscription, messageId),
          UpdateExpression: `SET ${sets.join(", ")}`,
          ...(conditions.length > 0 ? { ConditionExpression: conditions.join(" AND ") } : {}),
          ExpressionAttributeNames: names,
          ExpressionAttributeValues: values
        },
        o
      )))
  }
  const openMessageStatus = writeMessageStatus("openMessageStatus", true)
  const updateMessageStatus = writeMessageStatus("updateMessageStatus", false)

  const getMessageStatus = Effect.fnUntraced(function*(subscription: string, messageId: string) {
    const result = yield* call("getMessageStatus", (o) =>
      client.send("GetItem", { TableName: table, Key: key(subscription, messageId), ConsistentRead: true }, o))
    const item = result.Item
    if (item === undefined || !isVisible(num(item.expiry), yield* Clock.currentTimeMillis)) return undefined
    return statusFromItem(item)
  })

  const readReceiptSubscription = Effect.fnUntraced(function*(id: string) {
    const items = yield* queryAll("readReceiptSubscription", {
      TableName: table,
      KeyConditionExpression: "#subscription = :subscription",
      ExpressionAttributeNames: { "#subscription": "subscription" },
      ExpressionAttributeValues: { ":subscription": S(id) },
      ConsistentRead: true
    })
    return subscriptionFromRows(items, yield* Clock.currentTimeMillis, ITEMS)
  })

  const deleteMessageStatuses = (subscription: string, messageIds: ReadonlyArray<string>) =>
    batchWrite("deleteMessageStatuses", table, messageIds.map((id) => ({ DeleteRequest: { Key: key(subscription, id) } })))

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
