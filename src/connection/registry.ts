/**
 * The sessions of this node: every live connection (for timers and shutdown) and, once identified,
 * the one session per uaid that deliveries go to. A newer session of a uaid kicks the older one.
 *
 * A poke for a uaid with no session here is remembered (the last `MISSED_POKES_KEPT`): a session
 * resuming that uaid has written the record that names this node before it registers here, so a
 * message stored meanwhile (by an endpoint, or saved by the session it replaced) is announced
 * before it can be heard, and may sit behind what its first read covered. The session checks
 * storage once more when it registers.
 */
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import type { Notification } from "../domain/notification.ts"
import { RecentMap } from "../platform/memo.ts"
import { METRICS } from "../observability/catalog.ts"
import { Metrics } from "../observability/Metrics.ts"
import type { SessionHandle, SessionRegistry } from "../protocol/session.ts"

export interface NodeRegistryService extends SessionRegistry {
  /** Every connection, identified or not. */
  readonly connections: ReadonlySet<SessionHandle>
  readonly track: (handle: SessionHandle) => void
  readonly get: (uaid: string) => SessionHandle | undefined
  /** Identified sessions. */
  readonly count: () => number
  /**
   * Queue a notification for the uaid's session; false when it is not here, is not the session
   * connected at `connectedAt` (when given), has unregistered the channel, wants more urgent
   * messages than this one, or holds as many messages as it may (queued, or sent and not acked).
   */
  readonly deliver: (uaid: string, notification: Notification, connectedAt?: number) => boolean
  /** Ask the uaid's session to check storage; false when it is not here. */
  readonly checkStorage: (uaid: string) => boolean
}

/** Pokes for uaids with no session here that are remembered, the latest ones. */
export const MISSED_POKES_KEPT = 4_096

/** `onQueueFull`: told of each delivery a session's full queue refused. */
export const makeNodeRegistry = (onQueueFull: () => void = () => {}): NodeRegistryService => {
  const connections = new Set<SessionHandle>()
  const byUaid = new Map<string, SessionHandle>()
  const missedPokes = new RecentMap<true>(MISSED_POKES_KEPT)
  return {
    connections,
    track: (handle) => void connections.add(handle),
    get: (uaid) => byUaid.get(uaid),
    count: () => byUaid.size,
    deliver: (uaid, notification, connectedAt) => {
      const handle = byUaid.get(uaid)
      if (handle === undefined || !handle.takes(notification, connectedAt)) return false
      if (handle.offerDelivery(notification)) return true
      if (!handle.mailbox.isClosed) onQueueFull()
      return false
    },
    checkStorage: (uaid) => {
      if (byUaid.get(uaid)?.mailbox.offer({ _tag: "CheckStorage" }) === true) return true
      missedPokes.set(uaid, true)
      return false
    },
    register: (handle) => {
      const uaid = handle.uaid as string
      const older = byUaid.get(uaid)
      if (older !== undefined && older !== handle) older.mailbox.offerFirst({ _tag: "Kick", kind: "ghost" })
      byUaid.set(uaid, handle)
      if (missedPokes.get(uaid) === undefined) return
      missedPokes.delete(uaid)
      handle.mailbox.offer({ _tag: "CheckStorage" })
    },
    remove: (handle) => {
      connections.delete(handle)
      if (handle.uaid !== undefined && byUaid.get(handle.uaid) === handle) byUaid.delete(handle.uaid)
    }
  }
}

export class NodeRegistry extends Context.Service<NodeRegistry, NodeRegistryService>()(
  "autopush/connection/NodeRegistry"
) {
  /** Refusals by a full queue counted as `ua.delivery.queue_full`. */
  static readonly layer = Layer.effect(
    NodeRegistry,
    Effect.map(Metrics, (metrics) => {
      const queueFull = metrics.counter(METRICS.deliveryQueueFull.name)
      return makeNodeRegistry(() => queueFull.inc())
    })
  )
}
