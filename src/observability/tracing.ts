/**
 * Traces (OpenTelemetry, OTLP/HTTP JSON), off unless `otlp_endpoint` is set.
 *
 * A message's trace: the endpoint's `notification.accept` span (a child of the app server's own
 * `traceparent`, when it sends one) with `notification.route` and `notification.store` under it; the
 * route span's context crosses to the connection node as a `traceparent` header (or in-process in
 * the all-in-one), where `notification.deliver` and `notification.ack` become its children. The
 * connection node's two spans are a projection of the session's events (`deliverySpans`): the
 * `delivered` event of a direct delivery carries the context, the `acked` event closes the loop.
 *
 * No span carries a uaid, endpoint token, message id or payload: the platform's own HTTP server spans
 * (which would record URLs and headers) are off, and the spans here name only outcomes and opaque ids.
 * Without an endpoint the tracer is disabled altogether, so spans cost nothing on the hot path.
 */
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as References from "effect/References"
import * as Tracer from "effect/Tracer"
import type * as OtlpExporter from "effect/observability/OtlpExporter"
import { RecentMap } from "../platform/memo.ts"
import type { DomainEvent } from "../domain/events.ts"
import type { EventSink } from "./EventLog.ts"
import { opaqueId } from "./opaque.ts"

interface TracingOptions {
  /** OTLP/HTTP base URL (the collector's, e.g. `http://collector:4318`); unset: no tracing. */
  readonly otlpEndpoint?: string | undefined
  /** The `service.name` resource attribute: the node's role. */
  readonly serviceName: string
  readonly serviceVersion: string
  /** How often spans are exported (ms, default 5 000). */
  readonly exportIntervalMs?: number | undefined
}

/**
 * The OTLP tracer when an endpoint is configured; otherwise tracing off (`References.TracerEnabled`).
 * The exporter's modules (an HTTP client among them) are only loaded when it is configured: they are
 * a good part of a node's start-up otherwise.
 */
export const tracingLayer = (options: TracingOptions): Layer.Layer<never> | Layer.Layer<OtlpExporter.Flusher> =>
  options.otlpEndpoint === undefined
    ? Layer.succeed(References.TracerEnabled, false)
    : Layer.unwrap(Effect.promise(async () => {
      const [OtlpTracer, OtlpSerialization, FetchHttpClient] = await Promise.all([
        import("effect/observability/OtlpTracer"),
        import("effect/observability/OtlpSerialization"),
        import("effect/http/FetchHttpClient")
      ])
      return OtlpTracer.layer({
        url: `${(options.otlpEndpoint as string).replace(/\/+$/, "")}/v1/traces`,
        resource: { serviceName: options.serviceName, serviceVersion: options.serviceVersion },
        exportInterval: options.exportIntervalMs ?? 5_000
      }).pipe(Layer.provide(OtlpSerialization.layerJson), Layer.provide(FetchHttpClient.layer))
    }))

/** A W3C `traceparent` (`00-{trace}-{span}-{flags}`) as a parent span, or undefined when malformed. */
const parseTraceparent = (value: string): Tracer.ExternalSpan | undefined => {
  const match = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/.exec(value)
  if (match === null) return undefined
  return Tracer.externalSpan({ traceId: match[1] as string, spanId: match[2] as string, sampled: (Number.parseInt(match[3] as string, 16) & 1) === 1 })
}

const nanos = (ms: number): bigint => BigInt(ms) * 1_000_000n

/** Direct deliveries waiting for their ack, at most this many (the oldest is forgotten). */
const OPEN_DELIVERIES = 10_000

/**
 * The connection node's spans of a message, folded from events: `notification.deliver` when a direct
 * delivery with a trace context goes out, `notification.ack` (from delivery to ack) when it is acked.
 */
export const deliverySpans = (tracer: Tracer.Tracer): EventSink => {
  const open = new RecentMap<{ readonly parent: Tracer.ExternalSpan; readonly at: number }>(OPEN_DELIVERIES)
  const span = (name: string, parent: Tracer.ExternalSpan, start: number, end: number, attributes: Record<string, unknown>) => {
    const s = tracer.span({
      name,
      parent: Option.some(parent),
      annotations: Context.empty(),
      links: [],
      startTime: nanos(start),
      kind: "consumer",
      root: false,
      sampled: parent.sampled
    })
    for (const [key, value] of Object.entries(attributes)) s.attribute(key, value)
    s.end(nanos(end), Exit.void)
  }
  return (event: DomainEvent) => {
    if (event.type === "notification.delivered.1") {
      const parent = event.data.traceparent === undefined ? undefined : parseTraceparent(event.data.traceparent)
      if (parent === undefined) return
      span("notification.deliver", parent, event.time, event.time, { "autopush.message": opaqueId(event.data.version) })
      open.set(event.data.version, { parent, at: event.time })
      return
    }
    if (event.type === "notification.acked.1") {
      const delivered = open.get(event.data.version)
      if (delivered === undefined) return
      open.delete(event.data.version)
      span("notification.ack", delivered.parent, delivered.at, event.time, {
        "autopush.message": opaqueId(event.data.version),
        "autopush.ack_code": event.data.code
      })
    }
  }
}

/**
 * Spans on the per-message path (no stack trace captured), decided once where the handlers are
 * built: with tracing off `span` adds nothing — Effect would still make, provide and end a no-op span
 * on every call.
 */
interface MessageSpans {
  readonly enabled: boolean
  readonly span: (name: string, options?: Tracer.SpanOptionsNoTrace) => <A, E, R>(self: Effect.Effect<A, E, R>) => Effect.Effect<A, E, R>
}

const NO_STACK = { captureStackTrace: false } as const

export const messageSpans: Effect.Effect<MessageSpans> = Effect.map(Effect.service(References.TracerEnabled), (enabled) => ({
  enabled,
  span: enabled ? (name, options) => Effect.withSpan(name, options, NO_STACK) : () => (self) => self
}))
