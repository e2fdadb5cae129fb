/**
 * Why a storage operation failed, whatever the backend. A `StorageError` names the operation, its
 * reason — a small tagged union callers decide on (`MissingTable`, `Timeout`, `Throttled`, …), each
 * saying whether the same request may succeed if tried again soon (`isRetryable`) — and the
 * server's own error as it came (`cause`), for logs only. Each backend classifies its native
 * failures where it builds the error (DynamoDB by error type and system error code, PostgreSQL by
 * SQLSTATE, SQLite by result code, memory directly); nothing above storage reads a server's names.
 */
import * as Data from "effect/Data"
import * as Effect from "effect/Effect"
import * as Predicate from "effect/Predicate"
import { StorageUnavailable } from "../domain/errors.ts"

/**
 * A reason's class: its tag, its fields, whether the request may be tried again soon
 * (`isRetryable`), and what it says (`message`, from its fields).
 */
const reason = <A extends Record<string, unknown> = {}>() =>
<const Tag extends string>(tag: Tag, retryable: boolean, says: (fields: A) => string) => {
  class Reason extends Data.TaggedClass(tag)<Record<string, unknown>> {
    get isRetryable(): boolean {
      return retryable
    }
    get message(): string {
      return says(this as unknown as A)
    }
  }
  // The class above is written over any fields; as the reason's class it has `A`'s.
  return Reason as unknown as new(
    ...args: keyof A extends never ? [fields?: {}] : [fields: A]
  ) => Readonly<A> & { readonly _tag: Tag; readonly isRetryable: boolean; readonly message: string }
}

/** A table the operation needs is not there (not created yet, or dropped). */
export class MissingTable extends reason<{ readonly table?: string | undefined }>()(
  "MissingTable",
  false,
  ({ table }) => table === undefined ? "table not found" : `table not found: ${table}`
) {}

/** No answer within the deadline (the operation's, a statement's, or a lock another process held). */
export class Timeout extends reason<{ readonly timeoutMs: number }>()("Timeout", true, ({ timeoutMs }) => `no answer within ${timeoutMs} ms`) {}

/** The server refused the request for its rate (throughput exceeded, too many requests). */
export class Throttled extends reason()("Throttled", true, () => "the server throttled the request") {}

/** The server could not be reached or went away (connection refused or dropped, shutting down, an internal error). */
export class Unavailable extends reason()("Unavailable", true, () => "the server is unavailable") {}

/** The write lost to a concurrent one (deadlock, serialization failure): tried again, it may pass. */
export class Contention extends reason()("Contention", true, () => "the write lost to a concurrent one") {}

/**
 * A condition of the request did not hold (a conditional write refused, a table being created or
 * deleted): the same request meets the same state.
 */
export class Conflict extends reason()("Conflict", false, () => "a condition of the request did not hold") {}

/** The database cannot grow: the disk holding it is full (or it reached its size limit). */
export class DiskFull extends reason<{ readonly database: string }>()("DiskFull", false, ({ database }) => `the disk holding ${database} is full`) {}

/** The credentials or permissions do not allow the request. */
export class Denied extends reason()("Denied", false, () => "the credentials or permissions do not allow the request") {}

/** The store does not implement the request (TTL on some DynamoDB-API servers, table copies on PostgreSQL). */
export class Unsupported extends reason()("Unsupported", false, () => "the store does not support the request") {}

/** The request was refused as invalid (a malformed request, a table that is not ours). */
export class Invalid extends reason()("Invalid", false, () => "the request was refused as invalid") {}

/**
 * The storage breaker is open (`breaker.ts`): the store could not be reached, and the operation was
 * refused without a request. Not retried at once: the breaker says when (`retryAfterMs`).
 */
export class BreakerOpen extends reason<{
  /** When the breaker lets its next probe through (ms from now; 0: a probe is out). */
  readonly retryAfterMs: number
  /** The failure that opened the breaker, as one line. */
  readonly opened: string
}>()(
  "BreakerOpen",
  false,
  ({ opened }) => `the storage breaker is open (${opened}): operations are refused until a probe reaches the store`
) {}

/** Anything else. */
export class Unknown extends reason()("Unknown", false, () => "storage failed") {}

export type StorageFailure =
  | MissingTable
  | Timeout
  | Throttled
  | Unavailable
  | Contention
  | Conflict
  | DiskFull
  | Denied
  | Unsupported
  | Invalid
  | BreakerOpen
  | Unknown

export class StorageError extends Data.TaggedError("StorageError")<{
  readonly operation: string
  readonly reason: StorageFailure
  /** The server's or driver's own error, as it came (logs only); absent when the reason says it all. */
  readonly cause?: unknown
}> {
  /** Whether the same request may succeed if tried again soon. */
  get isRetryable(): boolean {
    return this.reason.isRetryable
  }
}

/** Whether a `StorageError`'s reason is `tag` (for `Effect.catchIf`). */
export const hasReason = (tag: StorageFailure["_tag"]) => (error: StorageError): boolean => error.reason._tag === tag

/** A native failure's text as one line: its name, message and code, never a stack. */
const causeText = (cause: unknown): string => {
  const name = Predicate.hasProperty(cause, "name") && Predicate.isString(cause.name) ? cause.name : undefined
  const message = Predicate.hasProperty(cause, "message") && Predicate.isString(cause.message) ? cause.message : undefined
  const code = Predicate.hasProperty(cause, "code") && Predicate.isString(cause.code) ? cause.code : undefined
  if (name === undefined && message === undefined) return String(cause).split("\n")[0] as string
  const text = [name !== undefined && name !== "Error" ? name : undefined, message, code !== undefined && !(message ?? "").includes(code) ? `(${code})` : undefined]
  return (text.filter((part) => part !== undefined && part !== "").join(": ").split("\n")[0]) as string
}

/** A storage failure as one line, for logs and messages: the server's error when there is one, else what the reason says. */
export const failureText = (error: StorageError): string =>
  error.cause === undefined ? error.reason.message : causeText(error.cause)

/**
 * A storage failure as the API answers it — 503/201 with Retry-After (`StorageUnavailable`), the
 * failure logged once (a full disk is logged by the store, throttled: `DiskFull`; an open breaker
 * by the breaker, which also says when to retry: `BreakerOpen`): used by the endpoint's error edge,
 * and where a failure is answered without one.
 */
export const storageUnavailable = (error: StorageError): Effect.Effect<never, StorageUnavailable> => {
  const reason = error.reason
  if (reason._tag === "BreakerOpen") {
    return Effect.fail(new StorageUnavailable({ retryAfter: Math.max(1, Math.ceil(reason.retryAfterMs / 1_000)) }))
  }
  return (reason._tag === "DiskFull"
    ? Effect.void
    : Effect.logError("storage failed").pipe(
      Effect.annotateLogs({ operation: error.operation, reason: reason._tag, cause: failureText(error) })
    ))
    .pipe(Effect.andThen(Effect.fail(new StorageUnavailable({}))))
}
