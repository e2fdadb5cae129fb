/**
 * Servers for `bench:connections`, run as a child process: `node connection-servers.ts autopush|bare`.
 * Reports over IPC: `{ port }` once listening, then `{ rss, heapUsed, connections }` (after a full
 * GC) each time the parent sends "measure" (`{ measure: true, gc: false }`: without the GCs).
 *
 * `node connection-servers.ts bare PORT` (the bench's --workers mode): one of several bare processes
 * sharing PORT with SO_REUSEPORT (the first is given 0 and reports the port it got); it answers a
 * hello with the uaid the client sent (or a new one) and a register with an endpoint, as ours does.
 */
import { randomUUID } from "node:crypto"
import { createServer } from "node:http"
import { WebSocketServer } from "ws"

const send = (message: unknown) => process.send?.(message)
let connections = () => 0

/** Full GCs spread over a few seconds (V8 compacts and returns pages over several), then a reading. */
const measure = async (collect: boolean) => {
  const gc = (globalThis as { gc?: (options?: unknown) => void }).gc
  for (let i = 0; collect && i < 5; i++) {
    gc?.()
    await new Promise((resolve) => setTimeout(resolve, 500))
  }
  const { rss, heapUsed, heapTotal, external } = process.memoryUsage()
  send({ rss, heapUsed, heapTotal, external, connections: connections() })
}
process.on("SIGINT", () => process.exit(0))
process.on("message", (m) => {
  if (m === "measure") void measure(true)
  else if (typeof m === "object" && m !== null && "measure" in m) void measure((m as { gc?: boolean }).gc !== false)
})
process.on("SIGTERM", () => process.exit(0))
process.on("disconnect", () => process.exit(0))

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

/**
 * The baseline of the --workers mode: one of several `ws` processes sharing `port` (SO_REUSEPORT),
 * answering hello (with the client's uaid, else a new one) and register, and nothing else.
 */
const bareShared = (port: number) => {
  const server = createServer()
  const wss = new WebSocketServer({ server, clientTracking: true })
  wss.on("connection", (ws) => {
    ws.on("message", (data) => {
      const frame = JSON.parse(data.toString()) as { messageType?: string; uaid?: string; channelID?: string }
      if (frame.messageType === "hello") {
        const uaid = frame.uaid ?? randomUUID().replaceAll("-", "")
        ws.send(JSON.stringify({ messageType: "hello", uaid, status: 200, use_webpush: true, broadcasts: {} }))
      } else if (frame.messageType === "register") {
        ws.send(JSON.stringify({ messageType: "register", channelID: frame.channelID, status: 200, pushEndpoint: `http://127.0.0.1/wpush/v1/${frame.channelID}` }))
      }
    })
  })
  connections = () => wss.clients.size
  server.listen({ port, host: "127.0.0.1", reusePort: true }, () => send({ port: (server.address() as { port: number }).port }))
}

/** BENCH_BROADCASTS=1: the node serves Firefox's Remote Settings broadcast (the clients follow it). */
const BENCH_BROADCASTS: ReadonlyMap<string, string> = process.env["BENCH_BROADCASTS"] === "1"
  ? new Map([["remote-settings/monitor_changes", "\"1700000000000\""]])
  : new Map()

/** The service's modules are loaded here only: the bare servers' memory holds none of them. */
const autopush = async () => {
  const { startConnectionNode } = await import("./connection-node.ts")
  const node = await startConnectionNode(BENCH_BROADCASTS)
  connections = node.connections
  send({ port: node.port })
}

if (process.argv[2] === "bare" && process.argv[3] !== undefined) bareShared(Number(process.argv[3]))
else if (process.argv[2] === "bare") bare()
else await autopush()
