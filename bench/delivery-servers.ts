/**
 * Servers for `bench:delivery`, each run as a child process (`node delivery-servers.ts MODE PORTS…`);
 * each answers the probe's IPC requests (`delivery-probe.ts`) and reports `{ ready: true }` once
 * listening:
 *
 * - `autopush WS ROUTER ENDPOINT`: the all-in-one process of `npm start` — the connection and
 *   endpoint layers `src/bin/app.ts` builds from settings, with its observability (metrics, trace)
 *   and timed storage — over the in-memory storage layer instead of embedded dynalite, with a
 *   generated crypto key and MozLog logging at `info`, as `npm start`;
 * - `bare WS HTTP`: the bare single-process pipeline: `POST /push/{id}` on plain `node:http` → a
 *   `Map` id → socket → plain `ws` send; no validation, no storage. A hello gets an id back;
 * - `bare-front HTTP BACK_PORT` and `bare-back WS ROUTER`: the bare two-process pipeline: the front
 *   forwards each POST as `PUT /push/{id}` (keep-alive agent) to the back, which sends on the socket;
 * - `bare-worker WS HTTP ROUTER_PORTS I` (`bench:scaling`): process I of N (ROUTER_PORTS: the N
 *   private router ports, comma-separated) sharing the WS and HTTP ports with the others
 *   (SO_REUSEPORT: the kernel spreads new connections over them). A hello gets the id `{I}/{hex}`,
 *   so a push URL `/push/{I}/{hex}` names the process holding the socket: the process the POST
 *   reached sends it itself if it is I, else forwards it as the front does to I's router port.
 */
import "./delivery-probe.ts"
import { createServer, Agent, request, type IncomingMessage, type Server, type ServerResponse } from "node:http"
import { type WebSocket, WebSocketServer } from "ws"

const HOST = "127.0.0.1"
const [mode, ...rest] = process.argv.slice(2)
const ports = rest.map(Number)
const send = (message: unknown) => process.send?.(message)
process.on("SIGTERM", () => process.exit(0))
process.on("SIGINT", () => process.exit(0))

const readBody = (req: IncomingMessage, done: (body: Buffer) => void): void => {
  const chunks: Array<Buffer> = []
  req.on("data", (chunk: Buffer) => chunks.push(chunk))
  req.on("end", () => done(chunks.length === 1 ? (chunks[0] as Buffer) : Buffer.concat(chunks)))
}

const listening = (servers: ReadonlyArray<Server>, portList: ReadonlyArray<number>, reusePort = false) =>
  Promise.all(servers.map((s, i) => new Promise<void>((resolve) => s.listen({ port: portList[i] as number, host: HOST, reusePort }, resolve))))

/**
 * Plain `ws`: a hello gets an id (32 hex, like a uaid, after `prefix`); everything else (acks) is
 * ignored.
 */
const bareSockets = (prefix = "") => {
  const sockets = new Map<string, WebSocket>()
  let nextId = 0
  const wss = new WebSocketServer({ noServer: true, clientTracking: false })
  const server = createServer((_req, res) => {
    res.writeHead(404)
    res.end()
  })
  server.on("upgrade", (req, socket, head) =>
    wss.handleUpgrade(req, socket, head, (ws) => {
      let id: string | undefined
      ws.on("message", (data) => {
        if (id !== undefined) return
        id = prefix + (++nextId).toString(16).padStart(32, "0")
        sockets.set(id, ws)
        ws.send(JSON.stringify({ messageType: "hello", uaid: id, status: 200, use_webpush: true, broadcasts: {} }))
        void data
      })
      ws.on("close", () => {
        if (id !== undefined) sockets.delete(id)
      })
    }))
  let version = 0
  /** The notification frame of autopush, for the given id and body. */
  const deliver = (id: string, body: Buffer, encoding: string | undefined): boolean => {
    const ws = sockets.get(id)
    if (ws === undefined) return false
    ws.send(JSON.stringify({
      messageType: "notification",
      channelID: id,
      version: String(++version),
      data: body.toString("base64url"),
      headers: { encoding: encoding ?? "aes128gcm" }
    }))
    return true
  }
  return { server, deliver }
}

const idOf = (req: IncomingMessage): string | undefined => {
  const url = req.url ?? ""
  return url.startsWith("/push/") ? url.slice("/push/".length) : undefined
}

const answer = (res: ServerResponse, status: number, headers: Record<string, string> = {}) => {
  res.writeHead(status, { "content-length": 0, ...headers })
  res.end()
}

const bare = async () => {
  const [wsPort, httpPort] = ports as [number, number]
  const { server: wsServer, deliver } = bareSockets()
  const http = createServer((req, res) => {
    const id = idOf(req)
    readBody(req, (body) => {
      if (id === undefined || !deliver(id, body, req.headers["content-encoding"])) return answer(res, 404)
      answer(res, 201, { ttl: "60" })
    })
  })
  await listening([wsServer, http], [wsPort, httpPort])
  send({ ready: true })
}

/** Sends a push on to the process behind `port` (`PUT /push/{id}`) and answers the POST from its reply. */
const forward = (agent: Agent, port: number, id: string, req: IncomingMessage, body: Buffer, res: ServerResponse) => {
  const put = request({
    host: HOST,
    port,
    path: `/push/${id}`,
    method: "PUT",
    agent,
    headers: { "content-length": body.length, "content-encoding": req.headers["content-encoding"] ?? "aes128gcm" }
  }, (reply) => {
    reply.resume()
    reply.on("end", () => answer(res, reply.statusCode === 200 ? 201 : 404, { ttl: "60" }))
  })
  put.on("error", () => answer(res, 503))
  put.end(body)
}

/** The private side of a process holding sockets: `PUT /push/{id}` sends on the socket (200), else 404. */
const routerServer = (deliver: (id: string, body: Buffer, encoding: string | undefined) => boolean) =>
  createServer((req, res) => {
    const id = idOf(req)
    readBody(req, (body) => answer(res, id !== undefined && deliver(id, body, req.headers["content-encoding"]) ? 200 : 404))
  })

const bareFront = async () => {
  const [httpPort, backPort] = ports as [number, number]
  const agent = new Agent({ keepAlive: true })
  const http = createServer((req, res) => {
    const id = idOf(req)
    readBody(req, (body) => {
      if (id === undefined) return answer(res, 404)
      forward(agent, backPort, id, req, body, res)
    })
  })
  await listening([http], [httpPort])
  send({ ready: true })
}

const bareBack = async () => {
  const [wsPort, routerPort] = ports as [number, number]
  const { server: wsServer, deliver } = bareSockets()
  await listening([wsServer, routerServer(deliver)], [wsPort, routerPort])
  send({ ready: true })
}

const bareWorker = async () => {
  const [wsPort, httpPort] = ports as [number, number]
  const routerPorts = (rest[2] ?? "").split(",").map(Number)
  const me = Number(rest[3])
  const { server: wsServer, deliver } = bareSockets(`${me}/`)
  const agent = new Agent({ keepAlive: true })
  const http = createServer((req, res) => {
    const id = idOf(req)
    readBody(req, (body) => {
      const holder = id === undefined ? undefined : routerPorts[Number(id.slice(0, id.indexOf("/")))]
      if (id === undefined || holder === undefined) return answer(res, 404)
      if (holder !== routerPorts[me]) return forward(agent, holder, id, req, body, res)
      answer(res, deliver(id, body, req.headers["content-encoding"]) ? 201 : 404, { ttl: "60" })
    })
  })
  // The public ports are shared with the other processes; the router port is this one's own.
  await listening([wsServer, http], [wsPort, httpPort], true)
  await listening([routerServer(deliver)], [routerPorts[me] as number])
  send({ ready: true })
}

/**
 * The service's modules are loaded only in this mode: the bare pipelines start as bare as they run
 * (bench:startup). They are this checkout's, or those of the checkout `AUTOPUSH_SERVER_ROOT` names
 * (an earlier commit's server measured beside this one's, by this bench).
 */
const autopush = async () => {
  const root = process.env["AUTOPUSH_SERVER_ROOT"] === undefined ? new URL("../", import.meta.url) : new URL(`file://${process.env["AUTOPUSH_SERVER_ROOT"].replace(/\/*$/, "/")}`)
  const source = (path: string) => new URL(path, root).href
  const { Effect, Layer } = await import("effect")
  const { allInOneLayer, withServices }: typeof import("../src/bin/app.ts") = await import(source("src/bin/app.ts"))
  const { allInOneSettings } = await import("./settings.ts")
  const { loggingLayer }: typeof import("../src/observability/logging.ts") = await import(source("src/observability/logging.ts"))
  const { layerMemory }: typeof import("../src/storage/memory/layer.ts") = await import(source("src/storage/memory/layer.ts"))
  const { createActiveTables }: typeof import("../src/storage/Storage.ts") = await import(source("src/storage/Storage.ts"))
  const [wsPort, routerPort, endpointPort] = ports as [number, number, number]
  const settings = allInOneSettings(wsPort, routerPort, endpointPort)
  const storage = Layer.effectDiscard(createActiveTables).pipe(
    Layer.provideMerge(layerMemory({
      routerTable: settings.routerTablename,
      messageTablePrefix: settings.messageTablename,
      noTableRotation: settings.noTableRotation
    }))
  )
  // What `runRole("autopush", …)` builds, with the in-memory storage layer instead of embedded dynalite.
  const app = withServices("autopush", settings, storage)(allInOneLayer(settings))
  const logging = loggingLayer({ human: false, level: "info", role: "autopush", hostname: HOST })
  Effect.runFork(
    Effect.scoped(Effect.gen(function*() {
      yield* Layer.build(app)
      send({ ready: true })
      return yield* Effect.never
    })).pipe(
      Effect.provide(logging),
      Effect.tapCause((cause) => Effect.sync(() => {
        console.error("autopush failed", cause)
        process.exit(1)
      }))
    )
  )
}

switch (mode) {
  case "autopush":
    await autopush()
    break
  case "bare":
    await bare()
    break
  case "bare-front":
    await bareFront()
    break
  case "bare-back":
    await bareBack()
    break
  case "bare-worker":
    await bareWorker()
    break
  default:
    console.error(`unknown mode ${mode}`)
    process.exit(2)
}
