/**
 * Storage on the DynamoDB API: AWS, DynamoDB Local, dynalite (the embedded default) or any
 * compatible server (ScyllaDB Alternator), by endpoint URL. Only what all of them support: single
 * item reads and (conditional) writes, Query, BatchWriteItem, table management; no transactions,
 * no PartiQL. Failures become `StorageError`s; server errors are told apart by their `name`, never
 * by message text. Reserved words (`data`, `ttl`, `timestamp`, ...) are always escaped.
 *
 * Expiry is judged by the Effect `Clock` of the caller. The requests themselves (retries, deadlines)
 * are `dynamoRequests.ts`; items `dynamoRows.ts`; creating, checking and dropping tables and stale
 * users `dynamoMaintenance.ts`.
 */
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { type MessageKey, type Notification, sortkeyMs } from "../domain/notification.ts"
import type { UserRecord } from "../domain/user.ts"
import { scopedDynamoClient } from "./dynamoClient.ts"
import { makeMaintenance } from "./dynamoMaintenance.ts"
import { makeReceipts } from "./dynamoReceipts.ts"
import { isNamed, makeRequests, STORAGE_TIMEOUT_MS, withOperationDeadlines } from "./dynamoRequests.ts"
import { type Item, messageKey, messageToItem, N, S, userFromItem, userToItem, userValue, visibleMessages } from "./dynamoRows.ts"
import {
  nextFreeMs,
  type SaveOutcome,
  CHANNEL_END,
  CHANNEL_PREFIX,
  channelSortKey,
  BROADCAST_ATTRIBUTE_PREFIX,
  BROADCASTS_KEY,
  META_SORT_KEY,
  messageSortKey,
  sortKeyMsOf,
  sortKeyOf,
  TIMESTAMP_END,
  timestampLowerBound,
  TOPIC_PREFIX,
  userFields
} from "./model.ts"
import { Storage, StorageError, type UserPatch } from "./Storage.ts"
import { type StorageOptions, tablesByClock } from "./tables.ts"

export interface DynamoOptions extends StorageOptions {
  /** Endpoint URL (DynamoDB Local, dynalite, Alternator); AWS's regional endpoint when absent. */
  readonly endpoint?: string | undefined
  readonly region: string
  /** Deadline of one operation, retries included (ms; default `STORAGE_TIMEOUT_MS`). */
  readonly timeoutMs?: number | undefined
}

/** Rows `saveMessages` writes at once: a save of one session is not to take all the client's sockets. */
const SAVE_CONCURRENCY = 16

// ── the layer ────────────────────────────────────────────────────────────────────────────────────

export const layerDynamo = (options: DynamoOptions): Layer.Layer<Storage> =>
  Layer.effect(
    Storage,
    Effect.gen(function*() {
      const client = yield* scopedDynamoClient(options)
      const router = options.routerTable
      const timeoutMs = options.timeoutMs ?? STORAGE_TIMEOUT_MS
      const requests = makeRequests(client, timeoutMs)
      const { call, conditional, query, queryAll, batchWrite } = requests

      // ── router table ──────────────────────────────────────────────────────────────────────────

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
        if (sets.length === 0 && removes.length === 0) return (yield* getUser(uaid)) !== undefined
        const update = [
          ...(sets.length > 0 ? [`SET ${sets.join(", ")}`] : []),
          ...(removes.length > 0 ? [`REMOVE ${removes.join(", ")}`] : [])
        ].join(" ")
        return yield* conditional(call("updateUser", (o) =>
          client.send(
            "UpdateItem", {
              TableName: router,
              Key: { uaid: S(uaid) },
              UpdateExpression: update,
              ConditionExpression: "attribute_exists(#uaid)",
              ExpressionAttributeNames: names,
              ...(sets.length > 0 ? { ExpressionAttributeValues: values } : {})
            },
            o
          )))
      })

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
          )).pipe(Effect.catchIf(isNamed("ConditionalCheckFailedException"), () => Effect.succeed(undefined)))
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

      // ── broadcasts ────────────────────────────────────────────────────────────────────────────

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

      // ── message tables ────────────────────────────────────────────────────────────────────────

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

      /** A channel's row: `00:{chid}`, no `expiry` (it lives as long as the user). */
      const channelKey = (uaid: string, channelId: string): Item => messageKey(uaid, channelSortKey(channelId))

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

      /** The channel's row (and the count), or else the seed's `chids` set. */
      const removeChannel = Effect.fnUntraced(function*(uaid: string, table: string, channelId: string) {
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
            )).pipe(Effect.catchIf(isNamed("ConditionalCheckFailedException"), () => Effect.void))
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
        // Sets written before channel rows existed (the seed's `chids`).
        const legacy = yield* getMeta("hasChannel", uaid, table, "chids")
        return legacy?.SS?.includes(channelId) ?? false
      })

      /**
       * A timestamp message only goes to a free sort key or over its own row (a save retried after an
       * answer was lost lands where it wrote); a topic message replaces an older one (rows of older
       * versions carry no ms: their `timestamp` seconds are compared).
       */
      const putMessage = (operation: string, uaid: string, table: string, message: Notification): Effect.Effect<SaveOutcome, StorageError> => {
        const condition = message.topic === undefined
          ? {
            ConditionExpression: "attribute_not_exists(#chidmessageid) OR #updateid = :updateid",
            ExpressionAttributeNames: { "#chidmessageid": "chidmessageid", "#updateid": "updateid" },
            ExpressionAttributeValues: { ":updateid": S(message.version) }
          }
          : {
            ConditionExpression:
              "attribute_not_exists(#chidmessageid) OR #sortkey <= :ms OR (attribute_not_exists(#sortkey) AND #timestamp <= :seconds)",
            ExpressionAttributeNames: { "#chidmessageid": "chidmessageid", "#sortkey": "sortkey_timestamp", "#timestamp": "timestamp" },
            ExpressionAttributeValues: { ":ms": N(sortkeyMs(message)), ":seconds": N(Math.floor(sortkeyMs(message) / 1000)) }
          }
        return conditional(call(operation, (o) =>
          client.send("PutItem", { TableName: table, Item: messageToItem(uaid, message), ...condition }, o))).pipe(
            Effect.map((written): SaveOutcome => written ? "stored" : message.topic === undefined ? "taken" : "superseded")
          )
      }

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

      /** One page of message rows from `lo` (never a row's own key) to the last timestamp row, `limit` rows at most. */
      const messagePage = Effect.fnUntraced(function*(operation: string, uaid: string, table: string, lo: string, limit: number) {
        const now = yield* Clock.currentTimeMillis
        const page = yield* query(operation, {
          TableName: table,
          KeyConditionExpression: "#uaid = :uaid AND #chidmessageid BETWEEN :lo AND :hi",
          ExpressionAttributeNames: { "#uaid": "uaid", "#chidmessageid": "chidmessageid" },
          ExpressionAttributeValues: { ":uaid": S(uaid), ":lo": S(lo), ":hi": S(TIMESTAMP_END) },
          ConsistentRead: true,
          Limit: limit
        })
        const items = page.Items ?? []
        const last = items.at(-1)?.chidmessageid?.S
        return {
          messages: visibleMessages(items, now),
          lastSortKey: last === undefined ? undefined : sortKeyMsOf(last),
          more: page.LastEvaluatedKey !== undefined
        }
      })

      const fetchMessages = (uaid: string, table: string, limit: number) => messagePage("fetchMessages", uaid, table, TOPIC_PREFIX, limit)

      const fetchTimestampMessages = (uaid: string, table: string, after: number | undefined, limit: number) =>
        messagePage("fetchTimestampMessages", uaid, table, timestampLowerBound(after), limit)

      const deleteMessages = (uaid: string, table: string, keys: ReadonlyArray<MessageKey>) =>
        batchWrite("deleteMessages", table, keys.map((key) => ({ DeleteRequest: { Key: messageKey(uaid, sortKeyOf(key)) } })))

      const deleteMessage = (uaid: string, table: string, key: MessageKey, version?: string) =>
        conditional(call("deleteMessage", (o) =>
          client.send(
            "DeleteItem", {
              TableName: table,
              Key: messageKey(uaid, sortKeyOf(key)),
              ...(version !== undefined
                ? {
                  ConditionExpression: "#updateid = :updateid",
                  ExpressionAttributeNames: { "#updateid": "updateid" },
                  ExpressionAttributeValues: { ":updateid": S(version) }
                }
                : {})
            },
            o
          )))

      const maintenance = makeMaintenance(client, requests, options, deleteUserRows)
      const receipts = makeReceipts(client, requests, options)

      // The deadline is per operation (`dropUser`, `saveMessages`, ... make several requests), not per request.
      return Storage.of(withOperationDeadlines({
        getUser,
        registerUser,
        resumeUser,
        updateUser,
        dropUser,
        clearNodeId,
        getBroadcasts,
        putBroadcast,
        deleteBroadcast,
        ...tablesByClock(options),
        addChannel,
        addChannels,
        removeChannel,
        getChannels,
        hasChannel,
        saveMessage,
        saveMessages,
        fetchTopicMessages,
        fetchMessages,
        fetchTimestampMessages,
        deleteMessage,
        deleteMessages,
        ...receipts,
        ...maintenance
      }, timeoutMs))
    })
  )
