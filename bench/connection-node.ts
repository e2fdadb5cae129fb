/**
 * An autopush connection node in the bench's own process, on in-memory storage, for the memory
 * benches (`connection-servers.ts`, `memory-idle.ts`). Import it dynamically: the bare servers'
 * processes then hold none of the service's modules.
 */
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { connectionNodeOptions } from "../src/bin/app.ts"
import { Broadcasts } from "../src/broadcast/Broadcasts.ts"
import { makeSettings } from "../src/config/index.ts"
import { ConnectionNode } from "../src/connection/node.ts"
import { NodeRegistry } from "../src/connection/registry.ts"
import { EndpointCrypto } from "../src/crypto/endpoint.ts"
import { EventLog } from "../src/observability/EventLog.ts"
import { Metrics } from "../src/observability/Metrics.ts"
import { NodeClient } from "../src/routers/NodeClient.ts"
import { RouterAuth } from "../src/crypto/routerAuth.ts"
import { layerMemory } from "../src/storage/memory/layer.ts"
import { createActiveTables } from "../src/storage/Storage.ts"

export interface RunningNode {
  readonly port: number
  /** Connections its registry holds now. */
  readonly connections: () => number
}

/** The node with the default settings on a free loopback port, serving `broadcasts`; runs until the process exits. */
export const startConnectionNode = (broadcasts: ReadonlyMap<string, string>): Promise<RunningNode> =>
  new Promise((resolve) => {
    const node = ConnectionNode.layer(
      { ...connectionNodeOptions(makeSettings()), port: 0, routerPort: 0, bindHost: "127.0.0.1", helloTimeoutMs: 30_000 },
      (port) => `http://127.0.0.1:${port}`
    ).pipe(
      Layer.provideMerge(Layer.effectDiscard(createActiveTables).pipe(
        Layer.provideMerge(layerMemory({ routerTable: "router", messageTablePrefix: "message", noTableRotation: false }))
      )),
      Layer.provide(Layer.mergeAll(
        Broadcasts.layerStatic(broadcasts),
        EndpointCrypto.layerTest,
        EventLog.layer(),
        Metrics.layerNoop,
        NodeClient.layer({ connectTimeoutMs: 1_000, requestTimeoutMs: 1_000 }).pipe(Layer.provideMerge(RouterAuth.layerTest))
      ))
    )
    Effect.runFork(Effect.gen(function*() {
      const { port } = yield* ConnectionNode
      const registry = yield* NodeRegistry
      resolve({ port, connections: () => registry.count() })
      return yield* Effect.never
    }).pipe(Effect.provide(node)))
  })
