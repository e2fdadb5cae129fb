/**
 * Where domain events go. The live layer hands them to sinks registered at startup (metrics, the
 * JSON-lines event log); the memory layer keeps them for assertions.
 */
import { Context, Layer } from "effect"
import type { DomainEvent } from "../domain/events.ts"

export interface EventLogService {
  /** Synchronous on purpose: recording sits on per-message hot paths. */
  readonly record: (event: DomainEvent) => void
}

export class EventLogMemory extends Context.Service<EventLogMemory, { readonly events: Array<DomainEvent> }>()(
  "autopush/observability/EventLogMemory"
) {}

export class EventLog extends Context.Service<EventLog, EventLogService>()("autopush/observability/EventLog") {
  /** Fan out to the given sinks (none: events are dropped). */
  static readonly layer = (sinks: ReadonlyArray<(event: DomainEvent) => void> = []) =>
    Layer.succeed(EventLog, EventLog.of({ record: (event) => sinks.forEach((sink) => sink(event)) }))

  /** Keeps every event in order; read them back through `EventLogMemory`. */
  static readonly layerMemory = Layer.syncContext(() => {
    const events: Array<DomainEvent> = []
    return Context.make(EventLog, EventLog.of({ record: (e) => void events.push(e) })).pipe(
      Context.add(EventLogMemory, EventLogMemory.of({ events }))
    )
  })
}
