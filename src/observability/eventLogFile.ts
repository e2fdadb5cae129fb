/**
 * The event log (`event_log` option): every domain event as one JSON line,
 *
 *     {"time":1763726400000,"type":"notification.acked.1","uaid":"3f1c9a0b5e2d4c71","data":{"version":"9a0e...","code":100,"source":"direct"}}
 *
 * to stdout (`-`) or appended to a file. What is written, and what is not:
 * - `time`: ms since the epoch, when the event was recorded;
 * - `uaid`, `data.version` (message ids) and `data.receipt` (receipt subscription ids): opaque ids
 *   (`opaque.ts`), never the values themselves — all are bearer credentials (a receipt subscription
 *   id lets whoever has it read its receipts); the opaque ids still join the lines of one user, one
 *   message or one subscription, also across nodes, and `GET /__trace__/{id}` takes either form of a
 *   message id;
 * - channel ids, TTLs, codes, reasons, months, outcomes: as they are;
 * - payloads, headers, endpoint tokens and keys: never (no domain event carries them; the writer also
 *   drops such fields should an event ever grow one).
 *
 * Lines are written through a buffered stream; if the file cannot keep up (more than `maxBufferBytes`
 * waiting), lines are dropped and counted rather than growing memory without bound.
 */
import { createWriteStream, openSync } from "node:fs"
import * as Data from "effect/Data"
import * as Effect from "effect/Effect"
import type * as Scope from "effect/Scope"
import type { DomainEvent } from "../domain/events.ts"
import type { EventSink } from "./EventLog.ts"
import { makeOpaqueIds } from "./opaque.ts"

export class EventLogOpenError extends Data.TaggedError("EventLogOpenError")<{ readonly path: string; readonly cause: unknown }> {
  override get message(): string {
    return `cannot open event_log ${this.path}: ${this.cause instanceof Error ? this.cause.message : String(this.cause)}`
  }
}

/** Fields that are never written, whatever event carries them. */
const NEVER_WRITTEN: ReadonlySet<string> = new Set(["data", "payload", "body", "headers", "token", "endpoint", "key", "uaid"])

/** Fields replaced by their opaque id. */
const OPAQUE_FIELDS: ReadonlySet<string> = new Set(["version", "messageId", "receipt"])

/** The JSON line of one event (without the newline). */
export const makeEventLine = (opaque: (value: string) => string = makeOpaqueIds()) =>
  (event: DomainEvent): string => {
    const data: Record<string, unknown> = {}
    for (const [key, value] of Object.entries(event.data)) {
      if (value === undefined || NEVER_WRITTEN.has(key)) continue
      data[key] = OPAQUE_FIELDS.has(key) && typeof value === "string" ? opaque(value) : value
    }
    return JSON.stringify({ time: event.time, type: event.type, uaid: opaque(event.uaid), data })
  }

interface EventLogFileOptions {
  /** `-` for stdout, else a file path (created if missing, appended to). */
  readonly target: string
  /** Shared opaque-id function (so the trace and the log hash each value once). */
  readonly opaque?: ((value: string) => string) | undefined
  /** Lines waiting beyond this are dropped. Default 16 MiB. */
  readonly maxBufferBytes?: number
  /** Called for each dropped line. */
  readonly onDrop?: (() => void) | undefined
}

/**
 * A sink writing JSON lines; the file is opened now (a bad path fails here, at startup) and flushed
 * and closed with the scope.
 */
export const openEventLog = (options: EventLogFileOptions): Effect.Effect<EventSink, EventLogOpenError, Scope.Scope> =>
  Effect.gen(function*() {
    const line = makeEventLine(options.opaque)
    if (options.target === "-") {
      return (event) => void process.stdout.write(`${line(event)}\n`)
    }
    const path = options.target
    const fd = yield* Effect.try({
      try: () => openSync(path, "a", 0o640),
      catch: (cause) => new EventLogOpenError({ path, cause })
    })
    const stream = createWriteStream(path, { fd, flags: "a" })
    let failed = false
    stream.on("error", (error) => {
      if (!failed) process.stderr.write(`event_log ${path}: ${error.message}\n`)
      failed = true
    })
    yield* Effect.addFinalizer(() =>
      Effect.callback<void>((resume) => {
        if (stream.destroyed) return resume(Effect.void)
        stream.end(() => resume(Effect.void))
      })
    )
    const maxBufferBytes = options.maxBufferBytes ?? 16 * 1024 * 1024
    return (event) => {
      if (failed || stream.writableLength > maxBufferBytes) return void options.onDrop?.()
      stream.write(`${line(event)}\n`)
    }
  })
