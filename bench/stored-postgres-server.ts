/**
 * The bare server of `bench:stored` on PostgreSQL (`--db-dsn`), a child process: `node
 * stored-postgres-server.ts DSN`. Plain `node:http`, `ws` and one `pg` pool on the server and
 * database the service uses, in the service's table layout (`src/storage/sql/tables.ts`: the router
 * table and one message table, no rotation). No protocol logic, no validation, no Effect; only what
 * the service must do for the same outcome:
 *
 * - `POST /push/{uaid}/{chid}`: one plain INSERT of the body (base64url) as a timestamp row, answer 201;
 * - a WebSocket's first frame, a hello `{ uaid }`: one UPDATE claiming the router record (node id
 *   and `connected_at`), answer the hello; then SELECT the user's rows, 25 at a time, and send each
 *   as a notification frame. Once a page is acked its rows are deleted (one DELETE) and, if the
 *   page was full, the next one is read.
 *
 * Not measured: `PUT /user/{uaid}` writes a user's router record (the bench's offline client), and
 * `GET /statements` answers how many statements the routes above ran, by kind.
 *
 * Posts `{ ready: true, ws, http }` (ports on 127.0.0.1) over IPC once listening.
 */
import { createServer, type Server } from "node:http"
import pg from "pg"
import { WebSocket, WebSocketServer } from "ws"
import { fixedTablesSql, messageTableSql, POSTGRES } from "../src/storage/sql/tables.ts"
import { MESSAGE_TABLE, PAGE, ROUTER_TABLE } from "./stored-tables.ts"

const HOST = "127.0.0.1"
process.on("SIGTERM", () => process.exit(0))
process.on("SIGINT", () => process.exit(0))
process.on("disconnect", () => process.exit(0))

const pool = new pg.Pool({ connectionString: process.argv[2] as string, max: 10 })
pool.on("error", () => {})
const options = { routerTable: ROUTER_TABLE, messageTablePrefix: MESSAGE_TABLE, noTableRotation: true }
for (const sql of [...fixedTablesSql(options, POSTGRES), ...messageTableSql(MESSAGE_TABLE, POSTGRES)]) await pool.query(sql)

const fail = (error: unknown) => console.error("bare server:", error)

const statements = { insert: 0, claim: 0, page: 0, delete: 0 }

let lastMs = 0
/** A ms of its own per message (the service moves a message whose key is taken to the next ms). */
const nextMs = () => (lastMs = Math.max(Date.now(), lastMs + 1))

const http = createServer((req, res) => {
  const [, route, uaid, chid] = (req.url ?? "").split("/")
  const chunks: Array<Buffer> = []
  req.on("data", (chunk: Buffer) => chunks.push(chunk))
  req.on("end", () => {
    const answer = (status: number, body = "") => res.writeHead(status, { "content-length": Buffer.byteLength(body) }).end(body)
    if (req.method === "GET" && route === "statements") return answer(200, JSON.stringify(statements))
    if (req.method === "PUT" && route === "user" && uaid !== undefined) {
      pool.query(`INSERT INTO ${ROUTER_TABLE} (uaid, connected_at, router_type, router_data) VALUES ($1, $2, 'webpush', '{}')`, [uaid, Date.now()])
        .then(() => answer(204), (error: unknown) => {
          fail(error)
          answer(503)
        })
      return
    }
    if (route !== "push" || uaid === undefined || chid === undefined) return answer(404)
    const ms = nextMs()
    const sortKey = `02:${String(ms).padStart(13, "0")}:${chid}`
    const ttl = Number(req.headers["ttl"] ?? 0)
    const seconds = Math.floor(ms / 1000)
    pool.query(
      `INSERT INTO ${MESSAGE_TABLE} (uaid, chidmessageid, updateid, ttl, timestamp, expiry, data, headers) VALUES ($1, $2, $2, $3, $4, $5, $6, $7)`,
      [uaid, sortKey, ttl, seconds, seconds + ttl, Buffer.concat(chunks).toString("base64url"), JSON.stringify({ encoding: String(req.headers["content-encoding"] ?? "aes128gcm") })]
    ).then(() => {
      statements.insert++
      answer(201)
    }, (error: unknown) => {
      fail(error)
      answer(503)
    })
  })
})

const session = (ws: WebSocket, routerUrl: string): void => {
  let uaid = ""
  let keys: Array<string> = []
  const unacked = new Set<string>()
  let more = false

  const readPage = async (after: string) => {
    const { rows } = await pool.query(
      `SELECT chidmessageid, updateid, data, headers FROM ${MESSAGE_TABLE} WHERE uaid = $1 AND chidmessageid > $2 AND chidmessageid < '02;' ORDER BY chidmessageid LIMIT ${PAGE}`,
      [uaid, after]
    )
    statements.page++
    more = rows.length === PAGE
    keys = rows.map((row) => String(row["chidmessageid"]))
    for (const row of rows) {
      const sortKey = String(row["chidmessageid"])
      unacked.add(sortKey)
      ws.send(JSON.stringify({
        messageType: "notification",
        channelID: sortKey.slice(sortKey.lastIndexOf(":") + 1),
        version: row["updateid"],
        data: row["data"],
        headers: JSON.parse(String(row["headers"]))
      }))
    }
  }

  const hello = async () => {
    const { rowCount } = await pool.query(`UPDATE ${ROUTER_TABLE} SET node_id = $1, connected_at = $2 WHERE uaid = $3`, [routerUrl, Date.now(), uaid])
    statements.claim++
    if (rowCount === 0) return ws.close()
    ws.send(JSON.stringify({ messageType: "hello", uaid, status: 200, use_webpush: true, broadcasts: {} }))
    await readPage("02:")
  }

  const deletePage = async () => {
    const rows = keys
    keys = []
    await pool.query(`DELETE FROM ${MESSAGE_TABLE} WHERE uaid = $1 AND chidmessageid = ANY($2::text[])`, [uaid, rows])
    statements.delete++
    if (more) await readPage(rows.at(-1) as string)
  }

  ws.on("message", (data) => {
    const frame = JSON.parse(data.toString()) as { messageType?: string; uaid?: string; updates?: Array<{ version?: string }> }
    if (frame.messageType === "hello") {
      uaid = frame.uaid ?? ""
      hello().catch(fail)
    } else if (frame.messageType === "ack") {
      for (const update of frame.updates ?? []) unacked.delete(update.version ?? "")
      if (unacked.size === 0 && keys.length > 0) deletePage().catch(fail)
    }
  })
}

const listen = async (server: Server): Promise<number> => {
  await new Promise<void>((resolve) => server.listen({ port: 0, host: HOST }, resolve))
  return (server.address() as { port: number }).port
}

const wsHttp = createServer((_req, res) => res.writeHead(426, { "content-length": 0 }).end())
const wss = new WebSocketServer({ server: wsHttp, clientTracking: false })
const wsPort = await listen(wsHttp)
const routerUrl = `http://${HOST}:${wsPort}`
wss.on("connection", (ws) => session(ws, routerUrl))
process.send?.({ ready: true, ws: wsPort, http: await listen(http) })
