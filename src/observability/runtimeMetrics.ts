/**
 * What the process itself costs, on the node's `Metrics` (so on `/metrics` and statsd like the
 * rest): memory, CPU, uptime, open sockets, event-loop delay, GC pauses, and `build_info` naming
 * what runs. Gauges are read when they are reported; the layer owns the event-loop monitor and the
 * GC observer and stops them when the node stops.
 */
import { constants, monitorEventLoopDelay, PerformanceObserver } from "node:perf_hooks"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { METRICS } from "./catalog.ts"
import { handlesBy, Metrics } from "./Metrics.ts"
import { versionInfo } from "./version.ts"

const GC_KINDS: Readonly<Record<number, string>> = {
  [constants.NODE_PERFORMANCE_GC_MINOR]: "minor",
  [constants.NODE_PERFORMANCE_GC_MAJOR]: "major",
  [constants.NODE_PERFORMANCE_GC_INCREMENTAL]: "incremental",
  [constants.NODE_PERFORMANCE_GC_WEAKCB]: "weakcb"
}

/** TCP sockets in use; a listening server is a TCPServerWrap and is not counted. */
const openSockets = (): number => process.getActiveResourcesInfo().filter((kind) => kind === "TCPSocketWrap").length

export const runtimeMetricsLayer: Layer.Layer<never, never, Metrics> = Layer.effectDiscard(
  Effect.gen(function*() {
    const metrics = yield* Metrics
    metrics.gauge(METRICS.buildInfo.name, { version: versionInfo.version, commit: versionInfo.commit, node: process.versions.node }).set(1)

    const loop = monitorEventLoopDelay({ resolution: 10 })
    loop.enable()
    const p99 = () => {
      // Nanoseconds, over the time since the previous reading; nothing measured yet reads 0.
      const value = loop.count === 0 ? 0 : loop.percentile(99) / 1e6
      loop.reset()
      return value
    }

    const gcTimer = handlesBy((kind) => metrics.timer(METRICS.gc.name, { kind }))
    const gc = new PerformanceObserver((list) => {
      for (const entry of list.getEntries()) {
        gcTimer(GC_KINDS[(entry as { readonly detail?: { readonly kind?: number } }).detail?.kind ?? -1] ?? "other").record(entry.duration)
      }
    })
    gc.observe({ entryTypes: ["gc"] })

    const unregister = [
      metrics.sampled(METRICS.residentMemory.name, {}, () => process.memoryUsage.rss()),
      metrics.sampled(METRICS.heapUsed.name, {}, () => process.memoryUsage().heapUsed),
      metrics.sampled(METRICS.cpu.name, {}, () => {
        const { user, system } = process.cpuUsage()
        return (user + system) / 1e6
      }),
      metrics.sampled(METRICS.uptime.name, {}, () => process.uptime()),
      metrics.sampled(METRICS.openSockets.name, {}, openSockets),
      metrics.sampled(METRICS.eventLoopDelay.name, {}, p99)
    ]
    yield* Effect.addFinalizer(() =>
      Effect.sync(() => {
        for (const stop of unregister) stop()
        gc.disconnect()
        loop.disable()
      })
    )
  })
)
