/**
 * Observability wired from settings: one `EventLog` whose sinks are the metrics (`metricsSink`), the
 * message trace window and, when `event_log` is set, the JSON-lines event log; plus the `Metrics`
 * registry (Prometheus text, statsd when `statsd_host` is set) and the `MessageTrace`.
 *
 * Where they are served:
 * - the endpoint node (`EndpointServer`) finds `Metrics` in its context: `GET /metrics`, request
 *   metrics, routing time;
 * - the connection node passes `routerObservability(registry)` to `handleRouterRequest`:
 *   `GET /metrics` and `GET /__trace__/{message_id}` on the router port, connection gauges.
 */
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import type * as Scope from "effect/Scope"
import * as Tracer from "effect/Tracer"
import { METRICS } from "./catalog.ts"
import { runtimeMetricsLayer } from "./runtimeMetrics.ts"
import { EventLog, EventLogMemory, recordTo, type EventSink } from "./EventLog.ts"
import { type EventLogOpenError, openEventLog } from "./eventLogFile.ts"
import { MessageTrace, type TraceDocument } from "./MessageTrace.ts"
import { Metrics, type MetricsService } from "./Metrics.ts"
import { metricsSink } from "./metricsSink.ts"
import { makeOpaqueIds } from "./opaque.ts"
import { deliverySpans } from "./tracing.ts"

interface ObservabilityOptions {
  /** `autopush`, `autoconnect`, `autoendpoint`: the statsd prefix. */
  readonly role: string
  /** `statsd_host`; statsd is off when unset. */
  readonly statsdHost?: string | undefined
  /** `statsd_port` (default 8125). */
  readonly statsdPort?: number | undefined
  /** `event_log`: `-` for stdout, a file path, or unset for none. */
  readonly eventLog?: string | undefined
  /** statsd client buffering (ms, default 1000) and gauge period (ms, default 10 000). */
  readonly statsdFlushIntervalMs?: number | undefined
  readonly statsdGaugeIntervalMs?: number | undefined
  /** This process's number when the node runs as several workers: a `worker` tag on every statsd metric (gauges would overwrite each other's otherwise). */
  readonly worker?: number | undefined
}

/** `EventLog` over the metrics, the trace and the optional event-log file, given `Metrics` and `MessageTrace`. */
const eventLogOver = (
  eventLog: string | undefined,
  opaque: (value: string) => string,
  extra: ReadonlyArray<EventSink> = []
): Effect.Effect<Array<EventSink>, EventLogOpenError, Metrics | MessageTrace | Scope.Scope> =>
  Effect.gen(function*() {
    const metrics = yield* Metrics
    const trace = yield* MessageTrace
    const tracer = yield* Tracer.Tracer
    const sinks: Array<EventSink> = [...extra, metricsSink(metrics), trace.sink]
    if (tracer !== Tracer.nativeTracer) sinks.push(deliverySpans(tracer))
    if (eventLog !== undefined && eventLog !== "") {
      const dropped = metrics.counter(METRICS.eventLogDropped.name)
      sinks.push(yield* openEventLog({
        target: eventLog,
        opaque,
        onDrop: () => dropped.inc()
      }))
    }
    return sinks
  })

/**
 * The live observability of a node (or of the all-in-one process: both nodes then share it, so
 * traces have both halves and `/metrics` on either port shows everything).
 */
export const observabilityLayer = (
  options: ObservabilityOptions
): Layer.Layer<EventLog | Metrics | MessageTrace, EventLogOpenError> => {
  const opaque = makeOpaqueIds()
  const metrics = Metrics.layer({
    statsd: options.statsdHost === undefined || options.statsdHost === "" ? undefined : {
      host: options.statsdHost,
      port: options.statsdPort ?? 8125,
      prefix: options.role,
      ...(options.worker === undefined ? {} : { tags: [`worker:${options.worker}`] }),
      ...(options.statsdFlushIntervalMs !== undefined ? { flushIntervalMs: options.statsdFlushIntervalMs } : {}),
      ...(options.statsdGaugeIntervalMs !== undefined ? { gaugeIntervalMs: options.statsdGaugeIntervalMs } : {})
    }
  })
  const trace = MessageTrace.layer({ opaque })
  const events = Layer.effect(
    EventLog,
    Effect.map(eventLogOver(options.eventLog, opaque), (sinks) => EventLog.of({ record: recordTo(sinks) }))
  )
  return Layer.mergeAll(events, runtimeMetricsLayer).pipe(Layer.provideMerge(Layer.mergeAll(metrics, trace)))
}

/**
 * For tests: the in-memory event log (`EventLogMemory`) that also feeds in-memory `Metrics` and a
 * `MessageTrace`, and the event-log file when `eventLog` is given.
 */
export const observabilityLayerMemory = (
  options: Pick<ObservabilityOptions, "eventLog"> = {}
): Layer.Layer<EventLog | EventLogMemory | Metrics | MessageTrace, EventLogOpenError> => {
  const opaque = makeOpaqueIds()
  const events = Layer.effectContext(
    Effect.gen(function*() {
      const recorded: Array<Parameters<EventSink>[0]> = []
      const sinks = yield* eventLogOver(options.eventLog, opaque, [(e) => void recorded.push(e)])
      return Context.make(EventLog, EventLog.of({ record: recordTo(sinks) })).pipe(
        Context.add(EventLogMemory, EventLogMemory.of({ events: recorded }))
      )
    })
  )
  return events.pipe(
    Layer.provideMerge(Layer.mergeAll(Metrics.layerMemory, MessageTrace.layer({ opaque })))
  )
}

// ── the connection node's router port ───────────────────────────────────────────────────────────

/** What the router port's `/metrics` and `/__trace__/{id}` serve; either may be absent (then 404). */
export interface RouterObservability {
  readonly metrics?: Pick<MetricsService, "prometheus"> | undefined
  readonly trace?: { readonly lookup: (messageId: string) => TraceDocument | undefined } | undefined
}

/** The connection registry as the gauges see it. */
interface ConnectionCounts {
  /** Identified sessions. */
  readonly count: () => number
  /** Every open connection. */
  readonly connections: ReadonlySet<unknown>
}

/**
 * The connection node's observability: `Metrics`, and the `MessageTrace` when provided:
 * registers the `ua.connections` / `ua.sockets` gauges for the scope, and returns what
 * `handleRouterRequest` serves.
 */
export const routerObservability = (
  registry: ConnectionCounts
): Effect.Effect<RouterObservability, never, Metrics | Scope.Scope> =>
  Effect.gen(function*() {
    const metrics = yield* Metrics
    const trace = Option.getOrUndefined(yield* Effect.serviceOption(MessageTrace))
    const connections = metrics.sampled(METRICS.connections.name, {}, () => registry.count())
    const sockets = metrics.sampled(METRICS.sockets.name, {}, () => registry.connections.size)
    yield* Effect.addFinalizer(() =>
      Effect.sync(() => {
        connections()
        sockets()
      })
    )
    return { metrics, trace }
  })
