/**
 * What the logs print: with `human_logs` one line per record, the fields on it as `key=value` (a
 * connection's end, its `Session` record, is one line, not a block); MozLog JSON otherwise, with
 * the record's fields as they are.
 */
import { assert, describe, it } from "@effect/vitest"
import { Console, Effect } from "effect"
import { Console as NodeConsole } from "node:console"
import { Writable } from "node:stream"
import { humanLine, humanLogger, loggingLayer } from "../../src/observability/logging.ts"
import { opaqueId } from "../../src/observability/opaque.ts"
import { type SessionSummary, summaryFields } from "../../src/observability/sessionSummary.ts"

const summary: SessionSummary = {
  uaid: "0123456789abcdef0123456789abcdef",
  helloAt: 1_700_000_000_000,
  endedAt: 1_700_000_061_500,
  disconnectReason: "client closed",
  counts: { directAcked: 3, directStored: 1, storedRetrieved: 2, storedAcked: 2, nacks: 0, registers: 1, unregisters: 0 }
}

/** The connection's end as the connection node logs it. */
const sessionEnd = Effect.logInfo("Session").pipe(Effect.annotateLogs(summaryFields(summary, opaqueId)))

/** What `effect` prints through a console that writes to a terminal-like stream (groups indent, as on a terminal). */
const printed = <E>(effect: Effect.Effect<void, E>, human: boolean) =>
  Effect.gen(function*() {
    let out = ""
    const stream = new Writable({
      write(chunk: Buffer, _encoding, done) {
        out += chunk.toString()
        done()
      }
    })
    const console = new NodeConsole({ stdout: stream, stderr: stream, colorMode: false })
    yield* effect.pipe(
      Effect.provide(loggingLayer({ human, level: "info", role: "autoconnect", hostname: "node-1" })),
      Effect.provideService(Console.Console, console)
    )
    return out
  })

describe("logs", () => {
  it.effect("human_logs: a connection's end is one line at INFO, its fields on it", () =>
    Effect.gen(function*() {
      const out = yield* printed(sessionEnd, true)
      const lines = out.trimEnd().split("\n")
      assert.strictEqual(lines.length, 1, out)
      const line = lines[0]!
      assert.match(line, /^\[\d\d:\d\d:\d\d\.\d{3}\] INFO  Session /)
      assert.include(
        line,
        `uaid_hash=${opaqueId(summary.uaid!)} connection_time=61500 direct_acked=3 direct_storage=1 stored_retrieved=2 stored_acked=2 ` +
          `nacks=0 registers=1 unregisters=0 disconnect_reason="client closed"`
      )
    }))

  it("human_logs on a terminal (coloured): still one line; a failure's cause follows it, indented", () => {
    const entry = { level: "INFO", timestamp: new Date().toISOString(), message: "Session", cause: undefined, annotations: summaryFields(summary, opaqueId), spans: {} }
    const coloured = humanLine(entry, true)
    assert.notInclude(coloured, "\n")
    assert.include(coloured, "\x1b[")
    assert.include(coloured, "disconnect_reason")
    const failed = humanLine({ ...entry, level: "ERROR", message: "storage failed", cause: "Error: boom\n    at x", annotations: { table: "router", ids: [1, 2] } }, false)
    assert.deepStrictEqual(failed.split("\n").slice(1), ["    Error: boom", "        at x"])
    assert.match(failed.split("\n")[0]!, /ERROR storage failed table=router ids=\[1,2\]$/)
    assert.isFunction(humanLogger(false).log)
  })

  it.effect("MozLog JSON: one object per record, the Session record's fields as they are", () =>
    Effect.gen(function*() {
      const out = yield* printed(sessionEnd, false)
      const lines = out.trimEnd().split("\n")
      assert.strictEqual(lines.length, 1, out)
      const record = JSON.parse(lines[0]!) as { Type: string; Severity: number; Fields: Record<string, unknown> }
      assert.strictEqual(record.Type, "autoconnect:log")
      assert.strictEqual(record.Severity, 6)
      assert.deepStrictEqual(record.Fields, { msg: "Session", ...summaryFields(summary, opaqueId) })
      assert.deepStrictEqual(Object.keys(record.Fields), [
        "msg",
        "uaid_hash",
        "connection_time",
        "direct_acked",
        "direct_storage",
        "stored_retrieved",
        "stored_acked",
        "nacks",
        "registers",
        "unregisters",
        "disconnect_reason"
      ])
    }))
})
