/**
 * The bare pipeline's storage for `bench:stored` and `bench:storm`: the service's table layout
 * (`src/storage/dynamo/layer.ts`, `src/storage/model.ts`) — a router table keyed by `uaid`, a message
 * table keyed by `uaid` + `chidmessageid`, timestamp rows `02:{13-digit ms}:{chid}` — spoken to with
 * the service's own DynamoDB JSON client. Shared by the bare server (`stored-servers.ts`) and the
 * benches that seed it directly; it loads nothing of the service but that client, so the bare
 * server stays bare.
 */
import { setTimeout as sleep } from "node:timers/promises"
import type { AttributeValue } from "@aws-sdk/client-dynamodb"
import type { WebSocket } from "ws"
import { type DynamoOperation, type DynamoOperations, makeDynamoClient } from "../src/storage/dynamo/client.ts"

export const ROUTER_TABLE = "router"
/** One message table, as with `no_table_rotation`. */
export const MESSAGE_TABLE = "message"
/** Rows per Query page and per BatchWriteItem, as the service's. */
export const PAGE = 25

export type Item = Record<string, AttributeValue>

export type Send = <Op extends DynamoOperation>(operation: Op, input: DynamoOperations[Op][0]) => Promise<Omit<DynamoOperations[Op][1], "$metadata">>

/**
 * The JSON-protocol client on a local endpoint. A signal of its own per request: `node:http` adds
 * a listener to it for the request's life, and thousands on one signal would warn.
 */
export const storageClient = async (endpoint: string): Promise<{ readonly send: Send; readonly destroy: () => void }> => {
  const client = await makeDynamoClient({ endpoint, region: "us-east-1" })
  return { send: (operation, input) => client.send(operation, input, { abortSignal: new AbortController().signal }), destroy: client.destroy }
}

export const createTables = async (send: Send): Promise<void> => {
  await send("CreateTable", {
    TableName: ROUTER_TABLE,
    BillingMode: "PAY_PER_REQUEST",
    AttributeDefinitions: [{ AttributeName: "uaid", AttributeType: "S" }],
    KeySchema: [{ AttributeName: "uaid", KeyType: "HASH" }]
  })
  await send("CreateTable", {
    TableName: MESSAGE_TABLE,
    BillingMode: "PAY_PER_REQUEST",
    AttributeDefinitions: [{ AttributeName: "uaid", AttributeType: "S" }, { AttributeName: "chidmessageid", AttributeType: "S" }],
    KeySchema: [{ AttributeName: "uaid", KeyType: "HASH" }, { AttributeName: "chidmessageid", KeyType: "RANGE" }]
  })
  // dynalite makes a new table ACTIVE on its next tick.
  for (const table of [ROUTER_TABLE, MESSAGE_TABLE]) {
    while ((await send("DescribeTable", { TableName: table })).Table?.TableStatus !== "ACTIVE") await sleep(5)
  }
}

export const userItem = (uaid: string, connectedAt: number): Item => ({
  uaid: { S: uaid },
  connected_at: { N: String(connectedAt) },
  router_type: { S: "webpush" },
  current_month: { S: MESSAGE_TABLE }
})

/**
 * A timestamp message row. Its sort key doubles as the version the client acks: the bare server
 * then finds the row of an ack without a lookup.
 */
export const messageItem = (uaid: string, chid: string, ms: number, data: string, encoding: string, ttl: number): Item => {
  const sortKey = `02:${String(ms).padStart(13, "0")}:${chid}`
  const seconds = Math.floor(ms / 1000)
  return {
    uaid: { S: uaid },
    chidmessageid: { S: sortKey },
    updateid: { S: sortKey },
    ttl: { N: String(ttl) },
    timestamp: { N: String(seconds) },
    expiry: { N: String(seconds + ttl) },
    data: { S: data },
    headers: { M: { encoding: { S: encoding } } }
  }
}

/** Puts `items` into `table` in batches of 25, `concurrency` batches at once. */
export const putAll = async (send: Send, table: string, items: ReadonlyArray<Item>, concurrency = 8): Promise<void> => {
  let next = 0
  await Promise.all(Array.from({ length: concurrency }, async () => {
    while (next < items.length) {
      const batch = items.slice(next, next += PAGE)
      await send("BatchWriteItem", { RequestItems: { [table]: batch.map((Item) => ({ PutRequest: { Item } })) } })
    }
  }))
}

/** A stored row as the notification frame a client gets. */
const notification = (item: Item): string => {
  const sortKey = item["chidmessageid"]?.S ?? ""
  const headers = Object.fromEntries(Object.entries(item["headers"]?.M ?? {}).map(([name, value]) => [name, value.S]))
  return JSON.stringify({
    messageType: "notification",
    channelID: sortKey.slice(sortKey.lastIndexOf(":") + 1),
    version: item["updateid"]?.S,
    data: item["data"]?.S,
    headers
  })
}

/**
 * The bare server's WebSocket session, all it does for a reconnecting client: a hello `{ uaid }`
 * reads the router record and claims it (UpdateItem node id and `connected_at`), then the user's
 * rows are sent a page (`PAGE`, `ConsistentRead`) at a time; an acked page is deleted (DeleteItem
 * for one row, BatchWriteItem else) and, if it was full, the next one read.
 */
export const bareSession = (send: Send, fail: (error: unknown) => void) => (ws: WebSocket, routerUrl: string): void => {
  let uaid = ""
  /** The page sent: its rows' keys, and the sort keys (= versions) not acked yet. */
  let keys: Array<Item> = []
  const unacked = new Set<string>()
  /** Where the next page starts, if the last one was full. */
  let more: Item | undefined

  const readPage = async (start: Item | undefined) => {
    const page = await send("Query", {
      TableName: MESSAGE_TABLE,
      KeyConditionExpression: "#uaid = :uaid AND #chidmessageid BETWEEN :lo AND :hi",
      ExpressionAttributeNames: { "#uaid": "uaid", "#chidmessageid": "chidmessageid" },
      ExpressionAttributeValues: { ":uaid": { S: uaid }, ":lo": { S: "02:" }, ":hi": { S: "02;" } },
      ConsistentRead: true,
      Limit: PAGE,
      ...(start === undefined ? {} : { ExclusiveStartKey: start })
    })
    more = page.LastEvaluatedKey
    keys = (page.Items ?? []).map((item) => ({ uaid: { S: uaid }, chidmessageid: item["chidmessageid"] as Item[string] }))
    for (const item of page.Items ?? []) {
      unacked.add(item["chidmessageid"]?.S ?? "")
      ws.send(notification(item))
    }
  }

  const hello = async () => {
    const { Item: user } = await send("GetItem", { TableName: ROUTER_TABLE, Key: { uaid: { S: uaid } }, ConsistentRead: true })
    if (user === undefined) return ws.close()
    await send("UpdateItem", {
      TableName: ROUTER_TABLE,
      Key: { uaid: { S: uaid } },
      UpdateExpression: "SET #node_id = :node_id, #connected_at = :connected_at",
      ExpressionAttributeNames: { "#node_id": "node_id", "#connected_at": "connected_at" },
      ExpressionAttributeValues: { ":node_id": { S: routerUrl }, ":connected_at": { N: String(Date.now()) } }
    })
    ws.send(JSON.stringify({ messageType: "hello", uaid, status: 200, use_webpush: true, broadcasts: {} }))
    await readPage(undefined)
  }

  const deletePage = async () => {
    const rows = keys
    keys = []
    await (rows.length === 1
      ? send("DeleteItem", { TableName: MESSAGE_TABLE, Key: rows[0] as Item })
      : send("BatchWriteItem", { RequestItems: { [MESSAGE_TABLE]: rows.map((Key) => ({ DeleteRequest: { Key } })) } }))
    if (more !== undefined) await readPage(more)
  }

  ws.on("message", (data) => {
    const frame = JSON.parse(data.toString()) as { messageType?: string; uaid?: string; updates?: Array<{ version?: string }> }
    if (frame.messageType === "hello") {
      uaid = frame.uaid ?? ""
      hello().catch(fail)
    } else if (frame.messageType === "ack") {
      for (const update of frame.updates ?? []) unacked.delete(update.version ?? "")
      if (unacked.size === 0 && keys.length > 0) deletePage().catch(fail)
    }
  })
}
