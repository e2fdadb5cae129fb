/**
 * The caps on held collectors of receipt subscriptions (`GET /receipts/{id}`), on this node. A held
 * GET does not count toward `max_in_flight_requests` (it must not keep pushes out), so collectors
 * have bounds of their own: per subscription and per client address (429/116 with `Retry-After`
 * beyond: when the first of the holds in the way ends at the latest), and all together (503/201).
 */
import * as Effect from "effect/Effect"
import { Overloaded, TooManyCollectors } from "../domain/errors.ts"
import { METRICS } from "../observability/catalog.ts"
import type { MetricsService } from "../observability/Metrics.ts"
import type { ReceiptOptions } from "./options.ts"

/** A held collector: when its hold ends at the latest (ms). */
export interface Hold {
  readonly until: number
}

/** Seconds until one of `holds` ends at the latest. */
const retryAfter = (holds: ReadonlySet<Hold>, now: number): number => {
  let first = Number.POSITIVE_INFINITY
  for (const hold of holds) first = Math.min(first, hold.until)
  return Math.max(1, Math.ceil((first - now) / 1000))
}

const addTo = (map: Map<string, Set<Hold>>, key: string, hold: Hold) => {
  const holds = map.get(key)
  if (holds === undefined) map.set(key, new Set([hold]))
  else holds.add(hold)
}

const removeFrom = (map: Map<string, Set<Hold>>, key: string, hold: Hold) => {
  const holds = map.get(key)
  holds?.delete(hold)
  if (holds?.size === 0) map.delete(key)
}

export const makeCollectorCaps = (options: ReceiptOptions | undefined, metrics: MetricsService | undefined) => {
  const caps = {
    subscription: options?.maxCollectorsPerSubscription ?? 4,
    address: options?.maxCollectorsPerAddress ?? 32,
    node: options?.maxCollectors ?? 1024
  }
  const bySubscription = new Map<string, Set<Hold>>()
  const byAddress = new Map<string, Set<Hold>>()
  let holding = 0
  const heldGauge = metrics?.gauge(METRICS.receiptCollectors.name)
  const refusedCount = (limit: "subscription" | "address" | "node") => metrics?.counter(METRICS.receiptCollectorsRefused.name, { limit }).inc()

  /** A collector of `id` from `address`, held until `until`, admitted or refused at a cap. */
  const admit = (id: string, address: string | undefined, now: number, until: number): Effect.Effect<Hold, TooManyCollectors | Overloaded> => {
    const ofSubscription = bySubscription.get(id)
    if (ofSubscription !== undefined && ofSubscription.size >= caps.subscription) {
      refusedCount("subscription")
      return Effect.fail(new TooManyCollectors({ by: "receipt subscription", retryAfter: retryAfter(ofSubscription, now) }))
    }
    const ofAddress = address === undefined ? undefined : byAddress.get(address)
    if (ofAddress !== undefined && ofAddress.size >= caps.address) {
      refusedCount("address")
      return Effect.fail(new TooManyCollectors({ by: "address", retryAfter: retryAfter(ofAddress, now) }))
    }
    if (holding >= caps.node) {
      refusedCount("node")
      return Effect.fail(new Overloaded())
    }
    const hold: Hold = { until }
    addTo(bySubscription, id, hold)
    if (address !== undefined) addTo(byAddress, address, hold)
    holding++
    heldGauge?.add(1)
    return Effect.succeed(hold)
  }

  const release = (id: string, address: string | undefined, hold: Hold) =>
    Effect.sync(() => {
      removeFrom(bySubscription, id, hold)
      if (address !== undefined) removeFrom(byAddress, address, hold)
      holding--
      heldGauge?.add(-1)
    })

  return { admit, release }
}
