/**
 * The bare server of `bench:stored` on SQLite, a child process: `node stored-sqlite-server.ts
 * DATA_DIR`. Plain `node:http` and `ws` in one process over one `node:sqlite` file opened as the
 * service opens its own (WAL, `synchronous=NORMAL`), the same columns as the service's router and
 * message tables. No protocol logic, no validation, no Effect; only what the service must do for the
 * same outcome:
 *
 * - `POST /push/{uaid}/{chid}`: one INSERT of the body (base64url) as a timestamp row, answer 201;
 * - a WebSocket's first frame, a hello `{ uaid }`: SELECT the router record, UPDATE it (node id and
 *   `connected_at`: the user is claimed), answer the hello; then SELECT the user's rows, 25 at a
 *   time, and send each as a notification frame. Once a page is acked its rows are deleted (one
 *   DELETE) and, if the page was full, the next one is read.
 *
 * Not measured: `PUT /user/{uaid}` writes a user's router record (the bench's offline client), and
 * `GET /statements` answers how many statements the routes above ran, by kind.
 *
 * Posts `{ ready: true, ws, http }` (ports on 127.0.0.1) over IPC once listening.
 */
import { createServer, type Server } from "node:http"
import { join } from "node:path"
import { DatabaseSync } from "node:sqlite"
import { WebSocketServer } from "ws"

const HOST = "127.0.0.1"
const PAGE = 25
process.on("SIGTERM", () => process.exit(0))
process.on("SIGINT", () => process.exit(0))
// The bench is gone (even killed): so is its server.
process.on("disconnect", () => process.exit(0))

const db = new DatabaseSync(join(process.argv[2] as string, "bare.sqlite"))
db.exec("PRAGMA journal_mode = WAL")
db.exec("PRAGMA synchronous = NORMAL")
db.exec(`CREATE TABLE IF NOT EXISTS router (
  uaid TEXT PRIMARY KEY, connected_at INTEGER NOT NULL, router_type TEXT, node_id TEXT, current_month TEXT
)`)
db.exec(`CREATE TABLE IF NOT EXISTS message (
  uaid TEXT NOT NULL, chidmessageid TEXT NOT NULL, updateid TEXT, ttl INTEGER, timestamp INTEGER, expiry INTEGER,
  data TEXT, headers TEXT, PRIMARY KEY (uaid, chidmessageid)
)`)

const statements = { insert: 0, getUser: 0, claim: 0, page: 0, delete: 0 }
const insertMessage = db.prepare("INSERT INTO message (uaid, chidmessageid, updateid, ttl, timestamp, expiry, data, headers) VALUES (?, ?, ?, ?, ?, ?, ?, ?)")
const putUser = db.prepare("INSERT OR REPLACE INTO router (uaid, connected_at, router_type, current_month) VALUES (?, ?, 'webpush', 'message')")
const getUser = db.prepare("SELECT uaid, connected_at, node_id FROM router WHERE uaid = ?")
const claim = db.prepare("UPDATE router SET node_id = ?, connected_at = ? WHERE uaid = ?")
const page = db.prepare(
  "SELECT chidmessageid, updateid, data, headers FROM message WHERE uaid = ? AND chidmessageid > ? AND chidmessageid < '02;' ORDER BY chidmessageid LIMIT ?"
)

let lastMs = 0
/** A ms of its own per message (the service moves a message whose key is taken to the next ms). */
const nextMs = () => (lastMs = Math.max(Date.now(), lastMs + 1))

const http = createServer((req, res) => {
  const [, route, uaid, chid] = (req.url ?? "").split("/")
  const chunks: Array<Buffer> = []
  req.on("data", (chunk: Buffer) => chunks.push(chunk))
  req.on("end", () => {
    const answer = (status: number, body = "") => res.writeHead(status, { "content-length": Buffer.byteLength(body) }).end(body)
    try {
      if (req.method === "GET" && route === "statements") return answer(200, JSON.stringify(statements))
      if (req.method === "PUT" && route === "user" && uaid !== undefined) {
        putUser.run(uaid, Date.now())
        return answer(204)
      }
      if (route !== "push" || uaid === undefined || chid === undefined) return answer(404)
      const ms = nextMs()
      const sortKey = `02:${String(ms).padStart(13, "0")}:${chid}`
      const ttl = Number(req.headers["ttl"] ?? 0)
      const seconds = Math.floor(ms / 1000)
      const headers = JSON.stringify({ encoding: String(req.headers["content-encoding"] ?? "aes128gcm") })
      insertMessage.run(uaid, sortKey, sortKey, ttl, seconds, seconds + ttl, Buffer.concat(chunks).toString("base64url"), headers)
      statements.insert++
      answer(201)
    } catch (error) {
      console.error("bare server:", error)
      answer(503)
    }
  })
})

interface Row {
  readonly chidmessageid: string
  readonly updateid: string
  readonly data: string
  readonly headers: string
}

/** The WebSocket session of a reconnecting client: hello, then its rows a page at a time, an acked page deleted. */
const session = (ws: import("ws").WebSocket, routerUrl: string): void => {
  let uaid = ""
  /** The page sent: its sort keys, and those (= versions) not acked yet. */
  let keys: Array<string> = []
  const unacked = new Set<string>()
  let full = false

  const readPage = (after: string) => {
    const rows = page.all(uaid, after, PAGE) as unknown as ReadonlyArray<Row>
    statements.page++
    full = rows.length === PAGE
    keys = rows.map((row) => row.chidmessageid)
    for (const row of rows) {
      unacked.add(row.chidmessageid)
      ws.send(JSON.stringify({
        messageType: "notification",
        channelID: row.chidmessageid.slice(row.chidmessageid.lastIndexOf(":") + 1),
        version: row.updateid,
        data: row.data,
        headers: JSON.parse(row.headers)
      }))
    }
  }

  ws.on("message", (data) => {
    try {
      const frame = JSON.parse(data.toString()) as { messageType?: string; uaid?: string; updates?: Array<{ version?: string }> }
      if (frame.messageType === "hello") {
        uaid = frame.uaid ?? ""
        statements.getUser++
        if (getUser.get(uaid) === undefined) return ws.close()
        claim.run(routerUrl, Date.now(), uaid)
        statements.claim++
        ws.send(JSON.stringify({ messageType: "hello", uaid, status: 200, use_webpush: true, broadcasts: {} }))
        readPage("02:")
      } else if (frame.messageType === "ack") {
        for (const update of frame.updates ?? []) unacked.delete(update.version ?? "")
        if (unacked.size > 0 || keys.length === 0) return
        const rows = keys
        keys = []
        db.prepare(`DELETE FROM message WHERE uaid = ? AND chidmessageid IN (${rows.map(() => "?").join(", ")})`).run(uaid, ...rows)
        statements.delete++
        if (full) readPage(rows[rows.length - 1] as string)
      }
    } catch (error) {
      console.error("bare server:", error)
    }
  })
}

const listen = async (server: Server): Promise<number> => {
  await new Promise<void>((resolve) => server.listen({ port: 0, host: HOST }, resolve))
  return (server.address() as { port: number }).port
}

// What `ws` answers a plain request on a port of its own.
const wsHttp = createServer((_req, res) => res.writeHead(426, { "content-length": 0 }).end())
const wss = new WebSocketServer({ server: wsHttp, clientTracking: false })
const wsPort = await listen(wsHttp)
const routerUrl = `http://${HOST}:${wsPort}`
wss.on("connection", (ws) => session(ws, routerUrl))
process.send?.({ ready: true, ws: wsPort, http: await listen(http) })
