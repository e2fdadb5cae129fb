/**
 * The bare pipeline's storage for `bench:stored` and `bench:storm`: the service's table layout
 * (`src/storage/dynamodb.ts`, `src/storage/model.ts`) — a router table keyed by `uaid`, a message
 * table keyed by `uaid` + `chidmessageid`, timestamp rows `02:{13-digit ms}:{chid}` — spoken to with
 * the service's own DynamoDB JSON client. Shared by the bare server (`stored-servers.ts`) and the
 * benches that seed it directly; it loads nothing of the service but that client, so the bare
 * server stays bare.
 */
import { setTimeout as sleep } from "node:timers/promises"
import type { AttributeValue } from "@aws-sdk/client-dynamodb"
import { type DynamoOperation, type DynamoOperations, makeDynamoClient } from "../src/storage/dynamoClient.ts"

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
