/**
 * Storage on the DynamoDB API: AWS, DynamoDB Local, dynalite (the embedded default) or any
 * compatible server (ScyllaDB Alternator), by endpoint URL. Only what all of them support: single
 * item reads and (conditional) writes, Query, BatchWriteItem, table management; no transactions,
 * no PartiQL. Failures become `StorageError`s whose reason is read from the server's error type
 * (`dynamo/requests.ts`), never from message text. Reserved words (`data`, `ttl`, `timestamp`, ...) are always escaped.
 *
 * Expiry is judged by the Effect `Clock` of the caller. The operations by table, as for SQLite and
 * in memory: the router table (users, the broadcast set) `dynamo/users.ts`; channel sets
 * `dynamo/channels.ts`; messages `dynamo/messages.ts`; receipts `dynamo/receipts.ts`; creating,
 * checking and dropping tables and stale users `dynamo/maintenance.ts`. The requests themselves
 * (retries, deadlines) are `dynamo/requests.ts`; items `dynamo/rows.ts`.
 */
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { makeChannels } from "./channels.ts"
import { scopedDynamoClient } from "./client.ts"
import { makeMaintenance } from "./maintenance.ts"
import { makeMessages } from "./messages.ts"
import { makeDynamoReceipts } from "./receipts.ts"
import { makeRequests } from "./requests.ts"
import { STORAGE_TIMEOUT_MS, withOperationDeadlines } from "../deadlines.ts"
import { makeUsers } from "./users.ts"
import { Storage } from "../Storage.ts"
import { type StorageOptions, tablesByClock } from "../tables.ts"

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
        ...makeDynamoReceipts(client, requests, options),
        ...makeMaintenance(client, requests, options, deleteUserRows)
      }, timeoutMs))
    })
  )
