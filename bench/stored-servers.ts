/**
 * The bare server of `bench:stored` and `bench:storm`, a child process: `node stored-servers.ts
 * DATA_DIR`. Plain `node:http` and `ws` in one process with the service's storage: an embedded
 * dynalite on a worker thread of this process (`src/storage/dynalite/thread.ts`, LevelDB under
 * DATA_DIR), spoken to with the service's DynamoDB JSON client, in the service's table layout
 * (`stored-tables.ts`). No protocol logic, no validation, no Effect; only what the service must do
 * for the same outcome:
 *
 * - `POST /push/{uaid}/{chid}`: PutItem the body (base64url) as a timestamp row, answer 201;
 * - a WebSocket's first frame, a hello `{ uaid }`: GetItem the router record, UpdateItem it (node id
 *   and `connected_at`: the user is claimed), answer the hello; then Query the user's rows, 25 at a
 *   time with `ConsistentRead` as the service does, and send each as a notification frame. Once a
 *   page is acked its rows are deleted (DeleteItem for one, BatchWriteItem else) and, if the page
 *   was full, the next one is read.
 *
 * Not measured: `GET /statements` answers how many storage requests the routes above made, by operation.
 *
 * Posts `{ ready: true, ws, http, dynamo }` (ports on 127.0.0.1) over IPC once listening.
 *
 * `node stored-servers.ts --shared DYNAMO_URL WS_PORT HTTP_PORT I N` (`bench:scaling`): process I of
 * N on one storage server whose tables exist, sharing the two ports with the others (SO_REUSEPORT).
 * Its message timestamps are ≡ I (mod N), so that two processes never write the same row.
 */
import { createServer, type Server } from "node:http"
import { WebSocketServer } from "ws"
import { dynaliteWorker } from "../src/storage/dynalite/worker.ts"
import { bareSession, createTables, MESSAGE_TABLE, messageItem, type Send, storageClient } from "./stored-tables.ts"

const HOST = "127.0.0.1"
process.on("SIGTERM", () => process.exit(0))
process.on("SIGINT", () => process.exit(0))
// The bench is gone (even killed): so is its server.
process.on("disconnect", () => process.exit(0))

/** `--shared`: the storage server, the ports and which of how many processes this is. */
const shared = process.argv[2] === "--shared"
  ? { dynamoUrl: process.argv[3] as string, ws: Number(process.argv[4]), http: Number(process.argv[5]), index: Number(process.argv[6]), count: Number(process.argv[7]) }
  : undefined

/** An embedded dynalite on a worker thread: its port. */
const embeddedStorage = async (dataDir: string): Promise<number> => {
  const worker = dynaliteWorker()
  worker.postMessage({ open: dataDir })
  const port = await new Promise<number>((resolve, reject) =>
    worker.once("message", (m: { readonly port?: number; readonly error?: { readonly message: string } }) =>
      m.port !== undefined ? resolve(m.port) : reject(new Error(`dynalite did not start: ${m.error?.message}`))))
  return port
}

const dynamoPort = shared === undefined ? await embeddedStorage(process.argv[2] as string) : Number(new URL(shared.dynamoUrl).port)
const storage = await storageClient(shared?.dynamoUrl ?? `http://${HOST}:${dynamoPort}`)
if (shared === undefined) await createTables(storage.send)

const statements: Record<string, number> = {}
const send: Send = (operation, input) => {
  statements[operation] = (statements[operation] ?? 0) + 1
  return storage.send(operation, input)
}

const fail = (error: unknown) => console.error("bare server:", error)

let lastMs = 0
const [slot, slots] = [shared?.index ?? 0, shared?.count ?? 1]
/**
 * A ms of its own per message (the service moves a message whose key is taken to the next ms); of
 * several processes, each takes only the ms ≡ its index.
 */
const nextMs = () => {
  const ms = Math.max(Date.now(), lastMs + 1)
  return (lastMs = ms + ((slot - (ms % slots) + slots) % slots))
}

const http = createServer((req, res) => {
  const [, route, uaid, chid] = (req.url ?? "").split("/")
  const chunks: Array<Buffer> = []
  req.on("data", (chunk: Buffer) => chunks.push(chunk))
  req.on("end", () => {
    const answer = (status: number, body = "") => res.writeHead(status, { "content-length": Buffer.byteLength(body) }).end(body)
    if (req.method === "GET" && route === "statements") return answer(200, JSON.stringify(statements))
    if (route !== "push" || uaid === undefined || chid === undefined) return answer(404)
    const data = Buffer.concat(chunks).toString("base64url")
    const item = messageItem(uaid, chid, nextMs(), data, String(req.headers["content-encoding"] ?? "aes128gcm"), Number(req.headers["ttl"] ?? 0))
    send("PutItem", { TableName: MESSAGE_TABLE, Item: item }).then(() => answer(201), (error: unknown) => {
      fail(error)
      answer(503)
    })
  })
})

/** Listens on `port` (0: any), shared with the other processes in `--shared`: its port. */
const listen = async (server: Server, port: number): Promise<number> => {
  await new Promise<void>((resolve) => server.listen({ port, host: HOST, reusePort: shared !== undefined }, resolve))
  return (server.address() as { port: number }).port
}

// What `ws` answers a plain request on a port of its own.
const wsHttp = createServer((_req, res) => res.writeHead(426, { "content-length": 0 }).end())
const wss = new WebSocketServer({ server: wsHttp, clientTracking: false })
const wsPort = await listen(wsHttp, shared?.ws ?? 0)
const routerUrl = `http://${HOST}:${wsPort}`
wss.on("connection", (ws) => bareSession(send, fail)(ws, routerUrl))
process.send?.({ ready: true, ws: wsPort, http: await listen(http, shared?.http ?? 0), dynamo: dynamoPort })
