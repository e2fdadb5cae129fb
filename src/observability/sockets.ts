/**
 * The connection counts of a listening port (`platform/socket-limits.ts`): `net.connections{port}`,
 * `net.connection.refused{port,reason}`, `net.connection.timeout{port,phase}`.
 */
import type { PortCounters, PortLabel } from "../platform/socket-limits.ts"
import { METRICS } from "./catalog.ts"
import type { MetricsService } from "./Metrics.ts"

export const portCounters = (metrics: MetricsService, port: PortLabel): PortCounters => {
  const open = metrics.gauge(METRICS.netConnections.name, { port })
  const refused = {
    per_address: metrics.counter(METRICS.netRefused.name, { port, reason: "per_address" }),
    max_connections: metrics.counter(METRICS.netRefused.name, { port, reason: "max_connections" })
  }
  const timedOut = {
    request: metrics.counter(METRICS.netTimeout.name, { port, phase: "request" }),
    idle: metrics.counter(METRICS.netTimeout.name, { port, phase: "idle" })
  }
  return {
    refused: (reason) => refused[reason].inc(),
    timedOut: (phase) => timedOut[phase].inc(),
    opened: () => open.add(1),
    closed: () => open.add(-1)
  }
}
