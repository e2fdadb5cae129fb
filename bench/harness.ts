/**
 * What the benchmarks that drive the real all-in-one process share: starting it (and the bare
 * server of the stored-message benches), reading its CPU and RSS from /proc, push clients over real
 * sockets, quantiles, and the table of ours against bare.
 */
import { fork } from "node:child_process"
import { once } from "node:events"
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs"
import { Agent, request } from "node:http"
import { randomUUID } from "node:crypto"
import { tmpdir } from "node:os"
import { join } from "node:path"
import WebSocket from "ws"
import { openClient, type TestClient } from "../test/connection/client.ts"
import { type Deployment, startAllInOne } from "../test/e2e/servers.ts"

/** A flag's value, else the environment's, else the fallback. */
export const option = (flag: string, env: string, fallback: string): string => {
  const i = process.argv.indexOf(`--${flag}`)
  return (i >= 0 ? process.argv[i + 1] : undefined) ?? process.env[env] ?? fallback
}

// ── the server process, seen from outside ────────────────────────────────────────────────────────

/** User + system CPU in ms of a `/proc/…/stat` (clock ticks are 10 ms). */
const statCpuMs = (path: string): number => {
  const stat = readFileSync(path, "utf8")
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ")
  return (Number(fields[11]) + Number(fields[12])) * 10
}
/** User + system CPU of a process (all its threads), in ms. */
export const cpuMs = (pid: number): number => statCpuMs(`/proc/${pid}/stat`)
/**
 * User + system CPU of a process's worker threads (Node names them `WorkerThread`), in ms: in the
 * servers of `bench:stored` and `bench:storm`, the embedded dynalite's thread.
 */
export const workerCpuMs = (pid: number): number => threadCpuMs(pid)["storage thread"] ?? 0

/** Node's thread names (`/proc/…/task/…/comm`) and what they are in our servers. */
const THREAD_GROUPS: Readonly<Record<string, string>> = {
  MainThread: "main",
  WorkerThread: "storage thread",
  "libuv-worker": "I/O threads",
  V8Worker: "V8 helpers"
}

/**
 * User + system CPU of a process's threads by group, in ms: the main thread, the worker thread (the
 * embedded dynalite), libuv's pool (LevelDB's reads and writes), V8's helpers (concurrent garbage
 * collection and compilation).
 */
export const threadCpuMs = (pid: number): Record<string, number> => {
  const groups: Record<string, number> = {}
  for (const tid of readdirSync(`/proc/${pid}/task`)) {
    const group = THREAD_GROUPS[readFileSync(`/proc/${pid}/task/${tid}/comm`, "utf8").trim()] ?? "other"
    groups[group] = (groups[group] ?? 0) + statCpuMs(`/proc/${pid}/task/${tid}/stat`)
  }
  return groups
}

/** Starts measuring a process's CPU by thread group; the function returned reads µs per unit of work since. */
export const threadMeter = (pid: number): (units: number) => Record<string, number> => {
  const before = threadCpuMs(pid)
  return (units) =>
    Object.fromEntries(Object.entries(threadCpuMs(pid)).map(([group, ms]) => [group, ((ms - (before[group] ?? 0)) * 1000) / units]))
}
/**
 * Starts measuring a process's CPU; the function returned reads it: µs per unit of work since, and
 * of those the worker threads' (the storage thread's).
 */
export const cpuMeter = (pid: number): (units: number) => [number, number] => {
  const [total, workers] = [cpuMs(pid), workerCpuMs(pid)]
  return (units) => [((cpuMs(pid) - total) * 1000) / units, ((workerCpuMs(pid) - workers) * 1000) / units]
}
export const rssMiB = (pid: number): number => {
  const match = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"))
  return Number(match?.[1] ?? 0) / 1024
}

export const quantile = (values: ReadonlyArray<number>, q: number): number => {
  if (values.length === 0) return Number.NaN
  const sorted = [...values].sort((a, b) => a - b)
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] as number
}
export const fmt = (n: number, digits = 1) => n.toFixed(digits)

export const start = async (extra: ReadonlyArray<string>): Promise<{ readonly deployment: Deployment; readonly pid: number }> => {
  const deployment = await startAllInOne(["--log-level", "warn", ...extra])
  return { deployment, pid: deployment.pid() as number }
}

/**
 * The bare server of `bench:stored` and `bench:storm`, in its own process: `stored-servers.ts` (on
 * embedded dynalite), `stored-sqlite-server.ts` (on SQLite, `bench:stored`) or
 * `stored-postgres-server.ts` (on PostgreSQL, `bench:stored`).
 */
export interface BareServer {
  readonly pid: number
  readonly wsUrl: string
  /** `{httpUrl}/push/{uaid}/{chid}` stores a message. */
  readonly httpUrl: string
  /** Its embedded dynalite, for seeding storage directly (the dynalite server's only). */
  readonly dynamoUrl: string
  readonly stop: () => Promise<void>
}

/** `argument`: the server's one argument, a fresh data directory (removed at `stop`) unless given (a DSN). */
export const startBare = async (script = "./stored-servers.ts", argument?: string): Promise<BareServer> => {
  const dataDir = argument === undefined ? mkdtempSync(join(tmpdir(), "autopush-bench-bare-")) : undefined
  const child = fork(new URL(script, import.meta.url).pathname, [argument ?? dataDir as string], { stdio: ["ignore", "inherit", "inherit", "ipc"] })
  const [ports] = await Promise.race([
    once(child, "message") as Promise<[{ ws: number; http: number; dynamo?: number }]>,
    once(child, "exit").then(([code]) => Promise.reject(new Error(`the bare server exited (${code})`)))
  ])
  return {
    pid: child.pid as number,
    wsUrl: `ws://127.0.0.1:${ports.ws}/`,
    httpUrl: `http://127.0.0.1:${ports.http}`,
    dynamoUrl: `http://127.0.0.1:${ports.dynamo}`,
    stop: async () => {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill("SIGTERM")
        await once(child, "exit")
      }
      if (dataDir !== undefined) rmSync(dataDir, { recursive: true, force: true })
    }
  }
}

export interface Rows {
  ours?: ReadonlyArray<number>
  bare?: ReadonlyArray<number>
}

/**
 * Starts each pipeline asked for (`--only ours|bare`, else both, bare first), one after the other,
 * measures it, and stops its server before the next starts: the rows of `printComparison`.
 */
export const measurePipelines = async <S extends { readonly stop: () => Promise<void> }>(
  starts: { readonly [name in keyof Rows]-?: () => Promise<S> },
  measure: (name: keyof Rows, server: S) => Promise<ReadonlyArray<number>>
): Promise<Rows> => {
  const only = option("only", "BENCH_ONLY", "")
  const names: ReadonlyArray<keyof Rows> = only === "ours" || only === "bare" ? [only] : ["bare", "ours"]
  const rows: Rows = {}
  try {
    for (const name of names) {
      const server = await starts[name]()
      try {
        rows[name] = await measure(name, server)
      } finally {
        await server.stop()
      }
    }
  } finally {
    agent.destroy()
  }
  return rows
}

export interface Column {
  readonly header: string
  readonly digits: number
  /** Whether ours / bare means something (not for a count of failures). */
  readonly ratio: boolean
}

/** The one table of a benchmark: ours, bare of the same run, ours / bare, then the target and how ours did (`judge`). */
export const printComparison = (
  title: string,
  columns: ReadonlyArray<Column>,
  rows: Readonly<Rows>,
  target: string,
  judge: (ours: ReadonlyArray<number>) => string
): void => {
  const line = (name: string, cells: ReadonlyArray<string>) =>
    console.log(`  ${name.padEnd(12)}${cells.map((cell, i) => cell.padStart(Math.max(8, columns[i]?.header.length ?? 0) + 2)).join("")}`)
  console.log(`\n${title}`)
  line("", columns.map((c) => c.header))
  const { ours, bare } = rows
  if (ours !== undefined) line("ours", ours.map((v, i) => fmt(v, columns[i]?.digits)))
  if (bare !== undefined) line("bare", bare.map((v, i) => fmt(v, columns[i]?.digits)))
  if (ours !== undefined && bare !== undefined) {
    line("ours / bare", columns.map((c, i) => (c.ratio ? `${fmt((ours[i] as number) / (bare[i] as number), 2)}×` : "–")))
  }
  console.log(`  target (${target}): ${rows.ours === undefined ? "ours not run" : judge(rows.ours)}`)
}

export const hello = async (wsUrl: string): Promise<TestClient> => {
  const client = await openClient(wsUrl)
  client.send({ messageType: "hello", use_webpush: true })
  await client.next((m) => m["messageType"] === "hello", 10_000)
  return client
}

export const register = async (client: TestClient): Promise<string> => {
  client.send({ messageType: "register", channelID: randomUUID() })
  const reply = await client.next((m) => m["messageType"] === "register", 30_000)
  if (reply["status"] !== 200) throw new Error(`register answered ${JSON.stringify(reply)}`)
  return reply["pushEndpoint"] as string
}

export const agent = new Agent({ keepAlive: true, maxSockets: 32 })
export const push = (endpoint: string, body: Buffer): Promise<{ readonly status: number; readonly messageId: string | undefined }> =>
  new Promise((resolve, reject) => {
    const req = request(endpoint, { method: "POST", agent, headers: { TTL: "600", "Content-Encoding": "aes128gcm", "Content-Length": body.length } }, (res) => {
      res.resume()
      const location = res.headers.location
      res.on("end", () => resolve({ status: res.statusCode ?? 0, messageId: location?.slice(location.lastIndexOf("/") + 1) }))
    })
    req.on("error", reject)
    req.end(body)
  })

/** Opens `count` sockets that say hello and then only hold on (from fresh loopback addresses). */
export const idleSockets = async (wsUrl: string, count: number): Promise<Array<WebSocket>> => {
  const sockets: Array<WebSocket> = []
  let next = 0
  const openOne = async (): Promise<void> => {
    while (next < count) {
      const i = next++
      const ws = new WebSocket(wsUrl, { localAddress: `127.0.${1 + Math.floor(i / 20_000)}.${1 + (i % 200)}`, perMessageDeflate: false })
      sockets.push(ws)
      await new Promise<void>((resolve, reject) => {
        ws.once("open", () => ws.send(JSON.stringify({ messageType: "hello", use_webpush: true })))
        ws.once("message", () => resolve())
        ws.once("error", reject)
      })
    }
  }
  await Promise.all(Array.from({ length: 100 }, openOne))
  return sockets
}

