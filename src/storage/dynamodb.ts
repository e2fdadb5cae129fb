/**
 * Storage on the DynamoDB API: AWS, DynamoDB Local, dynalite (the embedded default) or any
 * compatible server (ScyllaDB Alternator), by endpoint URL. Only what all of them support: single
 * item reads and (conditional) writes, Query, BatchWriteItem, table management; no transactions,
 * no PartiQL. Failures become `StorageError`s; server errors are told apart by their `name`, never
 * by message text. Reserved words (`data`, `ttl`, `timestamp`, ...) are always escaped.
 *
 * Waiting for the server (throughput back-off, unprocessed batch items, table status) runs on the
 * live clock even under a `TestClock`: it is about the real server. Expiry is judged by the Effect
 * `Clock` of the caller.
 */
import type { AttributeValue, CreateTableCommandInput, QueryCommandInput, WriteRequest } from "@aws-sdk/client-dynamodb"
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Predicate from "effect/Predicate"
import * as Schedule from "effect/Schedule"
import { type MessageKey, type Notification, sortkeyMs, URGENCIES } from "../domain/notification.ts"
import type { UserRecord } from "../domain/user.ts"
import {
  nextFreeMs,
  type SaveOutcome,
  CHANNEL_END,
  CHANNEL_PREFIX,
  channelSortKey,
  expiryOf,
  isVisible,
  messageSortKey,
  BROADCAST_ATTRIBUTE_PREFIX,
  BROADCASTS_KEY,
  META_SORT_KEY,
  parseSortKey,
  plainData,
  sortKeyMsOf,
  sortKeyOf,
  TIMESTAMP_END,
  timestampLowerBound,
  TOPIC_PREFIX
} from "./model.ts"
import { makeDynamoClient } from "./dynamoClient.ts"
import { Storage, StorageError, type TableStatus, type UserPatch } from "./Storage.ts"
import {
  activeTableNames,
  isMessageTable,
  lastConnectKeys,
  messageTablesOf,
  type StorageOptions,
  staleMonths,
  tablesByClock
} from "./tables.ts"

export interface DynamoOptions extends StorageOptions {
  /** Endpoint URL (DynamoDB Local, dynalite, Alternator); AWS's regional endpoint when absent. */
  readonly endpoint?: string | undefined
  readonly region: string
  /** Deadline of one operation, retries included (ms; default `STORAGE_TIMEOUT_MS`). */
  readonly timeoutMs?: number | undefined
}

/** Default deadline of one storage operation: a server that accepts and never answers must not park callers. */
export const STORAGE_TIMEOUT_MS = 5_000

/** The cause of a `StorageError` whose operation ran out of time. */
export class StorageTimeout extends Error {
  override readonly name = "StorageTimeout"
  readonly timeoutMs: number
  constructor(timeoutMs: number) {
    super(`no answer within ${timeoutMs} ms`)
    this.timeoutMs = timeoutMs
  }
}

type Item = Record<string, AttributeValue>

export const ACCESS_INDEX = "AccessIndex"
const BATCH_WRITE_MAX = 25
const STALE_PAGE = 25
const THROUGHPUT_ERRORS = new Set(["ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded"])
/** Connection errors worth one more try (a reused keep-alive socket the server had closed). */
const TRANSIENT_CODES = new Set(["ECONNRESET", "EPIPE", "ETIMEDOUT"])
/** What servers without TTL answer to `UpdateTimeToLive` (dynalite: UnknownOperationException). */
const TTL_UNSUPPORTED = new Set(["UnknownOperationException", "UnsupportedOperationException", "NotImplementedException"])

/** The `name` of an SDK error (`ConditionalCheckFailedException`, ...). */
export const errorName = (cause: unknown): string | undefined =>
  Predicate.hasProperty(cause, "name") && Predicate.isString(cause.name) ? cause.name : undefined

const isNamed = (name: string) => (error: StorageError): boolean => errorName(error.cause) === name

/** Throttling or a dropped connection: retried a few times, quickly. */
const isRetryable = (error: StorageError): boolean =>
  THROUGHPUT_ERRORS.has(errorName(error.cause) ?? "") ||
  (Predicate.hasProperty(error.cause, "code") && TRANSIENT_CODES.has(String(error.cause.code)))

const liveClock = Clock.Clock.defaultValue()
/** 25, 50, 100, 200 ms (jittered): a throttled request fails within about half a second. */
const retryBackoff = Schedule.exponential("25 millis").pipe(Schedule.jittered, Schedule.upTo({ times: 4 }))

// ── attribute values ─────────────────────────────────────────────────────────────────────────────

const S = (value: string): AttributeValue => ({ S: value })
const N = (value: number): AttributeValue => ({ N: String(value) })

const marshal = (value: unknown): AttributeValue => {
  if (value === null || value === undefined) return { NULL: true }
  if (Predicate.isString(value)) return S(value)
  if (Predicate.isNumber(value)) return N(value)
  if (Predicate.isBoolean(value)) return { BOOL: value }
  if (Array.isArray(value)) return { L: value.map(marshal) }
  if (Predicate.isObject(value)) {
    return { M: Object.fromEntries(Object.entries(value).map(([k, v]) => [k, marshal(v)])) }
  }
  return S(String(value))
}

const unmarshal = (value: AttributeValue): unknown => {
  if (value.S !== undefined) return value.S
  if (value.N !== undefined) return Number(value.N)
  if (value.BOOL !== undefined) return value.BOOL
  if (value.NULL !== undefined) return null
  if (value.L !== undefined) return value.L.map(unmarshal)
  if (value.M !== undefined) return Object.fromEntries(Object.entries(value.M).map(([k, v]) => [k, unmarshal(v)]))
  if (value.SS !== undefined) return value.SS
  if (value.NS !== undefined) return value.NS.map(Number)
  return undefined
}

const num = (value: AttributeValue | undefined): number | undefined =>
  value?.N === undefined ? undefined : Number(value.N)

// ── router records ───────────────────────────────────────────────────────────────────────────────

const USER_ATTRIBUTES = {
  connectedAt: "connected_at",
  routerType: "router_type",
  routerData: "router_data",
  nodeId: "node_id",
  lastConnect: "last_connect",
  currentMonth: "current_month",
  recordVersion: "record_version"
} as const satisfies Record<keyof UserPatch, string>

const userFields = Object.entries(USER_ATTRIBUTES) as ReadonlyArray<[keyof UserPatch, string]>

const userValue = (field: keyof UserPatch, value: unknown): AttributeValue =>
  marshal(field === "routerData" ? plainData(value as Record<string, unknown>) : value)

const userToItem = (user: UserRecord): Item => {
  const item: Item = { uaid: S(user.uaid) }
  for (const [field, attribute] of userFields) {
    if (user[field] !== undefined) item[attribute] = userValue(field, user[field])
  }
  return item
}

const userFromItem = (item: Item): UserRecord => {
  const fields: Record<string, unknown> = { uaid: item.uaid?.S, routerType: "webpush", routerData: {}, connectedAt: 0 }
  for (const [field, attribute] of userFields) {
    const value = item[attribute]
    if (value !== undefined) fields[field] = unmarshal(value)
  }
  return fields as unknown as UserRecord
}

// ── message rows ─────────────────────────────────────────────────────────────────────────────────

const messageToItem = (uaid: string, n: Notification): Item => ({
  uaid: S(uaid),
  chidmessageid: S(messageSortKey(n)),
  updateid: S(n.version),
  ttl: N(n.ttl),
  timestamp: N(n.timestamp),
  expiry: N(expiryOf(n)),
  ...(n.topic !== undefined ? { topic: S(n.topic), ...(n.sortkeyTimestamp !== undefined ? { sortkey_timestamp: N(n.sortkeyTimestamp) } : {}) } : {}),
  ...(n.urgency !== undefined ? { urgency: S(n.urgency) } : {}),
  ...(n.data !== undefined ? { data: S(n.data) } : {}),
  ...(n.headers !== undefined ? { headers: marshal(n.headers) } : {})
})

const messageFromItem = (item: Item): Notification | undefined => {
  const key = parseSortKey(item.chidmessageid?.S ?? "")
  const version = item.updateid?.S
  if (key === undefined || version === undefined) return undefined
  const data = item.data?.S
  const headers = item.headers?.M
  const urgency = URGENCIES.find((u) => u === item.urgency?.S)
  return {
    channelId: key.channelId,
    version,
    ttl: num(item.ttl) ?? 0,
    timestamp: num(item.timestamp) ?? 0,
    ...(key.topic !== undefined
      ? { topic: key.topic, ...(item.sortkey_timestamp?.N !== undefined ? { sortkeyTimestamp: Number(item.sortkey_timestamp.N) } : {}) }
      : { sortkeyTimestamp: key.sortkeyTimestamp }),
    ...(urgency !== undefined ? { urgency } : {}),
    ...(data !== undefined ? { data } : {}),
    ...(headers !== undefined ? { headers: unmarshal({ M: headers }) as Record<string, string> } : {})
  }
}

const rowVisible = (item: Item, nowMs: number): boolean =>
  isVisible(num(item.expiry) ?? (num(item.timestamp) ?? 0) + (num(item.ttl) ?? 0), nowMs)

const visibleMessages = (items: ReadonlyArray<Item>, nowMs: number): Array<Notification> =>
  items.flatMap((item) => {
    const message = rowVisible(item, nowMs) ? messageFromItem(item) : undefined
    return message === undefined ? [] : [message]
  })

const messageKey = (uaid: string, sortKey: string): Item => ({ uaid: S(uaid), chidmessageid: S(sortKey) })

const chunks = <A>(items: ReadonlyArray<A>, size: number): Array<ReadonlyArray<A>> =>
  Array.from({ length: Math.ceil(items.length / size) }, (_, i) => items.slice(i * size, (i + 1) * size))

// ── the layer ────────────────────────────────────────────────────────────────────────────────────

export const layerDynamo = (options: DynamoOptions): Layer.Layer<Storage> =>
  Layer.effect(
    Storage,
    Effect.gen(function*() {
      const client = yield* Effect.acquireRelease(
        Effect.promise(() => makeDynamoClient(options)),
        (c) => Effect.sync(() => c.destroy())
      )
      const router = options.routerTable
      const timeoutMs = options.timeoutMs ?? STORAGE_TIMEOUT_MS

      /**
       * One request; throttling and dropped connections retried with a short bounded back-off, all
       * within the deadline (a request still out then is aborted).
       */
      const call = <A>(operation: string, send: (o: { abortSignal: AbortSignal }) => Promise<A>) =>
        Effect.tryPromise({
          try: (abortSignal) => send({ abortSignal }),
          catch: (cause) => new StorageError({ operation, cause })
        }).pipe(
          Effect.retry({ schedule: retryBackoff, while: isRetryable }),
          Effect.timeoutOrElse({
            duration: timeoutMs,
            orElse: () => Effect.fail(new StorageError({ operation, cause: new StorageTimeout(timeoutMs) }))
          }),
          Effect.provideService(Clock.Clock, liveClock)
        )

      /** `true` when the conditional write happened, `false` when its condition did not hold. */
      const conditional = (self: Effect.Effect<unknown, StorageError>) =>
        self.pipe(
          Effect.as(true),
          Effect.catchIf(isNamed("ConditionalCheckFailedException"), () => Effect.succeed(false))
        )

      const query = (operation: string, input: QueryCommandInput) =>
        call(operation, (o) => client.send("Query", input, o))

      /** Every item of a query, page by page. */
      const queryAll = Effect.fnUntraced(function*(operation: string, input: QueryCommandInput) {
        const items: Array<Item> = []
        let start: Item | undefined
        do {
          const page = yield* query(operation, { ...input, ExclusiveStartKey: start })
          items.push(...(page.Items ?? []))
          start = page.LastEvaluatedKey
        } while (start !== undefined)
        return items
      })

      /** BatchWriteItem in chunks of 25, resubmitting unprocessed items with back-off. */
      const batchWrite = Effect.fnUntraced(function*(
        operation: string,
        table: string,
        requests: ReadonlyArray<WriteRequest>
      ) {
        for (const chunk of chunks(requests, BATCH_WRITE_MAX)) {
          let pending: Array<WriteRequest> = [...chunk]
          for (let attempt = 0; pending.length > 0; attempt++) {
            if (attempt >= 8) {
              return yield* new StorageError({ operation, cause: `${pending.length} unprocessed items in ${table}` })
            }
            if (attempt > 0) yield* Effect.sleep(Math.min(1000, 25 * 2 ** attempt))
            const result = yield* call(operation, (o) =>
              client.send("BatchWriteItem", { RequestItems: { [table]: pending } }, o))
            pending = result.UnprocessedItems?.[table] ?? []
          }
        }
      }, Effect.provideService(Clock.Clock, liveClock))

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
       * A timestamp message only goes to a free sort key; a topic message replaces an older one (rows
       * of older versions carry no ms: their `timestamp` seconds are compared).
       */
      const putMessage = (operation: string, uaid: string, table: string, message: Notification): Effect.Effect<SaveOutcome, StorageError> => {
        const condition = message.topic === undefined
          ? {
            ConditionExpression: "attribute_not_exists(#chidmessageid)",
            ExpressionAttributeNames: { "#chidmessageid": "chidmessageid" }
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

      const saveMessages = Effect.fnUntraced(function*(uaid: string, table: string, messages: ReadonlyArray<Notification>) {
        const saved: Array<Notification> = []
        for (const message of messages) {
          let placed = message
          let outcome = yield* putMessage("saveMessages", uaid, table, placed)
          while (outcome === "taken") outcome = yield* putMessage("saveMessages", uaid, table, placed = nextFreeMs(placed))
          if (outcome === "stored") saved.push(placed)
        }
        return saved
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

      const fetchTimestampMessages = Effect.fnUntraced(function*(
        uaid: string,
        table: string,
        after: number | undefined,
        limit: number
      ) {
        const now = yield* Clock.currentTimeMillis
        const page = yield* query("fetchTimestampMessages", {
          TableName: table,
          KeyConditionExpression: "#uaid = :uaid AND #chidmessageid BETWEEN :lo AND :hi",
          ExpressionAttributeNames: { "#uaid": "uaid", "#chidmessageid": "chidmessageid" },
          ExpressionAttributeValues: {
            ":uaid": S(uaid),
            ":lo": S(timestampLowerBound(after)),
            ":hi": S(TIMESTAMP_END)
          },
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
          ))).pipe(Effect.asVoid)

      // ── maintenance ───────────────────────────────────────────────────────────────────────────

      const describe = (operation: string, table: string) =>
        call(operation, (o) => client.send("DescribeTable", { TableName: table }, o)).pipe(
          Effect.map((result) => result.Table),
          Effect.catchIf(isNamed("ResourceNotFoundException"), () => Effect.succeed(undefined))
        )

      /**
       * Poll until the table (and its indexes) is ACTIVE, or, with `gone`, until it no longer exists:
       * soon at first (a local server is done in milliseconds), then less often (AWS takes seconds).
       */
      const awaitTable = Effect.fnUntraced(function*(operation: string, table: string, gone = false) {
        for (let waited = 0, pause = 5; waited < 120_000; waited += pause, pause = Math.min(pause * 2, 1_000)) {
          const d = yield* describe(operation, table)
          const active = d?.TableStatus === "ACTIVE" &&
            (d.GlobalSecondaryIndexes ?? []).every((index) => index.IndexStatus === "ACTIVE")
          if (gone ? d === undefined : active) return
          yield* Effect.sleep(pause)
        }
        return yield* new StorageError({ operation, cause: `table ${table} did not become ${gone ? "deleted" : "ACTIVE"}` })
      }, Effect.provideService(Clock.Clock, liveClock))

      const createTable = Effect.fnUntraced(function*(input: CreateTableCommandInput, ttl: boolean) {
        const table = input.TableName ?? ""
        const created = yield* conditionalCreate(input)
        yield* awaitTable("createTables", table)
        if (!created || !ttl) return
        yield* call("createTables", (o) =>
          client.send(
            "UpdateTimeToLive", {
              TableName: table,
              TimeToLiveSpecification: { AttributeName: "expiry", Enabled: true }
            },
            o
          )).pipe(Effect.catchIf((e) => TTL_UNSUPPORTED.has(errorName(e.cause) ?? ""), () => Effect.void))
      })

      /** CreateTable; false when it already exists (or another node is creating it). */
      const conditionalCreate = (input: CreateTableCommandInput) =>
        call("createTables", (o) => client.send("CreateTable", input, o)).pipe(
          Effect.as(true),
          Effect.catchIf(isNamed("ResourceInUseException"), () => Effect.succeed(false))
        )

      /** The router table and the message tables, side by side. */
      const createTables = Effect.fn("Storage.createTables")(function*(messageTables: ReadonlyArray<string>) {
        yield* Effect.all([createRouterTable, createMessageTables(messageTables)], { concurrency: "unbounded", discard: true })
      })

      const createRouterTable = Effect.gen(function*() {
        if ((yield* describe("createTables", router)) === undefined) {
          yield* createTable({
            TableName: router,
            BillingMode: "PAY_PER_REQUEST",
            AttributeDefinitions: [
              { AttributeName: "uaid", AttributeType: "S" },
              { AttributeName: "last_connect", AttributeType: "N" }
            ],
            KeySchema: [{ AttributeName: "uaid", KeyType: "HASH" }],
            GlobalSecondaryIndexes: [{
              IndexName: ACCESS_INDEX,
              KeySchema: [{ AttributeName: "last_connect", KeyType: "HASH" }],
              Projection: { ProjectionType: "KEYS_ONLY" }
            }]
          }, false)
        }
      })

      const createMessageTables = (messageTables: ReadonlyArray<string>) =>
        Effect.forEach(messageTables, (table) =>
          describe("createTables", table).pipe(
            Effect.flatMap((existing) =>
              existing !== undefined ? Effect.void : createTable({
                TableName: table,
                BillingMode: "PAY_PER_REQUEST",
                AttributeDefinitions: [
                  { AttributeName: "uaid", AttributeType: "S" },
                  { AttributeName: "chidmessageid", AttributeType: "S" }
                ],
                KeySchema: [
                  { AttributeName: "uaid", KeyType: "HASH" },
                  { AttributeName: "chidmessageid", KeyType: "RANGE" }
                ]
              }, true)
            )
          ), { concurrency: "unbounded", discard: true })

      const checkTables = Effect.gen(function*() {
        const active = activeTableNames(options, yield* Clock.currentTimeMillis)
        return yield* Effect.forEach([router, ...active], (table) =>
          describe("checkTables", table).pipe(
            Effect.map((description): TableStatus => {
              if (description === undefined) return { table, ok: false, cause: "table not found" }
              const status = description.TableStatus ?? "UNKNOWN"
              return status === "ACTIVE" || status === "UPDATING" ? { table, ok: true } : { table, ok: false, cause: status }
            })
          ), { concurrency: "unbounded" })
      })

      const listMessageTables = Effect.gen(function*() {
        const names: Array<string> = []
        let start: string | undefined
        do {
          const page = yield* call("listMessageTables", (o) =>
            client.send("ListTables", { ExclusiveStartTableName: start }, o))
          names.push(...(page.TableNames ?? []))
          start = page.LastEvaluatedTableName
        } while (start !== undefined)
        return messageTablesOf(options, names)
      })

      const dropMessageTable = Effect.fn("Storage.dropMessageTable")(function*(table: string) {
        if (!isMessageTable(options, table)) {
          return yield* new StorageError({ operation: "dropMessageTable", cause: `not a message table: ${table}` })
        }
        yield* call("dropMessageTable", (o) => client.send("DeleteTable", { TableName: table }, o)).pipe(
          Effect.catchIf(isNamed("ResourceNotFoundException"), () => Effect.void)
        )
        yield* awaitTable("dropMessageTable", table, true)
      })

      /**
       * Drop one stale user: delete the router record only if `last_connect` is still the value the
       * index showed (the user may have connected since), then its rows in its message table.
       */
      const dropStaleUser = Effect.fnUntraced(function*(uaid: string, lastConnect: AttributeValue) {
        const result = yield* call("dropStaleUsers", (o) =>
          client.send(
            "DeleteItem", {
              TableName: router,
              Key: { uaid: S(uaid) },
              ConditionExpression: "#last_connect = :last_connect",
              ExpressionAttributeNames: { "#last_connect": "last_connect" },
              ExpressionAttributeValues: { ":last_connect": lastConnect },
              ReturnValues: "ALL_OLD"
            },
            o
          )).pipe(Effect.catchIf(isNamed("ConditionalCheckFailedException"), () => Effect.succeed(undefined)))
        if (result === undefined) return 0
        const table = result.Attributes?.current_month?.S
        if (table !== undefined) yield* deleteUserRows("dropStaleUsers", uaid, table)
        return 1
      })

      const dropStaleUsers = Effect.fn("Storage.dropStaleUsers")(function*(args: {
        readonly monthsAgo: number
        readonly lookbackMonths: number
        readonly onProgress?: (dropped: number) => Effect.Effect<void>
      }) {
        const now = yield* Clock.currentTimeMillis
        const keys = staleMonths(now, args.monthsAgo, args.lookbackMonths).flatMap(lastConnectKeys)
        let dropped = 0
        // Small pages of the index, a few keys at a time: a sweep must not eat the table's capacity.
        yield* Effect.forEach(keys, (key) =>
          Effect.gen(function*() {
            let start: Item | undefined
            do {
              const page = yield* query("dropStaleUsers", {
                TableName: router,
                IndexName: ACCESS_INDEX,
                KeyConditionExpression: "#last_connect = :last_connect",
                ExpressionAttributeNames: { "#last_connect": "last_connect" },
                ExpressionAttributeValues: { ":last_connect": N(key) },
                Limit: STALE_PAGE,
                ExclusiveStartKey: start
              })
              const users = (page.Items ?? []).flatMap((item) =>
                item.uaid?.S !== undefined && item.last_connect !== undefined ? [[item.uaid.S, item.last_connect] as const] : []
              )
              const counts = yield* Effect.forEach(users, ([uaid, lc]) => dropStaleUser(uaid, lc), { concurrency: 5 })
              const n = counts.reduce<number>((a, b) => a + b, 0)
              if (n > 0) {
                dropped += n
                if (args.onProgress !== undefined) yield* args.onProgress(dropped)
              }
              start = page.LastEvaluatedKey
            } while (start !== undefined)
          }), { concurrency: 4, discard: true })
        return dropped
      })

      return Storage.of({
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
        fetchTimestampMessages,
        deleteMessage,
        deleteMessages,
        createTables,
        checkTables,
        listMessageTables,
        dropMessageTable,
        dropStaleUsers
      })
    })
  )
