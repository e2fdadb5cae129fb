/**
 * Other connection nodes as a session reaches them: `PUT /notif` (check storage) and `DELETE /notif`
 * (drop a stale session), through the node's router-port client, in the background — a failure is a
 * warning, never awaited by the session. The layer owns those fibers: at shutdown, what is under
 * way finishes before the client goes.
 */
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as FiberSet from "effect/FiberSet"
import * as Layer from "effect/Layer"
import type { Peers } from "../protocol/session.ts"
import { NodeClient, type NodeTransportError } from "../routers/NodeClient.ts"

/** A call a session made to another node (what the test layer hands over). */
export type PeerCall =
  | { readonly kind: "notify"; readonly nodeId: string; readonly uaid: string }
  | { readonly kind: "disconnect"; readonly nodeId: string; readonly uaid: string; readonly connectedAt: number }

export class PeerNodes extends Context.Service<PeerNodes, Peers>()("autopush/connection/PeerNodes") {
  static readonly layer: Layer.Layer<PeerNodes, never, NodeClient> = Layer.effect(
    PeerNodes,
    Effect.gen(function*() {
      const nodes = yield* NodeClient
      const fibers = yield* FiberSet.make()
      const run = yield* FiberSet.runtime(fibers)<never>()
      yield* Effect.addFinalizer(() => FiberSet.awaitEmpty(fibers))
      const background = (what: string, call: Effect.Effect<number, NodeTransportError>) =>
        void run(call.pipe(
          Effect.asVoid,
          Effect.catchTag("NodeTransportError", (error) =>
            Effect.logWarning(`${what} to peer node failed`).pipe(Effect.annotateLogs({ reason: error.reason })))
        ))
      return PeerNodes.of({
        notify: (nodeId, uaid) => background("PUT /notif", nodes.notify(nodeId, uaid)),
        disconnect: (nodeId, uaid, connectedAt) => background("DELETE /notif", nodes.disconnect(nodeId, uaid, connectedAt))
      })
    })
  )

  /** Every call handed to `onCall`, at once (tests). */
  static readonly layerTest = (onCall: (call: PeerCall) => void): Layer.Layer<PeerNodes> =>
    Layer.succeed(
      PeerNodes,
      PeerNodes.of({
        notify: (nodeId, uaid) => onCall({ kind: "notify", nodeId, uaid }),
        disconnect: (nodeId, uaid, connectedAt) => onCall({ kind: "disconnect", nodeId, uaid, connectedAt })
      })
    )
}
