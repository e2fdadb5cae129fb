/**
 * The router table on the DynamoDB API: one item per user, keyed by `uaid`, holding its router
 * record (router type and data, the node it is connected to and since when, its current message
 * table, its last connection month, its urgency), and one more item, keyed `broadcasts`, holding the
 * broadcast set (one attribute per broadcast id). Dropping a user also deletes its rows in its
 * current message table (`deleteUserRows`, `dynamo/messages.ts`).
 */
import * as Effect from "effect/Effect"
import type { UserRecord } from "../../domain/user.ts"
import type { DynamoClient } from "./client.ts"
import type { DynamoRequests } from "./requests.ts"
import { type Item, N, S, userFromItem, userToItem, userValue } from "../items.ts"
import { BROADCAST_ATTRIBUTE_PREFIX, BROADCASTS_KEY, userFields } from "../model.ts"
import { clearNodeIdsEach, hasReason, type StorageError, type UserPatch } from "../Storage.ts"
import type { StorageOptions } from "../tables.ts"

/** Records `clearNodeIds` clears at once: one request each (DynamoDB has no conditional batch write). */
const CLEAR_CONCURRENCY = 64

/**
 * The UpdateItem expression of a patch: `SET` for the fields it gives a value, `REMOVE` for those
 * it sets undefined (names and values bound, `#uaid` among them); "" when it changes nothing.
 */
const patchExpression = (patch: UserPatch) => {
  const names: Record<string, string> = { "#uaid": "uaid" }
  const values: Item = {}
  const sets: Array<string> = []
  const removes: Array<string> = []
  for (const [field, attribute] of userFields) {
    if (!(field in patch)) continue
    names[`#${attribute}`] = attribute
    const value = patch[field]
    if (value === undefined) removes.push(`#${attribute}`)
    else {
      values[`:${attribute}`] = userValue(field, value)
      sets.push(`#${attribute} = :${attribute}`)
    }
  }
  const update = [
    ...(sets.length > 0 ? [`SET ${sets.join(", ")}`] : []),
    ...(removes.length > 0 ? [`REMOVE ${removes.join(", ")}`] : [])
  ].join(" ")
  return { update, names, values }
}

export const makeUsers = (
  client: DynamoClient,
  { call, conditional }: DynamoRequests,
  options: StorageOptions,
  /** Delete a user's rows in a message table (after its router record is gone). */
  deleteUserRows: (operation: string, uaid: string, table: string) => Effect.Effect<void, StorageError>
) => {
  const router = options.routerTable

  const getUser = Effect.fnUntraced(function*(uaid: string) {
    const result = yield* call("getUser", (o) =>
      client.send("GetItem", { TableName: router, Key: { uaid: S(uaid) }, ConsistentRead: true }, o))
    return result.Item === undefined ? undefined : userFromItem(result.Item)
  })

  /** Put the record if the condition holds (`#uaid`, `#connected_at` and `:connected_at` are bound). */
  const putUser = (operation: string, user: UserRecord, condition: string) =>
    conditional(call(operation, (o) =>
      client.send(
        "PutItem", {
          TableName: router,
          Item: userToItem(user),
          ConditionExpression: condition,
          ExpressionAttributeNames: { "#uaid": "uaid", "#connected_at": "connected_at" },
          ExpressionAttributeValues: { ":connected_at": N(user.connectedAt) }
        },
        o
      )))

  const registerUser = (user: UserRecord) =>
    putUser("registerUser", user, "attribute_not_exists(#uaid) OR #connected_at < :connected_at")

  const resumeUser = (user: UserRecord) =>
    putUser("resumeUser", user, "attribute_exists(#uaid) AND #connected_at < :connected_at")

  const updateUser = Effect.fnUntraced(function*(uaid: string, patch: UserPatch) {
    const { update, names, values } = patchExpression(patch)
    if (update === "") return (yield* getUser(uaid)) !== undefined
    return yield* conditional(call("updateUser", (o) =>
      client.send(
        "UpdateItem", {
          TableName: router,
          Key: { uaid: S(uaid) },
          UpdateExpression: update,
          ConditionExpression: "attribute_exists(#uaid)",
          ExpressionAttributeNames: names,
          ...(Object.keys(values).length > 0 ? { ExpressionAttributeValues: values } : {})
        },
        o
      )))
  })

  const dropUser = Effect.fnUntraced(function*(uaid: string, options?: { readonly ifConnectedAt?: number }) {
    const ifConnectedAt = options?.ifConnectedAt
    const result = yield* call("dropUser", (o) =>
      client.send(
        "DeleteItem", {
          TableName: router,
          Key: { uaid: S(uaid) },
          ReturnValues: "ALL_OLD",
          ...(ifConnectedAt === undefined ? {} : {
            ConditionExpression: "#connected_at = :connected_at",
            ExpressionAttributeNames: { "#connected_at": "connected_at" },
            ExpressionAttributeValues: { ":connected_at": N(ifConnectedAt) }
          })
        },
        o
      )).pipe(Effect.catchIf(hasReason("Conflict"), () => Effect.succeed(undefined)))
    if (result?.Attributes === undefined) return false
    const table = result.Attributes.current_month?.S
    if (table !== undefined) yield* deleteUserRows("dropUser", uaid, table)
    return true
  })

  const clearNodeId = (uaid: string, nodeId: string, connectedAt: number) =>
    conditional(call("clearNodeId", (o) =>
      client.send(
        "UpdateItem", {
          TableName: router,
          Key: { uaid: S(uaid) },
          UpdateExpression: "REMOVE #node_id",
          ConditionExpression: "#node_id = :node_id AND #connected_at = :connected_at",
          ExpressionAttributeNames: { "#node_id": "node_id", "#connected_at": "connected_at" },
          ExpressionAttributeValues: { ":node_id": S(nodeId), ":connected_at": N(connectedAt) }
        },
        o
      )))

  const clearNodeIds = clearNodeIdsEach(clearNodeId, CLEAR_CONCURRENCY)

  return { getUser, registerUser, resumeUser, updateUser, dropUser, clearNodeId, clearNodeIds, ...makeBroadcasts(client, call, conditional, router) }
}

/** The broadcast set: one item of the router table, keyed `broadcasts`, one attribute per broadcast id. */
const makeBroadcasts = (
  client: DynamoClient,
  call: DynamoRequests["call"],
  conditional: DynamoRequests["conditional"],
  router: string
) => {
  const getBroadcasts = call("getBroadcasts", (o) =>
    client.send("GetItem", { TableName: router, Key: { uaid: S(BROADCASTS_KEY) }, ConsistentRead: true }, o)).pipe(
      Effect.map((result) => {
        const set = new Map<string, string>()
        for (const [name, value] of Object.entries(result.Item ?? {})) {
          if (name.startsWith(BROADCAST_ATTRIBUTE_PREFIX) && value.S !== undefined) set.set(name.slice(BROADCAST_ATTRIBUTE_PREFIX.length), value.S)
        }
        return set as ReadonlyMap<string, string>
      })
    )

  const putBroadcast = (id: string, version: string) =>
    call("putBroadcast", (o) =>
      client.send(
        "UpdateItem", {
          TableName: router,
          Key: { uaid: S(BROADCASTS_KEY) },
          UpdateExpression: "SET #b = :version",
          ExpressionAttributeNames: { "#b": BROADCAST_ATTRIBUTE_PREFIX + id },
          ExpressionAttributeValues: { ":version": S(version) }
        },
        o
      )).pipe(Effect.asVoid)

  const deleteBroadcast = (id: string) =>
    conditional(call("deleteBroadcast", (o) =>
      client.send(
        "UpdateItem", {
          TableName: router,
          Key: { uaid: S(BROADCASTS_KEY) },
          UpdateExpression: "REMOVE #b",
          ConditionExpression: "attribute_exists(#b)",
          ExpressionAttributeNames: { "#b": BROADCAST_ATTRIBUTE_PREFIX + id }
        },
        o
      )))

  return { getBroadcasts, putBroadcast, deleteBroadcast }
}
