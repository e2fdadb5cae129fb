/**
 * Deadlines of storage operations, whatever the backend: the default `storage_timeout`, and the
 * wrapper that gives each operation of a `StorageService` its deadline (past it, reason `Timeout`). Deadlines run on the live clock even under a `TestClock`: they are about the real server.
 */
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import { StorageError, Timeout } from "./failures.ts"
import { mapStorageOperations, type StorageService } from "./Storage.ts"

/** Default deadline of one storage operation: a server that accepts and never answers must not park callers. */
export const STORAGE_TIMEOUT_MS = 5_000

/** The clock deadlines and back-off waits run on, whatever clock the caller's effects use. */
export const liveClock = Clock.Clock.defaultValue()

/**
 * Storage operations without the operation deadline, each request of theirs still within it:
 * - `createTables` and `dropMessageTable` wait for the server to finish (AWS takes seconds to make
 *   a table ACTIVE or delete one), polling up to their own bound;
 * - `dropStaleUsers` is a sweep over a whole month range of the index, as long as there are users;
 * - `listMessageTables` pages through every table of the account and region, however many;
 * - `currentMessageTable` and `activeMessageTables` are answered from the clock, without a request.
 * None of them is on the path of a push or a hello: they are the table keeper's and the tools'.
 * (Whole-table export and import, `dynamo/export.ts`, are no Storage operations: each of their
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
 * reason is a `Timeout`, and its request still out is aborted. The deadline runs on the live
 * clock; the operation itself keeps the caller's (expiry is judged by it).
 */
export const withOperationDeadlines = (storage: StorageService, timeoutMs: number): StorageService =>
  mapStorageOperations(storage, (name) => {
    if (OPERATIONS_WITHOUT_DEADLINE.has(name)) return (operation) => operation
    const late = Effect.sleep(timeoutMs).pipe(
      Effect.andThen(Effect.fail(new StorageError({ operation: name, reason: new Timeout({ timeoutMs }) }))),
      Effect.provideService(Clock.Clock, liveClock)
    )
    // Every operation wrapped here fails with a StorageError only: the deadline adds no new error type.
    return <A, E>(operation: Effect.Effect<A, E>) => Effect.raceFirst(operation, late) as Effect.Effect<A, E>
  })
