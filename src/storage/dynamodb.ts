/**
 * Storage on the DynamoDB API: AWS, DynamoDB Local, dynalite (the embedded default) or any
 * compatible server (ScyllaDB Alternator), by endpoint URL. Only what all of them support: single
 * item reads and (conditional) writes, Query, BatchWriteItem, table management; no transactions,
 * no PartiQL. Failures become `StorageError`s; server errors are told apart by their `name`, never
 * by message text. Reserved words (`data`, `ttl`, `timestamp`, ...) are always escaped.
 *
 * Expiry is judged by the Effect `Clock` of the caller. The operations by table, as for SQLite and
 * in memory: the router table (users, the broadcast set) `dynamoUsers.ts`; channel sets
 * `dynamoChannels.ts`; messages `dynamoMessages.ts`; receipts `dynamoReceipts.ts`; creating,
 * checking and dropping tables and stale users `dynamoMaintenance.ts`. The requests themselves
 * (retries, deadlines) are `dynamoRequests.ts`; items `dynamoRows.ts`.
 */
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { makeChannels } from "./dynamoChannels.ts"
import { scopedDynamoClient } from "./dynamoClient.ts"
import { makeMaintenance } from "./dynamoMaintenance.ts"
import { makeMessages } from "./dynamoMessages.ts"
import { makeReceipts } from "./dynamoReceipts.ts"
import { makeRequests, STORAGE_TIMEOUT_MS, withOperationDeadlines } from "./dynamoRequests.ts"
import { makeUsers } from "./dynamoUsers.ts"
import { Storage } from "./Storage.ts"
import { type StorageOptions, tablesByClock } from "./tables.ts"

export interface DynamoOptions extends StorageOptions {
  /** Endpoint URL (DynamoDB Local, dynalite, Alternator); AWS's regional endpoint when absent. */
  readonly endpoint?: string | undefined
  readonly region: string
  /** Deadline of one operation, retries included (ms; default `STORAGE_TIMEOUT_MS`). */
  readonly timeoutMs?: number | undefined
}

export const layerDynamo = (options: DynamoOptions): Layer.Layer<Storage> =>
  Layer.effect(
    Storage,
    Effect.gen(function*() {
      const client = yield* scopedDynamoClient(options)
      const timeoutMs = options.timeoutMs ?? STORAGE_TIMEOUT_MS
      const requests = makeRequests(client, timeoutMs)
      const { deleteUserRows, ...messages } = makeMessages(client, requests)

      // The deadline is per operation (`dropUser`, `saveMessages`, ... make several requests), not per request.
      return Storage.of(withOperationDeadlines({
        ...makeUsers(client, requests, options, deleteUserRows),
        ...tablesByClock(options),
        ...makeChannels(client, requests),
        ...messages,
        ...makeReceipts(client, requests, options),
        ...makeMaintenance(client, requests, options, deleteUserRows)
      }, timeoutMs))
    })
  )
