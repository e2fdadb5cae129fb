/**
 * A user's channel set on the DynamoDB API, in each month's message table (keyed by `uaid` and
 * `chidmessageid`): one row per channel (`00:{chid}`, no expiry), and the user's meta row
 * (sort key `" "`) holding `channel_count`, which bounds the set. Sets written before channel rows
 * existed are a `chids` string set on the meta row: still read, and a channel removed from it.
 */
import * as Effect from "effect/Effect"
import type { DynamoClient } from "./client.ts"
import type { DynamoRequests } from "./requests.ts"
import { messageKey } from "./rows.ts"
import { type Item, N, S } from "../items.ts"
import { CHANNEL_END, CHANNEL_PREFIX, channelSortKey, META_SORT_KEY } from "../model.ts"
import { hasReason } from "../Storage.ts"

/** A channel's row: `00:{chid}`, no `expiry` (it lives as long as the user). */
const channelKey = (uaid: string, channelId: string): Item => messageKey(uaid, channelSortKey(channelId))

export const makeChannels = (client: DynamoClient, requests: DynamoRequests) => ({
  ...makeChannelAdds(client, requests),
  removeChannel: makeRemoveChannel(client, requests),
  ...makeChannelReads(client, requests)
})

/** Adding channels: one (bounded by the meta row's count), or many at once (a month move). */
const makeChannelAdds = (client: DynamoClient, { call, conditional, queryAll, batchWrite }: DynamoRequests) => {
  /** Count the user's channel rows once more and store the count (after a bulk copy). */
  const recount = Effect.fnUntraced(function*(operation: string, uaid: string, table: string) {
    const rows = yield* queryAll(operation, {
      TableName: table,
      KeyConditionExpression: "#uaid = :uaid AND begins_with(#chidmessageid, :prefix)",
      ProjectionExpression: "#chidmessageid",
      ExpressionAttributeNames: { "#uaid": "uaid", "#chidmessageid": "chidmessageid" },
      ExpressionAttributeValues: { ":uaid": S(uaid), ":prefix": S(CHANNEL_PREFIX) },
      ConsistentRead: true
    })
    yield* call(operation, (o) =>
      client.send(
        "UpdateItem", {
          TableName: table,
          Key: messageKey(uaid, META_SORT_KEY),
          UpdateExpression: "SET #count = :count",
          ExpressionAttributeNames: { "#count": "channel_count" },
          ExpressionAttributeValues: { ":count": N(rows.length) }
        },
        o
      ))
  })

  /**
   * A new channel's row, then one more in the meta row's `channel_count` unless that reaches
   * `maxChannels` (then the row goes again). A row that was there already: nothing to count.
   */
  const addChannel = Effect.fnUntraced(function*(uaid: string, table: string, channelId: string, maxChannels?: number) {
    const created = yield* conditional(call("addChannel", (o) =>
      client.send(
        "PutItem", {
          TableName: table,
          Item: channelKey(uaid, channelId),
          ConditionExpression: "attribute_not_exists(#chidmessageid)",
          ExpressionAttributeNames: { "#chidmessageid": "chidmessageid" }
        },
        o
      )))
    if (!created) return true
    const counted = yield* conditional(call("addChannel", (o) =>
      client.send(
        "UpdateItem", {
          TableName: table,
          Key: messageKey(uaid, META_SORT_KEY),
          UpdateExpression: "ADD #count :one",
          ...(maxChannels === undefined ? {} : { ConditionExpression: "attribute_not_exists(#count) OR #count < :max" }),
          ExpressionAttributeNames: { "#count": "channel_count" },
          ExpressionAttributeValues: { ":one": N(1), ...(maxChannels === undefined ? {} : { ":max": N(maxChannels) }) }
        },
        o
      )))
    if (counted) return true
    yield* call("addChannel", (o) => client.send("DeleteItem", { TableName: table, Key: channelKey(uaid, channelId) }, o))
    return false
  })

  const addChannels = Effect.fnUntraced(function*(uaid: string, table: string, channelIds: Iterable<string>) {
    const chids = Array.from(new Set(channelIds))
    if (chids.length === 0) return
    yield* batchWrite("addChannels", table, chids.map((chid) => ({ PutRequest: { Item: channelKey(uaid, chid) } })))
    yield* recount("addChannels", uaid, table)
  })

  return { addChannel, addChannels }
}

/** The channel's row (and the count), or else the meta row's `chids` set (written before channel rows existed). */
const makeRemoveChannel = (client: DynamoClient, { call, conditional }: DynamoRequests) =>
  Effect.fnUntraced(function*(uaid: string, table: string, channelId: string) {
    const removed = yield* call("removeChannel", (o) =>
      client.send("DeleteItem", { TableName: table, Key: channelKey(uaid, channelId), ReturnValues: "ALL_OLD" }, o))
    if (removed.Attributes !== undefined) {
      yield* call("removeChannel", (o) =>
        client.send(
          "UpdateItem", {
            TableName: table,
            Key: messageKey(uaid, META_SORT_KEY),
            UpdateExpression: "ADD #count :minus",
            ConditionExpression: "#count > :zero",
            ExpressionAttributeNames: { "#count": "channel_count" },
            ExpressionAttributeValues: { ":minus": N(-1), ":zero": N(0) }
          },
          o
        )).pipe(Effect.catchIf(hasReason("Conflict"), () => Effect.void))
      return true
    }
    return yield* conditional(call("removeChannel", (o) =>
      client.send(
        "UpdateItem", {
          TableName: table,
          Key: messageKey(uaid, META_SORT_KEY),
          UpdateExpression: "DELETE #chids :chids",
          ConditionExpression: "contains(#chids, :chid)",
          ExpressionAttributeNames: { "#chids": "chids" },
          ExpressionAttributeValues: { ":chids": { SS: [channelId] }, ":chid": S(channelId) }
        },
        o
      )))
  })

/** Reading the set, whole or one channel of it. */
const makeChannelReads = (client: DynamoClient, { call, queryAll }: DynamoRequests) => {
  const getMeta = (operation: string, uaid: string, table: string, attribute: string) =>
    call(operation, (o) =>
      client.send(
        "GetItem", {
          TableName: table,
          Key: messageKey(uaid, META_SORT_KEY),
          ProjectionExpression: "#a",
          ExpressionAttributeNames: { "#a": attribute },
          ConsistentRead: true
        },
        o
      )).pipe(Effect.map((result) => result.Item?.[attribute]))

  const getChannels = Effect.fnUntraced(function*(uaid: string, table: string) {
    const rows = yield* queryAll("getChannels", {
      TableName: table,
      KeyConditionExpression: "#uaid = :uaid AND #chidmessageid BETWEEN :meta AND :last",
      ProjectionExpression: "#chidmessageid, #chids",
      ExpressionAttributeNames: { "#uaid": "uaid", "#chidmessageid": "chidmessageid", "#chids": "chids" },
      ExpressionAttributeValues: { ":uaid": S(uaid), ":meta": S(META_SORT_KEY), ":last": S(CHANNEL_END) },
      ConsistentRead: true
    })
    const channels = new Set<string>()
    for (const row of rows) {
      const key = row.chidmessageid?.S ?? ""
      if (key.startsWith(CHANNEL_PREFIX)) channels.add(key.slice(CHANNEL_PREFIX.length))
      for (const chid of row.chids?.SS ?? []) channels.add(chid)
    }
    return channels as ReadonlySet<string>
  })

  const hasChannel = Effect.fnUntraced(function*(uaid: string, table: string, channelId: string) {
    const row = yield* call("hasChannel", (o) =>
      client.send(
        "GetItem", {
          TableName: table,
          Key: channelKey(uaid, channelId),
          ProjectionExpression: "#uaid",
          ExpressionAttributeNames: { "#uaid": "uaid" },
          ConsistentRead: true
        },
        o
      ))
    if (row.Item !== undefined) return true
    // Sets written before channel rows existed: the meta row's `chids`.
    const legacy = yield* getMeta("hasChannel", uaid, table, "chids")
    return legacy?.SS?.includes(channelId) ?? false
  })

  return { getChannels, hasChannel }
}
