/**
 * The bare server of `bench:storm --workers W`, a child process: `node storm-servers.ts DATA_DIR W`.
 * Laid out as our node with workers is: this process (the supervisor) runs the embedded dynalite on
 * a worker thread (`src/storage/dynalite/worker.ts`, LevelDB under DATA_DIR) and creates the
 * service's tables (`stored-tables.ts`); it forks W processes (`storm-servers.ts --worker
 * DYNAMO_URL PORT`) that share one WebSocket port (SO_REUSEPORT) and speak to that store over
 * loopback HTTP with the service's DynamoDB JSON client. Each does for a reconnecting client what
 * `stored-servers.ts`'s bare server does, and no more:
 *
 * - a WebSocket's first frame, a hello `{ uaid }`: GetItem the router record, UpdateItem it (node id
 *   and `connected_at`: the user is claimed), answer the hello; then Query the user's rows, 25 at a
 *   time with `ConsistentRead` as the service does, and send each as a notification frame. Once a
 *   page is acked its rows are deleted (DeleteItem for one, BatchWriteItem else) and, if the page
 *   was full, the next one is read.
 *
 * Every DynamoDB request a worker makes is counted by operation: the IPC request `{ cmd: "counts" }`
 * to the supervisor answers `{ counts: { op: n } }`, summed over the workers, and resets them.
 * Posts `{ ready: true, ws, dynamo }` (ports on 127.0.0.1) once every worker listens.
 */
import { type ChildProcess, fork } from "node:child_process"
import { createServer } from "node:http"
import { WebSocketServer } from "ws"
import { dynaliteWorker } from "../src/storage/dynalite/worker.ts"
import { bareSession, createTables, type Send, storageClient } from "./stored-tables.ts"

const HOST = "127.0.0.1"
process.on("SIGINT", () => process.exit(0))
// The bench is gone (even killed): so is its server.
process.on("disconnect", () => process.exit(0))

type Counts = Record<string, number>

const supervisor = async (dataDir: string, workers: number) => {
  const thread = dynaliteWorker()
  thread.postMessage({ open: dataDir })
  const dynamoPort = await new Promise<number>((resolve, reject) =>
    thread.once("message", (m: { readonly port?: number; readonly error?: { readonly message: string } }) =>
      m.port !== undefined ? resolve(m.port) : reject(new Error(`dynalite did not start: ${m.error?.message}`))))
  const dynamoUrl = `http://${HOST}:${dynamoPort}`
  const storage = await storageClient(dynamoUrl)
  await createTables(storage.send)
  storage.destroy()

  const children: Array<ChildProcess> = []
  let wsPort = 0
  for (let i = 0; i < workers; i++) {
    const child = fork(new URL(import.meta.url).pathname, ["--worker", dynamoUrl, String(wsPort)], { stdio: ["ignore", "inherit", "inherit", "ipc"] })
    children.push(child)
    wsPort = await new Promise<number>((resolve, reject) => {
      child.once("message", (m: { readonly ws: number }) => resolve(m.ws))
      child.once("exit", (code) => reject(new Error(`a bare worker exited (${code})`)))
    })
  }
  const stop = () => {
    for (const child of children) child.kill("SIGTERM")
    process.exit(0)
  }
  process.on("SIGTERM", stop)
  process.on("disconnect", stop)
  process.on("message", (m: { readonly cmd?: string }) => {
    if (m.cmd !== "counts") return
    void Promise.all(children.map((child) =>
      new Promise<Counts>((resolve) => {
        const onMessage = (reply: { readonly counts?: Counts }) => {
          if (reply.counts === undefined) return
          child.off("message", onMessage)
          resolve(reply.counts)
        }
        child.on("message", onMessage)
        child.send({ cmd: "counts" })
      })
    )).then((all) => {
      const counts: Counts = {}
      for (const one of all) for (const [op, n] of Object.entries(one)) counts[op] = (counts[op] ?? 0) + n
      process.send?.({ counts })
    })
  })
  process.send?.({ ready: true, ws: wsPort, dynamo: dynamoPort })
}

const worker = async (dynamoUrl: string, port: number) => {
  process.on("SIGTERM", () => process.exit(0))
  const storage = await storageClient(dynamoUrl)
  let counts: Counts = {}
  const send: Send = (operation, input) => {
    counts[operation] = (counts[operation] ?? 0) + 1
    return storage.send(operation, input)
  }
  process.on("message", (m: { readonly cmd?: string }) => {
    if (m.cmd !== "counts") return
    process.send?.({ counts })
    counts = {}
  })
  const fail = (error: unknown) => console.error("bare worker:", error)

  const server = createServer()
  const wss = new WebSocketServer({ server, clientTracking: false })
  await new Promise<void>((resolve) => server.listen({ port, host: HOST, reusePort: true }, resolve))
  const wsPort = (server.address() as { port: number }).port
  // A worker's own address for the router record, as each of ours has its router port.
  const routerUrl = `http://${HOST}:${wsPort}/${process.pid}`
  wss.on("connection", (ws) => bareSession(send, fail)(ws, routerUrl))
  process.send?.({ ws: wsPort })
}

if (process.argv[2] === "--worker") await worker(process.argv[3] as string, Number(process.argv[4]))
else await supervisor(process.argv[2] as string, Number(process.argv[3] ?? 1))
