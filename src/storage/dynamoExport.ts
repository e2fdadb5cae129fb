/**
 * Whole tables out and in, for `maintenance export` and `import`: every item of a table by a paged
 * Scan, and items put back with BatchWriteItem. Items travel as the DynamoDB AttributeValue maps
 * they are, so a copy keeps every attribute a row has, whichever version of the service wrote it.
 */
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Stream from "effect/Stream"
import { scopedDynamoClient } from "./dynamoClient.ts"
import type { DynamoOptions } from "./dynamodb.ts"
import { isNamed, makeRequests, STORAGE_TIMEOUT_MS } from "./dynamoRequests.ts"
import { type Item, S } from "./dynamoRows.ts"
import { BROADCASTS_KEY } from "./model.ts"
import type { StorageError } from "./Storage.ts"

/** Items read by one Scan request: a backup of a live table must not take the nodes' capacity. */
const SCAN_PAGE = 100
/** Items counted by one Scan request (only keys are counted, but the whole item is read). */
const COUNT_PAGE = 1_000

interface DynamoTablesService {
  /** Every item of `table`, a chunk per Scan page (eventually consistent, as any Scan). */
  readonly scan: (table: string) => Stream.Stream<Item, StorageError>
  /** The users in a router table (its items but the broadcasts item); 0 when the table is missing. */
  readonly countUsers: (routerTable: string) => Effect.Effect<number, StorageError>
  /** Put items into `table`, replacing items with the same key (batches of 25, unprocessed ones resubmitted). */
  readonly putItems: (table: string, items: ReadonlyArray<Item>) => Effect.Effect<void, StorageError>
}

export class DynamoTables extends Context.Service<DynamoTables, DynamoTablesService>()("autopush/storage/DynamoTables") {}

export const layerDynamoTables = (options: DynamoOptions): Layer.Layer<DynamoTables> =>
  Layer.effect(
    DynamoTables,
    Effect.gen(function*() {
      const client = yield* scopedDynamoClient(options)
      const { call, batchWrite } = makeRequests(client, options.timeoutMs ?? STORAGE_TIMEOUT_MS)

      const scan = (table: string) =>
        Stream.paginate<Item | undefined, Item, StorageError>(undefined, (start) =>
          call("export", (o) => client.send("Scan", { TableName: table, Limit: SCAN_PAGE, ExclusiveStartKey: start }, o)).pipe(
            Effect.map((page) => [page.Items ?? [], Option.fromNullishOr(page.LastEvaluatedKey)] as const)
          ))

      const countUsers = Effect.fnUntraced(function*(routerTable: string) {
        let users = 0
        let start: Item | undefined
        do {
          const page = yield* call("import", (o) =>
            client.send(
              "Scan", {
                TableName: routerTable,
                Select: "COUNT",
                FilterExpression: "#uaid <> :broadcasts",
                ExpressionAttributeNames: { "#uaid": "uaid" },
                ExpressionAttributeValues: { ":broadcasts": S(BROADCASTS_KEY) },
                Limit: COUNT_PAGE,
                ExclusiveStartKey: start
              },
              o
            ))
          users += page.Count ?? 0
          start = page.LastEvaluatedKey
        } while (start !== undefined)
        return users
      }, Effect.catchIf(isNamed("ResourceNotFoundException"), () => Effect.succeed(0)))

      const putItems = (table: string, items: ReadonlyArray<Item>) =>
        batchWrite("import", table, items.map((Item) => ({ PutRequest: { Item } })))

      return DynamoTables.of({ scan, countUsers, putItems })
    })
  )
