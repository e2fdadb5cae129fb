/**
 * statsd/DogStatsD output against a real UDP socket on 127.0.0.1: names prefixed with the role, tags
 * as `|#k:v`, counters and timers as they happen, gauges on their interval, buffered datagrams split
 * on newlines; and none of it when no statsd host is set.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { createSocket, type Socket } from "node:dgram"
import { EventLog } from "../../src/observability/EventLog.ts"
import { Metrics } from "../../src/observability/Metrics.ts"
import { observabilityLayer } from "../../src/observability/observability.ts"

interface Listener {
  readonly port: number
  /** Every metric line received so far (datagrams split on newlines). */
  readonly lines: Array<string>
  readonly datagrams: Array<string>
  /** Wait until `predicate` holds on the lines (2 s at most). */
  readonly until: (predicate: (lines: ReadonlyArray<string>) => boolean) => Effect.Effect<void>
}

const listen = Effect.acquireRelease(
  Effect.callback<{ socket: Socket; listener: Listener }>((resume) => {
    const socket = createSocket("udp4")
    const lines: Array<string> = []
    const datagrams: Array<string> = []
    socket.on("message", (message) => {
      const text = message.toString("utf8")
      datagrams.push(text)
      lines.push(...text.split("\n").filter((l) => l !== ""))
    })
    socket.bind(0, "127.0.0.1", () => {
      const until = (predicate: (lines: ReadonlyArray<string>) => boolean) =>
        Effect.gen(function*() {
          for (let i = 0; i < 200 && !predicate(lines); i++) yield* Effect.sleep(10)
          if (!predicate(lines)) return yield* Effect.die(new Error(`not received; got ${JSON.stringify(lines)}`))
        })
      resume(Effect.succeed({ socket, listener: { port: socket.address().port, lines, datagrams, until } }))
    })
  }),
  ({ socket }) => Effect.sync(() => socket.close())
).pipe(Effect.map(({ listener }) => listener))

const UAID = "a90359e3e4eb64f6e33d1267813bf91c"

describe("statsd", () => {
  it.live("domain events become DogStatsD counters and timers; gauges on their interval", () =>
    Effect.gen(function*() {
      const udp = yield* listen
      const layer = observabilityLayer({
        role: "autoconnect",
        statsdHost: "127.0.0.1",
        statsdPort: udp.port,
        statsdFlushIntervalMs: 0,
        statsdGaugeIntervalMs: 50
      })
      yield* Effect.gen(function*() {
        const events = yield* EventLog
        const metrics = yield* Metrics
        events.record({ type: "client.hello.1", uaid: UAID, time: 0, data: { kind: "new" } })
        events.record({ type: "channel.registered.1", uaid: UAID, time: 0, data: { channelId: "c" } })
        events.record({
          type: "notification.routed.1",
          uaid: UAID,
          time: 0,
          data: { channelId: "c", version: "v1", outcome: "direct", durationMs: 12.5 }
        })
        const unregister = metrics.sampled("ua.connections", {}, () => 3)
        yield* udp.until((lines) => lines.includes("autoconnect.ua.connections:3|g"))
        unregister()
        assert.includeMembers(udp.lines, [
          "autoconnect.ua.command.hello:1|c|#uaid:new",
          "autoconnect.ua.command.register:1|c",
          "autoconnect.notification.routed:1|c|#outcome:direct",
          "autoconnect.notification.route_time:12.5|ms|#outcome:direct"
        ])
        // Unbuffered: one metric per datagram.
        assert.isTrue(udp.datagrams.every((d) => d.split("\n").filter((l) => l !== "").length === 1))
      }).pipe(Effect.provide(layer))
    }))

  it.live("buffered: several metrics per datagram, all flushed when the layer closes", () =>
    Effect.gen(function*() {
      const udp = yield* listen
      const layer = Metrics.layer({
        statsd: { host: "127.0.0.1", port: udp.port, prefix: "autoendpoint", flushIntervalMs: 60_000, gaugeIntervalMs: 60_000 }
      })
      yield* Effect.gen(function*() {
        const metrics = yield* Metrics
        for (let i = 0; i < 5; i++) metrics.counter("notification.received").inc()
        metrics.gauge("request.in_flight").set(2)
        metrics.timer("request.time", { route: "push", status: "201" }).record(4)
      }).pipe(Effect.provide(layer))
      // Closing the layer sent the gauges and flushed the buffer.
      yield* udp.until((lines) => lines.length >= 7)
      assert.deepStrictEqual(udp.lines.filter((l) => l.startsWith("autoendpoint.notification.received")).length, 5)
      assert.include(udp.lines, "autoendpoint.request.in_flight:2|g")
      assert.include(udp.lines, "autoendpoint.request.time:4|ms|#route:push,status:201")
      assert.isBelow(udp.datagrams.length, udp.lines.length)
    }))

  it.live("no statsd host: nothing is sent, metrics still kept", () =>
    Effect.gen(function*() {
      const udp = yield* listen
      yield* Effect.gen(function*() {
        const events = yield* EventLog
        events.record({ type: "client.hello.1", uaid: UAID, time: 0, data: { kind: "new" } })
        assert.strictEqual((yield* Metrics).value("ua.command.hello", { uaid: "new" }), 1)
      }).pipe(Effect.provide(observabilityLayer({ role: "autoconnect", statsdPort: udp.port })))
      yield* Effect.sleep(50)
      assert.deepStrictEqual(udp.lines, [])
    }))

  it.live("an unreachable statsd host does not disturb recording", () =>
    Effect.gen(function*() {
      const errors: Array<string> = []
      yield* Effect.gen(function*() {
        const metrics = yield* Metrics
        for (let i = 0; i < 3; i++) metrics.counter("ua.command.register").inc()
        assert.strictEqual(metrics.value("ua.command.register"), 3)
        yield* Effect.sleep(50)
      }).pipe(
        Effect.provide(Layer.fresh(Metrics.layer({
          statsd: {
            host: "statsd.invalid",
            port: 8125,
            prefix: "autoconnect",
            flushIntervalMs: 0,
            onError: (e) => void errors.push(e.message)
          }
        })))
      )
    }))
})
