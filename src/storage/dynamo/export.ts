/**
 * `TableCopy` on DynamoDB: every item of a table by a paged Scan, and items put back with
 * BatchWriteItem. Items travel as the attribute-value maps they are, so a copy keeps every attribute
 * a row has, whichever version of the service wrote it.
 */
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Stream from "effect/Stream"
import { scopedDynamoClient } from "./client.ts"
import type { DynamoOptions } from "./layer.ts"
import { makeRequests } from "./requests.ts"
import { STORAGE_TIMEOUT_MS } from "../deadlines.ts"
import { type Item, S } from "../items.ts"
import { BROADCASTS_KEY } from "../model.ts"
import { hasReason, type StorageError } from "../Storage.ts"
import { TableCopy } from "../tableCopy.ts"

/** Items read by one Scan request: a backup of a live table must not take the nodes' capacity. */
const SCAN_PAGE = 100
/** Items counted by one Scan request (only keys are counted, but the whole item is read). */
const COUNT_PAGE = 1_000

export const layerDynamoTableCopy = (options: DynamoOptions): Layer.Layer<TableCopy> =>
  Layer.effect(
    TableCopy,
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
      }, Effect.catchIf(hasReason("MissingTable"), () => Effect.succeed(0)))

      const putItems = (table: string, items: ReadonlyArray<Item>) =>
        batchWrite("import", table, items.map((Item) => ({ PutRequest: { Item } })))

      return TableCopy.of({ scan, countUsers, putItems })
    })
  )
