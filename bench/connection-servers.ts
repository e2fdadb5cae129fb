/**
 * Servers for `bench:connections`, run as a child process: `node connection-servers.ts autopush|bare`.
 * Reports over IPC: `{ port }` once listening, then `{ rss, heapUsed, connections }` (after a full
 * GC) each time the parent sends "measure".
 */
import { Broadcasts } from "../src/broadcast/Broadcasts.ts"
import { Effect, Layer } from "effect"
import { WebSocketServer } from "ws"
import { connectionNodeOptions } from "../src/bin/app.ts"
import { makeSettings } from "../src/config/index.ts"
import { ConnectionNode } from "../src/connection/node.ts"
import { NodeRegistry } from "../src/connection/registry.ts"
import { EndpointCrypto } from "../src/crypto/endpoint.ts"
import { NodeClient } from "../src/routers/NodeClient.ts"
import { Metrics } from "../src/observability/Metrics.ts"
import { EventLog } from "../src/observability/EventLog.ts"
import { layerMemory } from "../src/storage/memory.ts"
import { createActiveTables } from "../src/storage/Storage.ts"

const send = (message: unknown) => process.send?.(message)
let connections = () => 0

/** Full GCs spread over a few seconds (V8 compacts and returns pages over several), then a reading. */
const measure = async () => {
  const gc = (globalThis as { gc?: (options?: unknown) => void }).gc
  for (let i = 0; i < 5; i++) {
    gc?.()
    await new Promise((resolve) => setTimeout(resolve, 500))
  }
  const { rss, heapUsed, heapTotal, external } = process.memoryUsage()
  send({ rss, heapUsed, heapTotal, external, connections: connections() })
}
process.on("SIGINT", () => process.exit(0))
process.on("message", (m) => {
  if (m === "measure") void measure()
})

const bare = () => {
  // The baseline: a plain `ws` server that answers hello and nothing else.
  const wss = new WebSocketServer({ port: 0, host: "127.0.0.1", clientTracking: true })
  wss.on("connection", (ws) => {
    ws.on("message", () => {
      ws.send(JSON.stringify({ messageType: "hello", uaid: "00000000000000000000000000000000", status: 200, use_webpush: true, broadcasts: {} }))
    })
  })
  connections = () => wss.clients.size
  wss.on("listening", () => send({ port: (wss.address() as { port: number }).port }))
}

/** BENCH_BROADCASTS=1: the node serves Firefox's Remote Settings broadcast (the clients follow it). */
const BENCH_BROADCASTS: ReadonlyMap<string, string> = process.env["BENCH_BROADCASTS"] === "1"
  ? new Map([["remote-settings/monitor_changes", "\"1700000000000\""]])
  : new Map()

const autopush = () => {
  const node = ConnectionNode.layer(
    {
      ...connectionNodeOptions(makeSettings()),
      port: 0,
      routerPort: 0,
      bindHost: "127.0.0.1",
      helloTimeoutMs: 30_000
    },
    (port) => `http://127.0.0.1:${port}`
  ).pipe(
    Layer.provideMerge(Layer.effectDiscard(createActiveTables).pipe(
      Layer.provideMerge(layerMemory({ routerTable: "router", messageTablePrefix: "message", noTableRotation: false }))
    )),
    Layer.provide(Layer.mergeAll(Broadcasts.layerStatic(BENCH_BROADCASTS), EndpointCrypto.layerTest, EventLog.layer(), Metrics.layerNoop, NodeClient.layer({ connectTimeoutMs: 1_000, requestTimeoutMs: 1_000 })))
  )
  Effect.runFork(Effect.gen(function*() {
    const { port } = yield* ConnectionNode
    const registry = yield* NodeRegistry
    connections = () => registry.count()
    send({ port })
    return yield* Effect.never
  }).pipe(Effect.provide(node)))
}

if (process.argv[2] === "bare") bare()
else autopush()
