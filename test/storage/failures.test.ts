/**
 * How each backend reads its native failures into a reason: DynamoDB by error type and system
 * error code, PostgreSQL by SQLSTATE (the stores' own tests meet the common ones for real: a
 * missing table, a timeout, a full disk, a server that went away).
 */
import { assert, describe, it } from "@effect/vitest"
import { dynamoFailure } from "../../src/storage/dynamo/requests.ts"
import { failureText, StorageError, Timeout, Unknown } from "../../src/storage/failures.ts"
import { postgresError } from "../../src/storage/postgres/pool.ts"

const named = (name: string) => Object.assign(new Error("the server's message"), { name })
const coded = (code: string) => Object.assign(new Error(`connect ${code} 127.0.0.1:8000`), { code })

describe("storage failures", () => {
  it("DynamoDB: by the server's error type, then by the connection's system error code", () => {
    const cases: ReadonlyArray<readonly [unknown, string, boolean]> = [
      [named("ResourceNotFoundException"), "MissingTable", false],
      [named("ConditionalCheckFailedException"), "Conflict", false],
      [named("ResourceInUseException"), "Conflict", false],
      [named("ProvisionedThroughputExceededException"), "Throttled", true],
      [named("ThrottlingException"), "Throttled", true],
      [named("InternalServerError"), "Unavailable", true],
      [named("AccessDeniedException"), "Denied", false],
      [named("UnknownOperationException"), "Unsupported", false],
      [named("ValidationException"), "Invalid", false],
      [coded("ECONNREFUSED"), "Unavailable", true],
      [coded("ECONNRESET"), "Unavailable", true],
      [named("SomethingElse"), "Unknown", false],
      ["a string", "Unknown", false]
    ]
    for (const [cause, tag, retryable] of cases) {
      const reason = dynamoFailure(cause)
      assert.strictEqual(reason._tag, tag, String(cause))
      assert.strictEqual(reason.isRetryable, retryable, String(cause))
    }
  })

  it("PostgreSQL: by SQLSTATE, the server's error kept as the cause", () => {
    const state = (code: string) => Object.assign(new Error(`server error ${code}`), { code })
    const cases: ReadonlyArray<readonly [unknown, string, boolean]> = [
      [state("42P01"), "MissingTable", false],
      [state("57014"), "Timeout", true],
      [state("08006"), "Unavailable", true],
      [state("57P01"), "Unavailable", true],
      [coded("ECONNREFUSED"), "Unavailable", true],
      [state("53100"), "DiskFull", false],
      [state("53300"), "Throttled", true],
      [state("40P01"), "Contention", true],
      [state("40001"), "Contention", true],
      [state("28P01"), "Denied", false],
      [state("42501"), "Denied", false],
      [state("23505"), "Invalid", false],
      [state("XX000"), "Unknown", false]
    ]
    for (const [cause, tag, retryable] of cases) {
      const error = postgresError("getUser", cause, 750)
      assert.strictEqual(error.reason._tag, tag, String(cause))
      assert.strictEqual(error.isRetryable, retryable, String(cause))
      assert.strictEqual(error.cause, cause)
    }
    assert.deepStrictEqual(postgresError("getUser", state("57014"), 750).reason, new Timeout({ timeoutMs: 750 }))
  })

  it("a failure's text is the native error's when there is one, else the reason's", () => {
    assert.strictEqual(failureText(new StorageError({ operation: "getUser", reason: new Timeout({ timeoutMs: 5000 }) })), "no answer within 5000 ms")
    assert.strictEqual(
      failureText(new StorageError({ operation: "getUser", reason: new Unknown(), cause: Object.assign(new Error("disk I/O error"), { name: "SqliteError" }) })),
      "SqliteError: disk I/O error"
    )
  })
})
