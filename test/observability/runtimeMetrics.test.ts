/**
 * The process metrics: read from the real process when reported. A blocked event loop shows in the
 * delay gauge, an open socket in the socket count, allocation in the GC timer; `build_info` names
 * the version, commit and Node.js.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { createServer, connect, type Socket } from "node:net"
import { METRICS } from "../../src/observability/catalog.ts"
import { Metrics } from "../../src/observability/Metrics.ts"
import { runtimeMetricsLayer } from "../../src/observability/runtimeMetrics.ts"
import { versionInfo } from "../../src/observability/version.ts"

const withRuntimeMetrics = Layer.provideMerge(runtimeMetricsLayer, Metrics.layerMemory)

describe("runtime metrics", () => {
  it.live("memory, CPU, uptime, sockets, event-loop delay, GC and build_info", () =>
    Effect.gen(function*() {
      const metrics = yield* Metrics
      const read = (name: string) => metrics.value(name) ?? Number.NaN
      assert.strictEqual(metrics.value(METRICS.buildInfo.name, { version: versionInfo.version, commit: versionInfo.commit, node: process.versions.node }), 1)
      assert.isAbove(read(METRICS.residentMemory.name), 10_000_000)
      assert.isAbove(read(METRICS.heapUsed.name), 1_000_000)
      assert.isAbove(read(METRICS.cpu.name), 0)
      assert.isAbove(read(METRICS.uptime.name), 0)

      // The event loop blocked for 80 ms: the next reading's p99 says so.
      read(METRICS.eventLoopDelay.name)
      yield* Effect.sleep("30 millis")
      const until = Date.now() + 80
      while (Date.now() < until) { /* busy */ }
      yield* Effect.sleep("30 millis")
      assert.isAbove(read(METRICS.eventLoopDelay.name), 50)

      // One more TCP connection (both ends are this process's sockets).
      const before = read(METRICS.openSockets.name)
      const server = createServer()
      const port = yield* Effect.callback<number>((resume) => void server.listen(0, "127.0.0.1", () => resume(Effect.succeed((server.address() as { port: number }).port))))
      const accepted = yield* Effect.callback<Socket>((resume) => {
        server.once("connection", (socket) => resume(Effect.succeed(socket)))
        connect(port, "127.0.0.1")
      })
      assert.isAtLeast(read(METRICS.openSockets.name), before + 2)
      accepted.destroy()
      server.close()

      // Allocation makes the young generation collect: the GC timer counts it.
      let keep: Array<Array<number>> = []
      for (let i = 0; i < 200_000; i++) keep.push([i, i + 1, i + 2])
      keep = []
      yield* Effect.sleep("50 millis")
      const collected = metrics.snapshot().filter((s) => s.name === METRICS.gc.name).reduce((n, s) => n + s.count, 0)
      assert.isAbove(collected, 0, `gc observations (kept ${keep.length})`)
    }).pipe(Effect.provide(withRuntimeMetrics)))
})
