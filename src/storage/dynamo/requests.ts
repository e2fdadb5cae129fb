/**
 * Requests to a DynamoDB-API server as the storage layer makes them: failures as `StorageError`s
 * whose reason is read from the server's error type or the connection's system error code (here
 * only), the retryable ones (throttling, an unreachable server) retried briefly, every request within the
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
import { liveClock } from "../deadlines.ts"
import {
  Conflict,
  Contention,
  Denied,
  hasReason,
  Invalid,
  MissingTable,
  StorageError,
  type StorageFailure,
  Throttled,
  Timeout,
  Unavailable,
  Unknown,
  Unsupported
} from "../failures.ts"
import { type Item } from "../items.ts"

const BATCH_WRITE_MAX = 25

/** The reason of each error type a DynamoDB-API server (DynamoDB, DynamoDB Local, Alternator, dynalite) answers with. */
const REASONS_BY_ERROR_TYPE: ReadonlyMap<string, () => StorageFailure> = new Map<string, () => StorageFailure>([
  ["ResourceNotFoundException", () => new MissingTable({})],
  ["ConditionalCheckFailedException", () => new Conflict()],
  ["ResourceInUseException", () => new Conflict()],
  ["TransactionConflictException", () => new Contention()],
  ["ProvisionedThroughputExceededException", () => new Throttled()],
  ["ThrottlingException", () => new Throttled()],
  ["RequestLimitExceeded", () => new Throttled()],
  ["InternalServerError", () => new Unavailable()],
  ["ServiceUnavailable", () => new Unavailable()],
  ["UnrecognizedClientException", () => new Denied()],
  ["AccessDeniedException", () => new Denied()],
  ["InvalidSignatureException", () => new Denied()],
  ["MissingAuthenticationTokenException", () => new Denied()],
  ["CredentialsProviderError", () => new Denied()],
  ["UnknownOperationException", () => new Unsupported()],
  ["UnsupportedOperationException", () => new Unsupported()],
  ["NotImplementedException", () => new Unsupported()],
  ["ValidationException", () => new Invalid()],
  ["SerializationException", () => new Invalid()]
])

/** System error codes of a server that cannot be reached, or a connection it dropped (a reused keep-alive socket it had closed). */
const UNREACHABLE_CODES = new Set(["ECONNREFUSED", "ECONNRESET", "EPIPE", "ETIMEDOUT", "ENOTFOUND", "EAI_AGAIN", "EHOSTUNREACH"])

/** Why a request failed, from the server's error type (its `name`) or the connection's system error `code`. */
export const dynamoFailure = (cause: unknown): StorageFailure => {
  const name = Predicate.hasProperty(cause, "name") && Predicate.isString(cause.name) ? cause.name : ""
  const byType = REASONS_BY_ERROR_TYPE.get(name)
  if (byType !== undefined) return byType()
  return unreachableCode(cause) ? new Unavailable() : new Unknown()
}

/** A connection to a host of several addresses (localhost: ::1 and 127.0.0.1) fails with each, as one `AggregateError`. */
const unreachableCode = (cause: unknown): boolean =>
  cause instanceof AggregateError
    ? cause.errors.some(unreachableCode)
    : Predicate.hasProperty(cause, "code") && UNREACHABLE_CODES.has(String(cause.code))

/** 25, 50, 100, 200 ms (jittered): a throttled request fails within about half a second. */
const retryBackoff = Schedule.exponential("25 millis").pipe(Schedule.jittered, Schedule.upTo({ times: 4 }))

export type DynamoRequests = ReturnType<typeof makeRequests>

/** The requests of one layer: its client, and the deadline of each request (at most that of its operation). */
export const makeRequests = (client: DynamoClient, timeoutMs: number) => {
  /**
   * One request; a retryable failure (throttled, the server unreachable) retried with a short
   * bounded back-off, all within the deadline (a request still out then is aborted).
   */
  const call = <A>(operation: string, send: (o: { abortSignal: AbortSignal }) => Promise<A>) =>
    Effect.tryPromise({
      try: (abortSignal) => send({ abortSignal }),
      catch: (cause) => new StorageError({ operation, reason: dynamoFailure(cause), cause })
    }).pipe(
      Effect.retry({ schedule: retryBackoff, while: (error) => error.isRetryable }),
      Effect.timeoutOrElse({
        duration: timeoutMs,
        orElse: () => Effect.fail(new StorageError({ operation, reason: new Timeout({ timeoutMs }) }))
      }),
      Effect.provideService(Clock.Clock, liveClock)
    )

  /** `true` when the conditional write happened, `false` when its condition did not hold. */
  const conditional = (self: Effect.Effect<unknown, StorageError>) =>
    self.pipe(
      Effect.as(true),
      Effect.catchIf(hasReason("Conflict"), () => Effect.succeed(false))
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
          return yield* new StorageError({ operation, reason: new Throttled(), cause: `${pending.length} unprocessed items in ${table}` })
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
