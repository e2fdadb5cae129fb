/**
 * Metrics: counters, gauges and timers on Effect's `Metric` module, one registry per instance,
 * rendered as Prometheus text by `effect/observability`'s `PrometheusMetrics` (`GET /metrics`) and,
 * when a statsd host is configured, forwarded to statsd/DogStatsD (tags as DogStatsD `|#k:v`, names
 * prefixed with the role, as autopush-rs).
 *
 * Recording is synchronous and cheap on purpose: it sits on per-message paths and is fed by
 * synchronous event sinks. `counter(name, tags)` returns a handle (one map lookup) that updates the
 * `Metric` against this instance's registry (a counter adds up its increments and updates it when
 * it is read); callers on hot paths keep handles.
 *
 * - counters and timers go to statsd as they happen (through the client's buffer);
 * - gauges go to statsd every `gaugeIntervalMs` (current values, sampled gauges read then);
 * - timers are Prometheus histograms in milliseconds; names follow `catalog.ts` (`prometheusName`).
 */
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Metric from "effect/Metric"
import * as PrometheusMetrics from "effect/observability/PrometheusMetrics"
import { metricInfo, type MetricKind, prometheusName } from "./catalog.ts"

export type Tags = Readonly<Record<string, string>>

export interface Counter {
  readonly inc: (n?: number) => void
}
interface Gauge {
  readonly set: (value: number) => void
  readonly add: (delta: number) => void
}
export interface Timer {
  /** One observation, in milliseconds. */
  readonly record: (ms: number) => void
}

interface SeriesSnapshot {
  readonly name: string
  readonly kind: MetricKind
  readonly tags: Tags
  /** Counter total, gauge value, or timer sum. */
  readonly value: number
  /** Timer observations (counters and gauges: 0). */
  readonly count: number
}

export interface MetricsService {
  readonly counter: (name: string, tags?: Tags) => Counter
  readonly gauge: (name: string, tags?: Tags) => Gauge
  readonly timer: (name: string, tags?: Tags) => Timer
  /** A gauge read when it is reported (scrape, statsd flush); returns its unregistration. */
  readonly sampled: (name: string, tags: Tags, read: () => number) => () => void
  /** Counter total, gauge value (sampled ones read now) or timer count; undefined if never touched. */
  readonly value: (name: string, tags?: Tags) => number | undefined
  readonly snapshot: () => ReadonlyArray<SeriesSnapshot>
  /** Prometheus text exposition format 0.0.4. */
  readonly prometheus: () => string
}

/** `Content-Type` of `prometheus()`. */
export const PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

/** Histogram bucket bounds of timers, in milliseconds. */
const TIMER_BUCKETS: ReadonlyArray<number> = [1, 2, 5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000]

/** Where counters and timers go as they happen, and gauges when flushed (statsd). */
interface MetricsForwarder {
  readonly count: (name: string, n: number, tags: ReadonlyArray<string>) => void
  readonly timing: (name: string, ms: number, tags: ReadonlyArray<string>) => void
  readonly gauge: (name: string, value: number, tags: ReadonlyArray<string>) => void
}

// ── the registry ────────────────────────────────────────────────────────────────────────────────

const seriesKey = (name: string, tags: Tags): string => {
  const keys = Object.keys(tags)
  if (keys.length === 0) return name
  keys.sort()
  let key = name
  for (const k of keys) key += `\u0000${k}=${tags[k]}`
  return key
}

const sortedTags = (tags: Tags): Tags => {
  const out: Record<string, string> = {}
  for (const k of Object.keys(tags).sort()) out[k] = tags[k] as string
  return out
}

/** One series (a name and its tags): its Effect `Metric`, and its statsd spelling. */
class Series implements Counter, Gauge, Timer {
  readonly name: string
  readonly kind: MetricKind
  readonly metric: Metric.Metric<number, unknown>
  readonly context: Context.Context<never>
  /** DogStatsD `k:v` tags. */
  readonly tagList: ReadonlyArray<string>
  readonly forward: MetricsForwarder | undefined
  read: (() => number) | undefined = undefined
  /**
   * A counter's increments not yet in its metric: added when it is read (`sample`, before every
   * read), so that a count on a per-message path is an addition, not an update of the registry.
   */
  private pending = 0

  constructor(name: string, kind: MetricKind, tags: Tags, context: Context.Context<never>, forward: MetricsForwarder | undefined) {
    this.name = name
    this.kind = kind
    this.context = context
    this.tagList = Object.entries(tags).map(([k, v]) => `${k}:${v}`)
    this.forward = forward
    const options = { description: metricInfo(name)?.help, attributes: tags }
    this.metric = kind === "counter" ? Metric.counter(name, options)
      : kind === "gauge" ? Metric.gauge(name, options)
      : Metric.histogram(name, { ...options, boundaries: TIMER_BUCKETS })
  }

  inc(n = 1): void {
    this.pending += n
    this.forward?.count(this.name, n, this.tagList)
  }

  set(value: number): void {
    this.metric.updateUnsafe(value, this.context)
  }

  add(delta: number): void {
    this.metric.modifyUnsafe(delta, this.context)
  }

  record(ms: number): void {
    this.metric.updateUnsafe(ms, this.context)
    this.forward?.timing(this.name, ms, this.tagList)
  }

  /** Bring the metric up to date: a counter's pending increments, a sampled gauge's reading (a read that throws reports NaN). */
  sample(): void {
    if (this.pending !== 0) {
      this.metric.updateUnsafe(this.pending, this.context)
      this.pending = 0
    }
    if (this.read === undefined) return
    let value: number
    try {
      value = this.read()
    } catch {
      value = Number.NaN
    }
    this.metric.updateUnsafe(value, this.context)
  }

  /** Counter total, gauge value, or timer (sum, count). */
  state(): { readonly value: number; readonly count: number } {
    const state = this.metric.valueUnsafe(this.context) as { count?: number; value?: number; sum?: number }
    return this.kind === "timer"
      ? { value: state.sum ?? 0, count: state.count ?? 0 }
      : { value: (this.kind === "counter" ? state.count : state.value) ?? 0, count: 0 }
  }
}

/** A registry: metrics kept on Effect's `Metric` in a registry of their own, optionally forwarded to statsd. */
export const makeMetrics = (forward?: MetricsForwarder): MetricsService & { readonly flushGauges: () => void } => {
  const context = Context.make(Metric.MetricRegistry, new Map())
  const series = new Map<string, Series>()
  const kinds = new Map<string, MetricKind>()

  const get = (name: string, kind: MetricKind, tags: Tags): Series => {
    const key = seriesKey(name, tags)
    const found = series.get(key)
    if (found !== undefined) {
      if (found.kind !== kind) throw new Error(`metric ${name} is a ${found.kind}, not a ${kind}`)
      return found
    }
    const known = kinds.get(name)
    if (known !== undefined && known !== kind) throw new Error(`metric ${name} is a ${known}, not a ${kind}`)
    kinds.set(name, kind)
    const made = new Series(name, kind, sortedTags(tags), context, forward)
    series.set(key, made)
    return made
  }

  const sampleAll = (): void => {
    for (const s of series.values()) s.sample()
  }

  const NO_TAGS: Tags = {}
  const metricNameMapper = (name: string): string => prometheusName(name, kinds.get(name) ?? "gauge")

  return {
    counter: (name, tags = NO_TAGS) => get(name, "counter", tags),
    gauge: (name, tags = NO_TAGS) => get(name, "gauge", tags),
    timer: (name, tags = NO_TAGS) => get(name, "timer", tags),
    sampled: (name, tags, read) => {
      const s = get(name, "gauge", tags)
      s.read = read
      return () => {
        if (s.read !== read) return
        s.read = undefined
        s.set(0)
      }
    },
    value: (name, tags = NO_TAGS) => {
      const s = series.get(seriesKey(name, tags))
      if (s === undefined) return undefined
      s.sample()
      const { value, count } = s.state()
      return s.kind === "timer" ? count : value
    },
    snapshot: () => {
      sampleAll()
      return [...series.values()].map((s) => ({ name: s.name, kind: s.kind, tags: sortedTagsOf(s), ...s.state() }))
    },
    prometheus: () => {
      sampleAll()
      return PrometheusMetrics.formatUnsafe(context, { metricNameMapper })
    },
    flushGauges: () => {
      if (forward === undefined) return
      for (const s of series.values()) {
        if (s.kind !== "gauge") continue
        s.sample()
        forward.gauge(s.name, s.state().value, s.tagList)
      }
    }
  }
}

const sortedTagsOf = (s: Series): Tags => (s.metric.attributes ?? {}) as Tags

const NOOP: Counter & Gauge & Timer = { inc: () => {}, set: () => {}, add: () => {}, record: () => {} }

// ── statsd ──────────────────────────────────────────────────────────────────────────────────────

interface StatsdOptions {
  readonly host: string
  readonly port: number
  /** Names are sent as `{prefix}.{name}` (autopush-rs: the role, `autoconnect` / `autoendpoint`). */
  readonly prefix: string
  /** DogStatsD tags sent with every metric. */
  readonly tags?: ReadonlyArray<string> | undefined
  /** How long the client buffers datagrams (ms; 0 sends each metric at once). Default 1000. */
  readonly flushIntervalMs?: number
  /** How often gauges are sent (ms). Default 10 000. */
  readonly gaugeIntervalMs?: number
  /** Called with client errors (DNS, socket); default: a warning log line, at most once a minute. */
  readonly onError?: (error: Error) => void
}

/** A hot-shots UDP client (DogStatsD tags) as a forwarder, and its closing; loaded only when statsd is configured. */
const statsdForwarder = async (options: StatsdOptions) => {
  const { StatsD } = await import("hot-shots")
  const flushIntervalMs = options.flushIntervalMs ?? 1_000
  const client = new StatsD({
    host: options.host,
    port: options.port,
    protocol: "udp",
    // Resolve the host once a minute, not per datagram.
    cacheDns: true,
    cacheDnsTtl: 60_000,
    prefix: options.prefix === "" ? "" : `${options.prefix}.`,
    globalTags: [...(options.tags ?? [])],
    // One datagram per buffer: below a typical MTU.
    maxBufferSize: flushIntervalMs > 0 ? 1_400 : 0,
    bufferFlushInterval: flushIntervalMs > 0 ? flushIntervalMs : 1_000,
    errorHandler: (error) => options.onError?.(error)
  })
  const forward: MetricsForwarder = {
    count: (name, n, tags) => client.increment(name, n, tags as Array<string>),
    timing: (name, ms, tags) => client.timing(name, ms, tags as Array<string>),
    gauge: (name, value, tags) => client.gauge(name, value, tags as Array<string>)
  }
  const close = () => new Promise<void>((resolve) => client.close(() => resolve()))
  return { forward, close }
}

// ── the service ─────────────────────────────────────────────────────────────────────────────────

interface MetricsOptions {
  /** Forward to statsd/DogStatsD; off when absent. */
  readonly statsd?: StatsdOptions | undefined
}

export class Metrics extends Context.Service<Metrics, MetricsService>()("autopush/observability/Metrics") {
  /**
   * The live registry (Prometheus text via `prometheus()`), forwarding to statsd when configured.
   * Closing the layer sends the gauges once more and flushes the statsd buffer.
   */
  static readonly layer = (options: MetricsOptions = {}): Layer.Layer<Metrics> =>
    Layer.effect(
      Metrics,
      Effect.gen(function*() {
        const statsd = options.statsd
        if (statsd === undefined) return Metrics.of(makeMetrics())
        // Client errors (DNS, socket) are logged with the node's logger, at most once a minute.
        const context = yield* Effect.context<never>()
        let reported = Number.NEGATIVE_INFINITY
        const onError = statsd.onError ?? ((error: Error) => {
          const now = performance.now()
          if (now - reported < 60_000) return
          reported = now
          Effect.runForkWith(context)(
            Effect.logWarning("statsd client error").pipe(Effect.annotateLogs({ error: error.message }))
          )
        })
        const { forward, close } = yield* Effect.promise(() => statsdForwarder({ ...statsd, onError }))
        const metrics = makeMetrics(forward)
        const timer = setInterval(metrics.flushGauges, statsd.gaugeIntervalMs ?? 10_000)
        timer.unref()
        yield* Effect.addFinalizer(() =>
          Effect.promise(() => {
            clearInterval(timer)
            metrics.flushGauges()
            return close()
          })
        )
        return Metrics.of(metrics)
      })
    )

  /** The registry only (no statsd): read values back with `value`, `snapshot`, `prometheus`. */
  static readonly layerMemory: Layer.Layer<Metrics> = Layer.sync(Metrics, () => Metrics.of(makeMetrics()))

  /** Metrics that go nowhere: for code that has to record and a context that does not care. */
  static readonly layerNoop: Layer.Layer<Metrics> = Layer.succeed(Metrics, Metrics.of({
    counter: () => NOOP,
    gauge: () => NOOP,
    timer: () => NOOP,
    sampled: () => () => {},
    value: () => undefined,
    snapshot: () => [],
    prometheus: () => ""
  }))
}

/** Metric handles made once per label value (or key of values) and kept: a hot path looks them up, never remakes them. */
export const handlesBy = <H>(make: (key: string) => H): ((key: string) => H) => {
  const handles = new Map<string, H>()
  return (key) => {
    let handle = handles.get(key)
    if (handle === undefined) {
      handle = make(key)
      handles.set(key, handle)
    }
    return handle
  }
}
