/**
 * `npm run bench:storm`: a reconnect storm, ours against a bare baseline in the same run, one after
 * the other, each server in its own process and the clients in this one.
 *
 * - ours: the real all-in-one process on its default embedded store, on disk (this checkout:
 *   SQLite; with `AUTOPUSH_SERVER_ROOT=<checkout>`, that checkout's, e.g. an earlier release's
 *   embedded dynalite). N clients register and go away, and one message is pushed to each through
 *   the public API (stored);
 * - bare: `stored-sqlite-server.ts`, plain `node:http` + `ws` on one `node:sqlite` file opened as
 *   the service opens its own, the same router and message columns: N router records and one
 *   message row each are written through its own routes;
 *
 * then all of them reconnect at once (at most --inflight handshakes in flight) and each waits for
 * its message and acks it. Printed: one table of the time until every client has its message,
 * hellos/s, per-client time from connecting to its message (p50/p99/max), how many failed or timed
 * out (30 s), and the server's CPU per client (user + system from /proc, every thread; of it, its
 * worker threads': SQLite's checkpoint thread, or an earlier release's dynalite), ours / bare, and the target (ours: all delivered, none timed out). Then, ours only: two more pushes
 * to each of a sample of the resumed clients, still connected, and the share of each its trace says
 * was delivered directly (a resumed session must get pushes as a new one does, once the endpoint
 * has read that it is back).
 *
 * Options (flag or environment): --clients/BENCH_CLIENTS (10000), --inflight/BENCH_INFLIGHT (2000),
 * --only/BENCH_ONLY (ours or bare; both by default), --workers/BENCH_WORKERS.
 *
 * `--workers W` (or `auto`: one per 15,000 clients, at least 2): servers of W processes, and the
 * clients in ⌈clients / 15,000⌉ processes (at least 2; a process here may open 20,000 files), each
 * with its share of the handshakes in flight:
 *
 *     npm run bench:storm -- --clients 50000 --workers 4
 *
 * - ours: `bin/autopush.js --workers W` on embedded storage (the supervisor runs the store, the
 *   workers reach it over loopback HTTP); seeded through the public API as above;
 * - bare: `storm-servers.ts`, laid out as a node of workers on a store server is: a supervisor
 *   running an embedded dynalite on a worker thread (not SQLite: bare workers sharing one SQLite
 *   file are not written yet, so this baseline is a store server's), W plain `ws` processes sharing the port (SO_REUSEPORT) that do what the bare
 *   server above does, over loopback HTTP; seeded directly;
 *
 * with the same figures (server CPU summed over every server process), the storage requests per
 * reconnect (bare: its DynamoDB requests, counted by its workers; ours: the storage operations its
 * workers' `/metrics` count in `storage.time` — one DynamoDB request each, but for paged queries and
 * batches), and the target: all delivered, none timed out, total time ≤ 1.2× bare's.
 */
import { type ChildProcess, fork } from "node:child_process"
import { randomBytes, randomUUID } from "node:crypto"
import { once } from "node:events"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import WebSocket from "ws"
import { Agent } from "node:http"
import { cpuMeter, cpuMs, measurePipelines, option, printComparison, push, quantile, start, startBare, workerCpuMs } from "./harness.ts"
import { ask, connect, descendants, pool, resume, scrape, type Session, startNode, subscribe } from "./storm-node.ts"
import { deliveredSource, directShareText, type Routes, routesOf } from "./trace.ts"
import { MESSAGE_TABLE, messageItem, putAll, ROUTER_TABLE, storageClient, userItem } from "./stored-tables.ts"

const CLIENTS = Number(option("clients", "BENCH_CLIENTS", "10000"))
const INFLIGHT = Number(option("inflight", "BENCH_INFLIGHT", "2000"))
const TIMEOUT_MS = 30_000
/** Resumed clients pushed to after the storm, to see how their pushes are delivered. */
const SHARE_SAMPLE = 500

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
        users[i] = await subscribe(s)
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
  const server = await startBare("./stored-sqlite-server.ts")
  return {
    pid: server.pid,
    wsUrl: server.wsUrl,
    seed: async () => {
      const uaids = Array.from({ length: CLIENTS }, () => randomUUID().replaceAll("-", ""))
      await pool(CLIENTS, 32, async (i) => {
        const uaid = uaids[i] as string
        await fetch(`${server.httpUrl}/user/${uaid}`, { method: "PUT" }).then((res) => res.arrayBuffer())
        await push(`${server.httpUrl}/push/${uaid}/${randomUUID()}`, randomBytes(128))
      })
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
  /** Why clients failed: the error's message, how many. */
  const failures = new Map<string, number>()
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
      await resume(s, uaids[i] as string, TIMEOUT_MS, () => {
        hellos++
        helloDone = performance.now()
      })
      times.push(performance.now() - t0)
      resumed[i] = s
    } catch (error) {
      failed++
      const why = error instanceof Error ? error.message : String(error)
      failures.set(why, (failures.get(why) ?? 0) + 1)
    }
  })
  const seconds = (performance.now() - began) / 1000
  if (failed > 0) console.log(`  failed or timed out: ${[...failures].map(([why, n]) => `${why} × ${n}`).join(", ")}`)
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

// ── --workers W: servers of W processes, clients over several processes ─────────────────────────

/** Clients one client process holds at most (a process here may open 20,000 files). */
const CLIENTS_PER_PROCESS = 15_000

interface WorkersServer {
  readonly wsUrl: string
  /** Every server process (supervisor and workers), read at the storm's start. */
  readonly pids: () => Array<number>
  /** Ours: each worker's router port (its trace, its /metrics). */
  readonly routerUrls?: ReadonlyArray<string>
  readonly seed: (clients: ReadonlyArray<ChildProcess>) => Promise<{ readonly uaids: ReadonlyArray<string>; readonly endpoints?: ReadonlyArray<string> }>
  /** Storage requests by operation since the last call (ours: the workers' `storage.time` counts, cumulative). */
  readonly storageCounts: () => Promise<Record<string, number>>
  readonly stop: () => Promise<void>
}

/** Client process k's clients: [first, count]. */
const shareOf = (k: number, processes: number): readonly [number, number] => {
  const first = Math.floor((CLIENTS * k) / processes)
  return [first, Math.floor((CLIENTS * (k + 1)) / processes) - first]
}

const oursWorkers = async (workers: number): Promise<WorkersServer> => {
  const node = await startNode(workers)
  return {
    wsUrl: node.wsUrl,
    pids: node.pids,
    routerUrls: node.routerUrls,
    seed: async (clients) => {
      // Users with one channel each, then offline: registered from the client processes, 100 at once in all.
      const users = (await Promise.all(clients.map((child, k) => {
        const [first, count] = shareOf(k, clients.length)
        return ask<Array<{ uaid: string; endpoint: string }>>(child, { cmd: "seed", wsUrl: node.wsUrl, first, count, inflight: Math.ceil(100 / clients.length) }, "users")
      }))).flat()
      // One stored message each.
      let stored = 0
      await pool(CLIENTS, 32, async (i) => {
        if ((await push(users[i]!.endpoint, randomBytes(128))).status === 201) stored++
      })
      console.log(`  ours: ${CLIENTS} users registered, ${stored} messages stored`)
      return { uaids: users.map((u) => u.uaid), endpoints: users.map((u) => u.endpoint) }
    },
    storageCounts: async () => {
      const counts: Record<string, number> = {}
      for (const page of await Promise.all(node.routerUrls.map((url) => scrape(`${url}/metrics`)))) {
        for (const [key, value] of page) {
          const operation = /^storage_time_milliseconds_count\{.*operation="([^"]+)"/.exec(key)?.[1]
          if (operation !== undefined) counts[operation] = (counts[operation] ?? 0) + value
        }
      }
      return counts
    },
    stop: node.stop
  }
}

const bareWorkers = async (workers: number): Promise<WorkersServer> => {
  const dataDir = mkdtempSync(join(tmpdir(), "autopush-bench-bare-"))
  const child = fork(new URL("./storm-servers.ts", import.meta.url).pathname, [dataDir, String(workers)], { stdio: ["ignore", "inherit", "inherit", "ipc"] })
  const [ports] = await Promise.race([
    once(child, "message") as Promise<[{ ws: number; dynamo: number }]>,
    once(child, "exit").then(([code]) => Promise.reject(new Error(`the bare server exited (${code})`)))
  ])
  const pid = child.pid as number
  return {
    wsUrl: `ws://127.0.0.1:${ports.ws}/`,
    pids: () => [pid, ...descendants(pid)],
    seed: async () => {
      const uaids = Array.from({ length: CLIENTS }, () => randomUUID().replaceAll("-", ""))
      const now = Date.now()
      const storage = await storageClient(`http://127.0.0.1:${ports.dynamo}`)
      await putAll(storage.send, ROUTER_TABLE, uaids.map((uaid) => userItem(uaid, now)))
      await putAll(storage.send, MESSAGE_TABLE, uaids.map((uaid) => messageItem(uaid, randomUUID(), now, randomBytes(128).toString("base64url"), "aes128gcm", 600)))
      storage.destroy()
      console.log(`  bare: ${CLIENTS} router records and message rows written`)
      return { uaids }
    },
    storageCounts: async () => {
      const reply = once(child, "message") as Promise<[{ counts: Record<string, number> }]>
      child.send({ cmd: "counts" })
      return (await reply)[0].counts
    },
    stop: async () => {
      if (child.exitCode === null && child.signalCode === null) {
        const exited = once(child, "exit")
        child.kill("SIGTERM")
        await exited
      }
      rmSync(dataDir, { recursive: true, force: true })
    }
  }
}

/** The first defined delivery source of a message among the workers' traces. */
const routesAcross = async (routerUrls: ReadonlyArray<string>, messageIds: ReadonlyArray<string>): Promise<Routes> => {
  const agent = new Agent({ keepAlive: true, maxSockets: 8 })
  const sources = await Promise.all(messageIds.map(async (id) => {
    for (const url of routerUrls) {
      const source = await deliveredSource(url, id, agent)
      if (source !== undefined) return source
    }
    return undefined
  }))
  agent.destroy()
  return {
    direct: sources.filter((s) => s === "direct").length,
    stored: sources.filter((s) => s === "stored").length,
    unknown: sources.filter((s) => s !== "direct" && s !== "stored").length
  }
}

/** The storm with the clients in `clients`: the same figures as `storm`, then storage requests per reconnect. */
const stormWorkers = async (name: string, server: WorkersServer, clients: ReadonlyArray<ChildProcess>): Promise<Array<number>> => {
  const { uaids, endpoints } = await server.seed(clients)
  const inflight = Math.ceil(INFLIGHT / clients.length)
  await Promise.all(clients.map((child, k) => {
    const [first, count] = shareOf(k, clients.length)
    return ask(child, { cmd: "prepare", wsUrl: server.wsUrl, first, uaids: uaids.slice(first, first + count), inflight, timeoutMs: TIMEOUT_MS }, "prepared")
  }))
  const countsBefore = await server.storageCounts()
  const pids = server.pids()
  const cpuBefore = pids.map((pid) => [cpuMs(pid), workerCpuMs(pid)] as const)
  const began = Date.now()
  const results = await Promise.all(clients.map((child) =>
    ask<{ times: Array<number>; failed: number; hellos: number; lastHelloAt: number; doneAt: number }>(child, { cmd: "go" }, "storm")
  ))
  const cpuAfter = pids.map((pid) => [cpuMs(pid), workerCpuMs(pid)] as const)
  const latest = (values: ReadonlyArray<number>) => values.reduce((a, b) => Math.max(a, b), 0)
  const seconds = (latest(results.map((r) => r.doneAt)) - began) / 1000
  const countsAfter = await server.storageCounts()
  const times = results.flatMap((r) => r.times)
  const failed = results.reduce((sum, r) => sum + r.failed, 0)
  const hellos = results.reduce((sum, r) => sum + r.hellos, 0)
  const cpu = cpuAfter.reduce((sum, [total], i) => sum + total - cpuBefore[i]![0], 0)
  const storageCpu = cpuAfter.reduce((sum, [, thread], i) => sum + thread - cpuBefore[i]![1], 0)
  // Ours: cumulative counts, the difference; bare: counted since the last reading.
  const requests = Object.fromEntries(Object.entries(countsAfter).map(([op, n]) => [op, (n - (name === "ours" ? countsBefore[op] ?? 0 : 0)) / CLIENTS] as const).filter(([, n]) => n > 0))
  const perReconnect = Object.values(requests).reduce((sum, n) => sum + n, 0)
  console.log(
    `  ${name}: storage requests per reconnect ${perReconnect.toFixed(2)} (${Object.entries(requests).map(([op, n]) => `${op} ${n.toFixed(2)}`).join(", ")})` +
      (name === "ours" ? " — ours: the workers' storage operations (storage.time counts), one DynamoDB request each but for paged queries and batches" : " — DynamoDB requests")
  )
  if (endpoints !== undefined && server.routerUrls !== undefined) {
    const sample = Math.ceil(SHARE_SAMPLE / clients.length)
    const ids = await Promise.all(clients.map((child, k) => {
      const [first, count] = shareOf(k, clients.length)
      return ask<[Array<string>, Array<string>]>(child, { cmd: "share", endpoints: endpoints.slice(first, first + count), sample }, "share")
    }))
    const first = await routesAcross(server.routerUrls, ids.flatMap((pair) => pair[0]))
    const second = await routesAcross(server.routerUrls, ids.flatMap((pair) => pair[1]))
    console.log(`  ours after the storm: two pushes to each of ${sample * clients.length} resumed, connected clients — delivered directly:`)
    console.log(`    the first (the endpoint had them as offline: stored, then drained) ${directShareText(first)}; the second ${directShareText(second)}`)
  }
  return [
    seconds,
    hellos / ((latest(results.map((r) => r.lastHelloAt)) - began) / 1000),
    quantile(times, 0.5),
    quantile(times, 0.99),
    latest(times),
    failed,
    (cpu * 1000) / CLIENTS,
    (storageCpu * 1000) / CLIENTS,
    perReconnect
  ]
}

/** The columns of a storm's figures, in the order `storm` and `stormWorkers` give them. */
const STORM_COLUMNS = [
  { header: "total s", digits: 2, ratio: true },
  { header: "hellos/s", digits: 0, ratio: true },
  { header: "p50 ms", digits: 0, ratio: true },
  { header: "p99 ms", digits: 0, ratio: true },
  { header: "max ms", digits: 0, ratio: true },
  { header: "failed or timed out", digits: 0, ratio: false },
  { header: "CPU µs", digits: 0, ratio: true },
  { header: "threads µs", digits: 0, ratio: true }
]

const mainWorkers = async (workers: number) => {
  const processes = Math.max(2, Math.ceil(CLIENTS / CLIENTS_PER_PROCESS))
  console.log(`bench:storm --workers ${workers}: ${CLIENTS} clients over ${processes} client processes, ${INFLIGHT} handshakes in flight in all; servers of ${workers} processes sharing the WebSocket port`)
  let clients: Array<ChildProcess> = []
  const rows = await measurePipelines<WorkersServer>(
    { ours: () => oursWorkers(workers), bare: () => bareWorkers(workers) },
    async (name, server) => {
      clients = Array.from({ length: processes }, () =>
        fork(new URL("./storm-clients.ts", import.meta.url).pathname, [], { stdio: ["ignore", "inherit", "inherit", "ipc"] }))
      try {
        return await stormWorkers(name, server, clients)
      } finally {
        for (const child of clients) child.kill()
      }
    }
  )
  printComparison(
    `reconnect storm: ${CLIENTS} clients with 1 stored message each reconnect at once, ${INFLIGHT} handshakes in flight (over ${processes} client processes); ` +
      `servers of ${workers} processes on embedded dynalite (in the supervisor, over loopback HTTP); latencies from connecting to the message` +
      "\n  (server CPU µs per client, user + system, every server process; threads: their worker threads' part of it; storage requests per reconnect:" +
      " ours counted as storage operations by its workers, bare as DynamoDB requests: a GetItem, UpdateItem, Query and DeleteItem per client)",
    [...STORM_COLUMNS, { header: "storage req", digits: 2, ratio: true }],
    rows,
    "ours: all delivered, none timed out, total time ≤ 1.2× bare",
    (ours) => {
      const bareSeconds = rows.bare?.[0]
      const time = bareSeconds === undefined ? "bare not run" : `${(ours[0]! / bareSeconds).toFixed(2)}× bare`
      return ours[5] === 0 && bareSeconds !== undefined && ours[0]! <= 1.2 * bareSeconds
        ? `met (${time})`
        : `NOT met (${ours[5]} of ${CLIENTS} failed or timed out; ${time})`
    }
  )
}

const WORKERS = option("workers", "BENCH_WORKERS", "")
if (WORKERS !== "") {
  await mainWorkers(WORKERS === "auto" ? Math.max(2, Math.ceil(CLIENTS / CLIENTS_PER_PROCESS)) : Number(WORKERS))
} else {
  const rows = await measurePipelines({ ours, bare }, async (_, server) => storm(server, await server.seed()))

  printComparison(
    `reconnect storm: ${CLIENTS} clients with 1 stored message each reconnect at once, ${INFLIGHT} handshakes in flight; ` +
      `ours on its default embedded store${process.env["AUTOPUSH_SERVER_ROOT"] === undefined ? " (SQLite)" : ` (of ${process.env["AUTOPUSH_SERVER_ROOT"]})`}, bare on SQLite; latencies from connecting to the message` +
      "\n  (server CPU µs per client, user + system; threads: its worker threads' part of it — SQLite's checkpoint thread, or dynalite's thread;" +
      " bare runs a SELECT, UPDATE, SELECT and DELETE per client)",
    STORM_COLUMNS,
    rows,
    "ours: all delivered, none timed out",
    (ours) => (ours[5] === 0 ? "met" : `NOT met (${ours[5]} of ${CLIENTS} failed or timed out)`)
  )
}
