/**
 * `npm run bench:storm`: a reconnect storm, ours against a bare baseline in the same run, one after
 * the other, each server in its own process and the clients in this one.
 *
 * - ours: the real all-in-one process on embedded dynalite (on disk). N clients register and go
 *   away, and one message is pushed to each through the public API (stored);
 * - bare: `stored-servers.ts`, plain `node:http` + `ws` on the same storage (embedded dynalite on a
 *   worker thread, the same tables): N router records and one message row each are written into
 *   its storage directly;
 *
 * then all of them reconnect at once (at most --inflight handshakes in flight) and each waits for
 * its message and acks it. Printed: one table of the time until every client has its message,
 * hellos/s, per-client time from connecting to its message (p50/p99/max), how many failed or timed
 * out (30 s), and the server's CPU per client (user + system from /proc, storage thread included),
 * ours / bare, and the target (ours: all delivered, none timed out). Then, ours only: two more pushes
 * to each of a sample of the resumed clients, still connected, and the share of each its trace says
 * was delivered directly (a resumed session must get pushes as a new one does, once the endpoint
 * has read that it is back).
 *
 * Options (flag or environment): --clients/BENCH_CLIENTS (10000), --inflight/BENCH_INFLIGHT (2000),
 * --only/BENCH_ONLY (ours or bare; both by default).
 */
import { randomBytes, randomUUID } from "node:crypto"
import WebSocket from "ws"
import { Agent } from "node:http"
import { cpuMeter, measurePipelines, option, printComparison, push, quantile, start, startBare } from "./harness.ts"
import { directShareText, type Routes, routesOf } from "./trace.ts"
import { MESSAGE_TABLE, messageItem, putAll, ROUTER_TABLE, storageClient, userItem } from "./stored-tables.ts"

const CLIENTS = Number(option("clients", "BENCH_CLIENTS", "10000"))
const INFLIGHT = Number(option("inflight", "BENCH_INFLIGHT", "2000"))
const TIMEOUT_MS = 30_000
/** Resumed clients pushed to after the storm, to see how their pushes are delivered. */
const SHARE_SAMPLE = 500

/** Client i's source address: 200 per address, so the ephemeral ports of one address suffice. */
const localAddress = (i: number) => `127.0.${1 + Math.floor(i / 50_000)}.${1 + (i % 200)}`

interface Session {
  readonly ws: WebSocket
  readonly frames: (onFrame: (m: Record<string, unknown>) => void) => void
}

const connect = (wsUrl: string, i: number): Promise<Session> =>
  new Promise((resolve, reject) => {
    const ws = new WebSocket(wsUrl, { localAddress: localAddress(i), perMessageDeflate: false })
    ws.once("open", () => resolve({ ws, frames: (onFrame) => ws.on("message", (data) => onFrame(JSON.parse(data.toString()))) }))
    ws.once("error", reject)
  })

/** Run `task` for 0..n-1 with at most `limit` at once. */
const pool = async (n: number, limit: number, task: (i: number) => Promise<void>) => {
  let next = 0
  await Promise.all(Array.from({ length: Math.min(limit, n) }, async () => {
    while (next < n) await task(next++)
  }))
}

interface Server {
  readonly pid: number
  readonly wsUrl: string
  /** N offline users with one stored message each: their uaids, and (ours) their endpoints. */
  readonly seed: () => Promise<{ readonly uaids: ReadonlyArray<string>; readonly endpoints?: ReadonlyArray<string> }>
  /** Ours: the router port, whose trace says how a message was delivered. */
  readonly routerUrl?: string
  readonly stop: () => Promise<void>
}

const ours = async (): Promise<Server> => {
  const { deployment, pid } = await start([])
  return {
    pid,
    wsUrl: deployment.wsUrl,
    routerUrl: deployment.routerUrl,
    seed: async () => {
      // Users with one channel each, then offline.
      const users: Array<{ uaid: string; endpoint: string }> = []
      await pool(CLIENTS, 100, async (i) => {
        const s = await connect(deployment.wsUrl, i)
        const channelID = randomUUID()
        await new Promise<void>((resolve) => {
          let uaid = ""
          s.frames((m) => {
            if (m["messageType"] === "hello") {
              uaid = m["uaid"] as string
              s.ws.send(JSON.stringify({ messageType: "register", channelID }))
            }
            if (m["messageType"] === "register") {
              users[i] = { uaid, endpoint: m["pushEndpoint"] as string }
              resolve()
            }
          })
          s.ws.send(JSON.stringify({ messageType: "hello", use_webpush: true }))
        })
        s.ws.close()
      })
      // One stored message each.
      let stored = 0
      await pool(CLIENTS, 32, async (i) => {
        if ((await push(users[i]!.endpoint, randomBytes(128))).status === 201) stored++
      })
      console.log(`  ours: ${CLIENTS} users registered, ${stored} messages stored`)
      return { uaids: users.map((u) => u.uaid), endpoints: users.map((u) => u.endpoint) }
    },
    stop: deployment.stop
  }
}

const bare = async (): Promise<Server> => {
  const server = await startBare()
  return {
    pid: server.pid,
    wsUrl: server.wsUrl,
    seed: async () => {
      const uaids = Array.from({ length: CLIENTS }, () => randomUUID().replaceAll("-", ""))
      const now = Date.now()
      const storage = await storageClient(server.dynamoUrl)
      await putAll(storage.send, ROUTER_TABLE, uaids.map((uaid) => userItem(uaid, now)))
      await putAll(storage.send, MESSAGE_TABLE, uaids.map((uaid) => messageItem(uaid, randomUUID(), now, randomBytes(128).toString("base64url"), "aes128gcm", 600)))
      storage.destroy()
      console.log(`  bare: ${CLIENTS} router records and message rows written`)
      return { uaids }
    },
    stop: server.stop
  }
}

/**
 * The storm: [total s, hellos/s, p50, p99, max (ms), failed or timed out, server CPU µs per client,
 * of which the storage thread's].
 */
const storm = async (server: Server, { uaids, endpoints }: Awaited<ReturnType<Server["seed"]>>): Promise<Array<number>> => {
  const times: Array<number> = []
  let failed = 0
  /** Each client's session once it had its message. */
  const resumed: Array<Session | undefined> = []
  const cpu = cpuMeter(server.pid)
  const began = performance.now()
  let hellos = 0
  let helloDone = 0
  const sockets: Array<WebSocket> = []
  await pool(CLIENTS, INFLIGHT, async (i) => {
    const t0 = performance.now()
    try {
      const s = await connect(server.wsUrl, i)
      sockets.push(s.ws)
      await new Promise<void>((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error("timeout")), TIMEOUT_MS)
        s.frames((m) => {
          if (m["messageType"] === "hello") {
            hellos++
            helloDone = performance.now()
          }
          if (m["messageType"] === "notification") {
            s.ws.send(JSON.stringify({ messageType: "ack", updates: [{ channelID: m["channelID"], version: m["version"] }] }))
            clearTimeout(timer)
            times.push(performance.now() - t0)
            resumed[i] = s
            resolve()
          }
        })
        s.ws.send(JSON.stringify({ messageType: "hello", uaid: uaids[i], use_webpush: true }))
      })
    } catch {
      failed++
    }
  })
  const seconds = (performance.now() - began) / 1000
  const perClient = cpu(CLIENTS)
  const figures = [
    seconds,
    hellos / ((helloDone - began) / 1000),
    quantile(times, 0.5),
    quantile(times, 0.99),
    Math.max(...times),
    failed,
    ...perClient
  ]
  if (endpoints !== undefined && server.routerUrl !== undefined) {
    const [first, second] = await afterTheStorm(server.routerUrl, endpoints, resumed)
    // The endpoint stored a message for each of these clients before the storm: it has their
    // records as offline (router_cache_ttl), so their first push is stored and the re-read that
    // follows finds them connected and has their node drain it; that read's record is then cached.
    console.log(`  ours after the storm: two pushes to each of ${SHARE_SAMPLE} resumed, connected clients — delivered directly:`)
    console.log(`    the first (the endpoint had them as offline: stored, then drained) ${directShareText(first)}; the second ${directShareText(second)}`)
  }
  for (const ws of sockets) ws.terminate()
  return figures
}

/**
 * Two pushes, one after the other, to each of a sample of the resumed clients (the session's next
 * frame is the push): how each was delivered.
 */
const afterTheStorm = async (
  routerUrl: string,
  endpoints: ReadonlyArray<string>,
  resumed: ReadonlyArray<Session | undefined>
): Promise<readonly [Routes, Routes]> => {
  const sample = resumed.flatMap((s, i) => (s === undefined ? [] : [i])).filter((_, n, all) => n % Math.max(1, Math.floor(all.length / SHARE_SAMPLE)) === 0).slice(0, SHARE_SAMPLE)
  const ids: readonly [Array<string>, Array<string>] = [[], []]
  await pool(sample.length, 32, async (n) => {
    const i = sample[n] as number
    const session = resumed[i] as Session
    for (const sent of ids) {
      const arrived = new Promise<void>((resolve) => session.ws.once("message", () => resolve()))
      const { messageId } = await push(endpoints[i] as string, randomBytes(128))
      if (messageId !== undefined) sent.push(messageId)
      await Promise.race([arrived, new Promise((r) => setTimeout(r, 5_000))])
    }
  })
  const agent = new Agent({ keepAlive: true, maxSockets: 8 })
  const routes = [await routesOf(routerUrl, ids[0], agent), await routesOf(routerUrl, ids[1], agent)] as const
  agent.destroy()
  return routes
}

const rows = await measurePipelines({ ours, bare }, async (_, server) => storm(server, await server.seed()))

printComparison(
  `reconnect storm: ${CLIENTS} clients with 1 stored message each reconnect at once, ${INFLIGHT} handshakes in flight; embedded dynalite; latencies from connecting to the message` +
    "\n  (server CPU µs per client, user + system; dynalite: its storage thread's part of it; bare makes a GetItem," +
    " UpdateItem, Query and DeleteItem per client)",
  [
    { header: "total s", digits: 2, ratio: true },
    { header: "hellos/s", digits: 0, ratio: true },
    { header: "p50 ms", digits: 0, ratio: true },
    { header: "p99 ms", digits: 0, ratio: true },
    { header: "max ms", digits: 0, ratio: true },
    { header: "failed or timed out", digits: 0, ratio: false },
    { header: "CPU µs", digits: 0, ratio: true },
    { header: "dynalite µs", digits: 0, ratio: true }
  ],
  rows,
  "ours: all delivered, none timed out",
  (ours) => (ours[5] === 0 ? "met" : `NOT met (${ours[5]} of ${CLIENTS} failed or timed out)`)
)
