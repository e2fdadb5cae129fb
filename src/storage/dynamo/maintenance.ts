/**
 * The tables themselves: create (router table with its `last_connect` index, message tables with
 * TTL where the server has it) and wait until ACTIVE, check, list and drop message tables, and drop
 * users whose `last_connect` month is stale. Waiting for the server runs on the live clock.
 */
import type { AttributeValue, CreateTableCommandInput } from "@aws-sdk/client-dynamodb"
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import type { DynamoClient } from "./client.ts"
import type { DynamoRequests } from "./requests.ts"
import { liveClock } from "../deadlines.ts"
import { type Item, N, S } from "../items.ts"
import { staleKeys } from "../staleUsers.ts"
import { StorageError, Timeout } from "../failures.ts"
import { hasReason, type StaleUserSweep, tableFound, type TableStatus } from "../Storage.ts"
import { activeTableNames, messageTablesOf, onlyMessageTable, receiptTableName, type StorageOptions } from "../tables.ts"

const ACCESS_INDEX = "AccessIndex"
/** Index entries read at a time by a stale-user sweep: it must not eat the table's capacity. */
const STALE_PAGE = 25
/** How long a table may take to become ACTIVE, or to go (AWS takes seconds). */
const TABLE_WAIT_MS = 120_000

export const makeMaintenance = (
  client: DynamoClient,
  { call, query }: DynamoRequests,
  options: StorageOptions,
  /** Delete a user's rows in a message table (after its router record is gone). */
  deleteUserRows: (operation: string, uaid: string, table: string) => Effect.Effect<void, StorageError>
) => {
  const router = options.routerTable
  const receipts = receiptTableName(options)
  const { describe, awaitTable } = makeTableWaits(client, call)

  const checkTables = Effect.gen(function*() {
    const active = activeTableNames(options, yield* Clock.currentTimeMillis)
    return yield* Effect.forEach([router, receipts, ...active], (table) =>
      describe("checkTables", table).pipe(
        Effect.map((description): TableStatus => {
          if (description === undefined) return tableFound(table, false)
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
    yield* onlyMessageTable(options, table)
    yield* call("dropMessageTable", (o) => client.send("DeleteTable", { TableName: table }, o)).pipe(
      Effect.catchIf(hasReason("MissingTable"), () => Effect.void)
    )
    yield* awaitTable("dropMessageTable", table, true)
  })

  return {
    createTables: makeTableCreation(client, call, options, describe, awaitTable),
    checkTables,
    listMessageTables,
    dropMessageTable,
    dropStaleUsers: makeStaleUserSweep(client, call, query, router, deleteUserRows)
  }
}

/** Reading a table's description, and waiting until the server is done with a table. */
const makeTableWaits = (client: DynamoClient, call: DynamoRequests["call"]) => {
  const describe = (operation: string, table: string) =>
    call(operation, (o) => client.send("DescribeTable", { TableName: table }, o)).pipe(
      Effect.map((result) => result.Table),
      Effect.catchIf(hasReason("MissingTable"), () => Effect.succeed(undefined))
    )

  /**
   * Poll until the table (and its indexes) is ACTIVE, or, with `gone`, until it no longer exists:
   * soon at first (a local server is done in milliseconds), then less often (AWS takes seconds).
   */
  const awaitTable = Effect.fnUntraced(function*(operation: string, table: string, gone = false) {
    for (let waited = 0, pause = 5; waited < TABLE_WAIT_MS; waited += pause, pause = Math.min(pause * 2, 1_000)) {
      const d = yield* describe(operation, table)
      const active = d?.TableStatus === "ACTIVE" &&
        (d.GlobalSecondaryIndexes ?? []).every((index) => index.IndexStatus === "ACTIVE")
      if (gone ? d === undefined : active) return
      yield* Effect.sleep(pause)
    }
    return yield* new StorageError({
      operation,
      reason: new Timeout({ timeoutMs: TABLE_WAIT_MS }),
      cause: `table ${table} did not become ${gone ? "deleted" : "ACTIVE"}`
    })
  }, Effect.provideService(Clock.Clock, liveClock))

  return { describe, awaitTable }
}

/** `createTables`: the router, receipt and message tables, each made when missing and waited for until ACTIVE. */
const makeTableCreation = (
  client: DynamoClient,
  call: DynamoRequests["call"],
  options: StorageOptions,
  describe: ReturnType<typeof makeTableWaits>["describe"],
  awaitTable: ReturnType<typeof makeTableWaits>["awaitTable"]
) => {
  const router = options.routerTable
  const receipts = receiptTableName(options)

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
      )).pipe(Effect.catchIf(hasReason("Unsupported"), () => Effect.void)) // servers without TTL (dynalite)
  })

  /** CreateTable; false when it already exists (or another node is creating it). */
  const conditionalCreate = (input: CreateTableCommandInput) =>
    call("createTables", (o) => client.send("CreateTable", input, o)).pipe(
      Effect.as(true),
      Effect.catchIf(hasReason("Conflict"), () => Effect.succeed(false))
    )

  /** The router table and the message tables, side by side. */
  const createTables = Effect.fn("Storage.createTables")(function*(messageTables: ReadonlyArray<string>) {
    yield* Effect.all([createRouterTable, createReceiptTable, createMessageTables(messageTables)], { concurrency: "unbounded", discard: true })
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

  /** A table keyed by a hash and a range string, with TTL on `expiry`, made when missing. */
  const createKeyedTable = (table: string, hash: string, range: string) =>
    Effect.flatMap(describe("createTables", table), (existing) =>
      existing !== undefined ? Effect.void : createTable({
        TableName: table,
        BillingMode: "PAY_PER_REQUEST",
        AttributeDefinitions: [
          { AttributeName: hash, AttributeType: "S" },
          { AttributeName: range, AttributeType: "S" }
        ],
        KeySchema: [
          { AttributeName: hash, KeyType: "HASH" },
          { AttributeName: range, KeyType: "RANGE" }
        ]
      }, true))

  const createReceiptTable = createKeyedTable(receipts, "subscription", "message")

  const createMessageTables = (messageTables: ReadonlyArray<string>) =>
    Effect.forEach(messageTables, (table) => createKeyedTable(table, "uaid", "chidmessageid"), { concurrency: "unbounded", discard: true })

  return createTables
}

/** `dropStaleUsers`: the `last_connect` index read in small pages, each user dropped unless it connected since. */
const makeStaleUserSweep = (
  client: DynamoClient,
  call: DynamoRequests["call"],
  query: DynamoRequests["query"],
  router: string,
  deleteUserRows: (operation: string, uaid: string, table: string) => Effect.Effect<void, StorageError>
) => {
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
      )).pipe(Effect.catchIf(hasReason("Conflict"), () => Effect.succeed(undefined)))
    if (result === undefined) return 0
    const table = result.Attributes?.current_month?.S
    if (table !== undefined) yield* deleteUserRows("dropStaleUsers", uaid, table)
    return 1
  })

  const dropStaleUsers = Effect.fn("Storage.dropStaleUsers")(function*(args: StaleUserSweep) {
    const keys = staleKeys(yield* Clock.currentTimeMillis, args)
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
          const counts = args.dryRun === true
            ? users.map(() => 1)
            : yield* Effect.forEach(users, ([uaid, lc]) => dropStaleUser(uaid, lc), { concurrency: 5 })
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

  return dropStaleUsers
}
