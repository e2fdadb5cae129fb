/**
 * Domain events → metrics (names in `catalog.ts`). Handles are resolved once; tags whose values come
 * from clients (ack, nack and unregister codes) are folded into known values so that a client cannot
 * grow the registry.
 */
import type { DomainEvent } from "../domain/events.ts"
import { METRICS } from "./catalog.ts"
import type { EventSink } from "./EventLog.ts"
import { type Counter, handlesBy, type MetricsService, type Tags, type Timer } from "./Metrics.ts"

/** A client's code as a tag value: one of `values`, or `otherwise`. */
const known = (values: ReadonlyArray<number>, otherwise: string) => {
  const set = new Set(values)
  return (code: number | undefined): string => (code === undefined ? "none" : set.has(code) ? String(code) : otherwise)
}

const unregisterCode = known([200, 201, 202, 203], "other")
const ackCode = known([100, 101, 102], "other")
const nackCode = (code: number): string => (code >= 301 && code <= 303 ? String(code) : "0")

export const metricsSink = (metrics: MetricsService): EventSink => {
  const counter = (name: string, tags?: Tags): Counter => metrics.counter(name, tags)
  const timer = (name: string, tags?: Tags): Timer => metrics.timer(name, tags)

  const hello = handlesBy((uaid) => counter(METRICS.hello.name, { uaid }))
  const register = counter(METRICS.register.name)
  const unregister = handlesBy((code) => counter(METRICS.unregister.name, { code }))
  const refused = handlesBy((key) => {
    const [command, reason] = key.split(":") as [string, string]
    return counter(METRICS.refused.name, { command, reason })
  })
  const ack = handlesBy((key) => {
    const [source, code] = key.split(":") as [string, string]
    return counter(METRICS.ack.name, { source, code })
  })
  const nack = handlesBy((code) => counter(METRICS.nack.name, { code }))
  const urgency = handlesBy((min) => counter(METRICS.urgency.name, { min }))
  const sent = handlesBy((source) => counter(METRICS.sent.name, { source }))
  const retrieved = counter(METRICS.retrieved.name)
  const expiration = handlesBy((reason) => counter(METRICS.expiration.name, { reason }))
  const migrated = counter(METRICS.migrated.name)
  const closed = handlesBy((key) => {
    const at = key.indexOf(":")
    return counter(METRICS.closed.name, { code: key.slice(0, at), reason: key.slice(at + 1) })
  })
  const stored = handlesBy((reason) => counter(METRICS.stored.name, { reason }))
  const broadcastDelivered = handlesBy((reason) => counter(METRICS.broadcastDelivered.name, { reason }))
  const expired = counter(METRICS.expired.name)
  const deleted = counter(METRICS.deleted.name)
  const received = counter(METRICS.received.name)
  const receiptRequested = counter(METRICS.receiptRequested.name)
  const receipt = handlesBy((outcome) => counter(METRICS.receipt.name, { outcome }))
  const routed = handlesBy((outcome) => counter(METRICS.routed.name, { outcome }))
  const routeTime = handlesBy((outcome) => timer(METRICS.routeTime.name, { outcome }))
  const bridgeSent = handlesBy((platform) => counter(METRICS.bridgeSent.name, { platform }))
  const bridgeError = handlesBy((key) => {
    const at = key.indexOf(":")
    return counter(METRICS.bridgeError.name, { platform: key.slice(0, at), reason: key.slice(at + 1) })
  })

  return (event: DomainEvent) => {
    switch (event.type) {
      case "client.hello.1":
        return hello(event.data.kind).inc()
      case "channel.registered.1":
        return register.inc()
      case "channel.unregistered.1":
        return unregister(unregisterCode(event.data.code)).inc()
      case "channel.refused.1":
        return refused(`${event.data.command}:${event.data.reason}`).inc()
      case "notification.accepted.1":
        received.inc()
        if (event.data.receipt !== undefined) receiptRequested.inc()
        return
      case "notification.receipt.1":
        return receipt(event.data.outcome).inc()
      case "notification.routed.1":
        routed(event.data.outcome).inc()
        return routeTime(event.data.outcome).record(event.data.durationMs)
      case "notification.stored.1":
        return stored(event.data.reason).inc()
      case "notification.bridged.1":
        return bridgeSent(event.data.platform).inc()
      case "notification.bridge_failed.1":
        return bridgeError(`${event.data.platform}:${event.data.reason}`).inc()
      case "notification.delivered.1":
        sent(event.data.source).inc()
        if (event.data.source === "stored") retrieved.inc()
        return
      case "notification.acked.1":
        return ack(`${event.data.source}:${ackCode(event.data.code)}`).inc()
      case "notification.nacked.1":
        return nack(nackCode(event.data.code)).inc()
      case "client.urgency.1":
        return urgency(event.data.min).inc()
      case "notification.expired.1":
        return expired.inc()
      case "notification.deleted.1":
        return deleted.inc()
      case "uaid.reset.1":
        return expiration(event.data.reason).inc()
      case "month.migrated.1":
        return migrated.inc()
      case "broadcast.delivered.1":
        return broadcastDelivered(event.data.reason).inc()
      case "session.closed.1":
        return closed(`${event.data.code}:${event.data.reason}`).inc()
      default:
        // Event types this sink does not know are ignored: consumers of the event log skip unknown types.
        return
    }
  }
}
