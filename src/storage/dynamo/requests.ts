/**
 * Requests to a DynamoDB-API server as the storage layer makes them: failures as `StorageError`s
 * told apart by name, throttling and dropped connections retried briefly, every request within the
 * deadline; conditional writes, paged queries and batch writes on top. The deadline of a whole
 * Storage operation, whatever number of requests it makes, is `withOperationDeadlines`
 * (`../deadlines.ts`).
 *
 * Waiting for the server (back-off, unprocessed batch items) runs on the live clock even under a
 * `TestClock`: it is about the real server.
 */
import type { QueryCommandInput, WriteRequest } from "@aws-sdk/client-dynamodb"
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as Predicate from "effect/Predicate"
import * as Schedule from "effect/Schedule"
import type { DynamoClient } from "./client.ts"
import { chunks } from "./rows.ts"
import { liveClock, StorageTimeout } from "../deadlines.ts"
import { type Item } from "../items.ts"
import { StorageError } from "../Storage.ts"

const BATCH_WRITE_MAX = 25
const THROUGHPUT_ERRORS = new Set(["ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded"])
/** Connection errors worth one more try (a reused keep-alive socket the server had closed). */
const TRANSIENT_CODES = new Set(["ECONNRESET", "EPIPE", "ETIMEDOUT"])

/** The `name` of an SDK error (`ConditionalCheckFailedException`, ...). */
export const errorName = (cause: unknown): string | undefined =>
  Predicate.hasProperty(cause, "name") && Predicate.isString(cause.name) ? cause.name : undefined

export const isNamed = (name: string) => (error: StorageError): boolean => errorName(error.cause) === name

/** Throttling or a dropped connection: retried a few times, quickly. */
const isRetryable = (error: StorageError): boolean =>
  THROUGHPUT_ERRORS.has(errorName(error.cause) ?? "") ||
  (Predicate.hasProperty(error.cause, "code") && TRANSIENT_CODES.has(String(error.cause.code)))

/** 25, 50, 100, 200 ms (jittered): a throttled request fails within about half a second. */
const retryBackoff = Schedule.exponential("25 millis").pipe(Schedule.jittered, Schedule.upTo({ times: 4 }))

export type DynamoRequests = ReturnType<typeof makeRequests>



/** The requests of one layer: its client, and the deadline of each request (at most that of its operation). */
export const makeRequests = (client: DynamoClient, timeoutMs: number) => {
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

  return { call, conditional, query, queryAll, batchWrite }
}
