/**
 * Where domain events go. The live layer hands them to sinks registered at startup (metrics, the
 * JSON-lines event log, the message trace; see `observability.ts`); the memory layer keeps them for
 * assertions.
 */
import * as Context from "effect/Context"
import * as Layer from "effect/Layer"
import type { DomainEvent } from "../domain/events.ts"

export interface EventLogService {
  /** Synchronous on purpose: recording sits on per-message hot paths. */
  readonly record: (event: DomainEvent) => void
}

/** A consumer of events. */
export type EventSink = (event: DomainEvent) => void

export class EventLogMemory extends Context.Service<EventLogMemory, { readonly events: Array<DomainEvent> }>()(
  "autopush/observability/EventLogMemory"
) {}

/**
 * `record` over sinks: each event is given to every sink in order. A sink that throws (a bug) is
 * reported once on stderr and does not stop the others, nor the transition that recorded the event.
 */
export const recordTo = (sinks: ReadonlyArray<EventSink>): EventLogService["record"] => {
  if (sinks.length === 0) return () => {}
  const reported = new Set<number>()
  return (event) => {
    for (let i = 0; i < sinks.length; i++) {
      try {
        ;(sinks[i] as EventSink)(event)
      } catch (error) {
        if (!reported.has(i)) {
          reported.add(i)
          process.stderr.write(`event sink ${i} failed on ${event.type}: ${String(error)}\n`)
        }
      }
    }
  }
}

export class EventLog extends Context.Service<EventLog, EventLogService>()("autopush/observability/EventLog") {
  /** Fan out to the given sinks (none: events are dropped). */
  static readonly layer = (sinks: ReadonlyArray<EventSink> = []) =>
    Layer.succeed(EventLog, EventLog.of({ record: recordTo(sinks) }))

  /**
   * Keeps every event in order; read them back through `EventLogMemory`. (With metrics and the trace
   * too: `observabilityLayerMemory` in `observability.ts`.)
   */
  static readonly layerMemory = Layer.syncContext(() => {
    const events: Array<DomainEvent> = []
    return Context.make(EventLog, EventLog.of({ record: (e) => void events.push(e) })).pipe(
      Context.add(EventLogMemory, EventLogMemory.of({ events }))
    )
  })
}
