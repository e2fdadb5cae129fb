/**
 * Requests to a DynamoDB-API server as the storage layer makes them: failures as `StorageError`s
 * told apart by name, throttling and dropped connections retried briefly, every request within the
 * deadline; conditional writes, paged queries and batch writes on top. The deadline of a whole
 * Storage operation, whatever number of requests it makes, is `withOperationDeadlines`.
 *
 * Waiting for the server (back-off, unprocessed batch items) runs on the live clock even under a
 * `TestClock`: it is about the real server.
 */
import type { QueryCommandInput, WriteRequest } from "@aws-sdk/client-dynamodb"
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as Predicate from "effect/Predicate"
import * as Schedule from "effect/Schedule"
import type { DynamoClient } from "./dynamoClient.ts"
import { chunks, type Item } from "./dynamoRows.ts"
import { mapStorageOperations, StorageError, type StorageService } from "./Storage.ts"

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

export const liveClock = Clock.Clock.defaultValue()
/** 25, 50, 100, 200 ms (jittered): a throttled request fails within about half a second. */
const retryBackoff = Schedule.exponential("25 millis").pipe(Schedule.jittered, Schedule.upTo({ times: 4 }))

export type DynamoRequests = ReturnType<typeof makeRequests>

/**
 * Storage operations without the operation deadline, each request of theirs still within it:
 * - `createTables` and `dropMessageTable` wait for the server to finish (AWS takes seconds to make
 *   a table ACTIVE or delete one), polling up to their own bound;
 * - `dropStaleUsers` is a sweep over a whole month range of the index, as long as there are users;
 * - `listMessageTables` pages through every table of the account and region, however many;
 * - `currentMessageTable` and `activeMessageTables` are answered from the clock, without a request.
 * None of them is on the path of a push or a hello: they are the table keeper's and the tools'.
 * (Whole-table export and import, `dynamoExport.ts`, are no Storage operations: each of their
 * requests has the deadline, the copy as long as the tables.)
 */
const OPERATIONS_WITHOUT_DEADLINE: ReadonlySet<string> = new Set([
  "createTables",
  "dropMessageTable",
  "dropStaleUsers",
  "listMessageTables",
  "currentMessageTable",
  "activeMessageTables"
])

/**
 * One deadline, `timeoutMs`, for each operation of `storage` (but `OPERATIONS_WITHOUT_DEADLINE`),
 * all its requests, retries and back-off together: one past it fails with a `StorageError` whose
 * cause is a `StorageTimeout`, and its request still out is aborted. The deadline runs on the live
 * clock; the operation itself keeps the caller's (expiry is judged by it).
 */
export const withOperationDeadlines = (storage: StorageService, timeoutMs: number): StorageService =>
  mapStorageOperations(storage, (name) => {
    if (OPERATIONS_WITHOUT_DEADLINE.has(name)) return (operation) => operation
    const late = Effect.sleep(timeoutMs).pipe(
      Effect.andThen(Effect.fail(new StorageError({ operation: name, cause: new StorageTimeout(timeoutMs) }))),
      Effect.provideService(Clock.Clock, liveClock)
    )
    // Every operation wrapped here fails with a StorageError only: the deadline adds no new error type.
    return <A, E>(operation: Effect.Effect<A, E>) => Effect.raceFirst(operation, late) as Effect.Effect<A, E>
  })

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
