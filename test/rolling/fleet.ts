/**
 * A fleet on one host for the rolling-restart lane and `bench:rolling`: an endpoint node and K
 * connection nodes (`autoconnect`, real processes, `--workers W` each when asked) on one PostgreSQL
 * schema, and in front of the connection nodes HAProxy (Debian's `haproxy`, TCP mode, leastconn,
 * an HTTP health check of every node's WebSocket port, so that a stopping node, whose listener is
 * closed, is taken out). Without a balancer the clients reach the one node directly.
 *
 * One HAProxy process holds two descriptors a connection and a process here may open 20,000: a
 * balancer for more clients is several HAProxy processes on the same port (SO_REUSEPORT, HAProxy's
 * default on Linux), each with its own health checks, as several balancer machines would be.
 *
 * The nodes' storage operations are read from their `/metrics` (`storage.time` counts) every
 * 200 ms and summed over each node's processes and restarts: what a process did between its last
 * reading and its exit is not counted.
 */
import { type ChildProcess, spawn } from "node:child_process"
import { once } from "node:events"
import { mkdtempSync, rmSync, writeFileSync } from "node:fs"
import { createConnection } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { generateFernetKey } from "../../src/crypto/fernet.ts"
import { descendants, freePortRange, scrape } from "../../bench/storm-node.ts"
import { postgresSchema } from "../e2e/servers.ts"

const root = new URL("../../", import.meta.url).pathname

/** Connections one HAProxy process is given (two descriptors each, under the 20,000 a process may open). */
export const CONNECTIONS_PER_BALANCER = 9_000

export interface ConnectionNode {
  readonly name: string
  readonly wsPort: number
  /** One per worker: its router port (its `/metrics`, its `/__heartbeat__`). */
  readonly routerUrls: ReadonlyArray<string>
  /** SIGTERM, and until it and its workers have exited. */
  readonly terminate: () => Promise<void>
  /** Start it again on the same ports; until every worker answers `/__lbheartbeat__`. */
  readonly up: () => Promise<void>
  /** Its open WebSockets, from its workers' `/__heartbeat__` (0 when it does not answer). */
  readonly connections: () => Promise<number>
}

export interface Fleet {
  /** Where clients connect: the balancer, or the one node without one. */
  readonly wsUrl: string
  readonly endpointUrl: string
  readonly nodes: ReadonlyArray<ConnectionNode>
  /** Until every balancer process has `node` in service (its health checks passed). */
  readonly inService: (node: ConnectionNode) => Promise<void>
  /** The connection nodes' storage operations so far, by operation (every process, every restart). */
  readonly storageOperations: () => Record<string, number>
  /** Every line the processes printed. */
  readonly output: Array<string>
  readonly stop: () => Promise<void>
}

export interface FleetOptions {
  /** The PostgreSQL server: the fleet makes a schema of its own there, dropped by `stop`. */
  readonly dsn: string
  readonly nodes: number
  /** Processes per connection node (1: `autoconnect` alone). */
  readonly workers: number
  /** HAProxy processes in front of the nodes; 0: none (one node, reached directly). */
  readonly balancers: number
  /** More flags for the connection nodes (after the fleet's own, so they override them). */
  readonly connectionFlags?: ReadonlyArray<string> | undefined
}

const waitUntil = async (what: string, ok: () => Promise<boolean>, output: ReadonlyArray<string>, timeoutMs = 60_000): Promise<void> => {
  for (const deadline = Date.now() + timeoutMs; !(await ok());) {
    if (Date.now() > deadline) throw new Error(`not ${what} within ${timeoutMs / 1000} s; the last lines:\n${output.slice(-20).join("\n")}`)
    await new Promise((r) => setTimeout(r, 100))
  }
}

const answers = (url: string) => fetch(url).then((res) => (res.body?.cancel(), res.ok), () => false)

const spawnLogged = (command: string, args: ReadonlyArray<string>, name: string, cwd: string, output: Array<string>): ChildProcess => {
  const child = spawn(command, args, { cwd, stdio: ["ignore", "pipe", "pipe"] })
  const collect = (chunk: Buffer) => output.push(...chunk.toString().split("\n").filter((l) => l !== "").map((l) => `[${name}] ${l}`))
  child.stdout?.on("data", collect)
  child.stderr?.on("data", collect)
  child.once("exit", (code, signal) => output.push(`[${name}] exited: code ${code}, signal ${signal}`))
  return child
}

/** SIGTERM `child` and wait until it and every process it had are gone. */
const terminate = async (child: ChildProcess | undefined): Promise<void> => {
  if (child === undefined || child.exitCode !== null || child.signalCode !== null) return
  const all = [child.pid as number, ...descendants(child.pid as number)]
  const exited = once(child, "exit")
  child.kill("SIGTERM")
  await exited
  const alive = (pid: number) => {
    try {
      process.kill(pid, 0)
      return true
    } catch {
      return false
    }
  }
  while (all.some(alive)) await new Promise((r) => setTimeout(r, 50))
}

/** `show stat` on an HAProxy stats socket: the status (UP, DOWN, …) of each server of `backend`. */
const serverStatus = (socket: string, backend: string): Promise<Map<string, string>> =>
  new Promise((resolve) => {
    const status = new Map<string, string>()
    const conn = createConnection(socket, () => conn.end("show stat\n"))
    let text = ""
    conn.on("data", (chunk: Buffer) => (text += chunk.toString()))
    conn.on("error", () => resolve(status))
    conn.on("close", () => {
      const [header, ...rows] = text.split("\n")
      const columns = (header ?? "").replace(/^# /, "").split(",")
      const [px, sv, st] = ["pxname", "svname", "status"].map((c) => columns.indexOf(c)) as [number, number, number]
      for (const row of rows.map((r) => r.split(","))) if (row[px] === backend && row[sv] !== "BACKEND") status.set(row[sv] as string, row[st] as string)
      resolve(status)
    })
  })

export const startFleet = async (options: FleetOptions): Promise<Fleet> => {
  const cwd = mkdtempSync(join(tmpdir(), "autopush-rolling-"))
  const output: Array<string> = []
  const schema = await postgresSchema(options.dsn, "rolling")
  const endpointPorts = await freePortRange(2)
  const shared = [
    "--endpoint-port", String(endpointPorts),
    "--db-dsn", schema.dsn,
    "--crypto-key", generateFernetKey(),
    "--endpoint-hostname", "127.0.0.1",
    "--bind-host", "127.0.0.1",
    "--log-level", "warn"
  ]
  const children = new Set<ChildProcess>()
  /** Each process's last reading, by router URL: folded into `finished` when it exits. */
  const finished: Record<string, number> = {}
  const readings = new Map<string, Record<string, number>>()
  /** Bumped by each fold: a reading of a process that has exited meanwhile is dropped. */
  const generations = new Map<string, number>()
  const read = async (url: string) => {
    const generation = generations.get(url) ?? 0
    const page = await scrape(`${url}/metrics`)
    if (page.size === 0 || generation !== (generations.get(url) ?? 0)) return
    const counts: Record<string, number> = {}
    for (const [key, value] of page) {
      const operation = /^storage_time_milliseconds_count\{.*operation="([^"]+)"/.exec(key)?.[1]
      if (operation !== undefined) counts[operation] = (counts[operation] ?? 0) + value
    }
    readings.set(url, counts)
  }
  const fold = (url: string) => {
    for (const [operation, n] of Object.entries(readings.get(url) ?? {})) finished[operation] = (finished[operation] ?? 0) + n
    readings.delete(url)
    generations.set(url, (generations.get(url) ?? 0) + 1)
  }

  const endpointArgs = [...shared, "--metrics-port", String(endpointPorts + 1), "--auth-keys", "rolling-auth-key"]
  const endpoint = spawnLogged(process.execPath, [join(root, "src/bin/autoendpoint.ts"), ...endpointArgs], "endpoint", cwd, output)
  children.add(endpoint)
  const endpointUrl = `http://127.0.0.1:${endpointPorts}`

  const nodes: Array<ConnectionNode> = []
  for (let k = 0; k < options.nodes; k++) {
    // The WebSocket port, then the workers' router ports.
    const base = await freePortRange(options.workers + 1)
    const routerUrls = Array.from({ length: options.workers }, (_, w) => `http://127.0.0.1:${base + 1 + w}`)
    const args = [
      join(root, "src/bin/autoconnect.ts"),
      ...shared,
      ...(options.workers > 1 ? ["--workers", String(options.workers)] : []),
      "--port", String(base),
      "--router-port", String(base + 1),
      "--router-hostname", "127.0.0.1",
      ...(options.connectionFlags ?? [])
    ]
    const name = `node${k + 1}`
    let child: ChildProcess | undefined
    const node: ConnectionNode = {
      name,
      wsPort: base,
      routerUrls,
      terminate: async () => {
        await terminate(child)
        if (child !== undefined) children.delete(child)
        for (const url of routerUrls) fold(url)
      },
      up: async () => {
        child = spawnLogged(process.execPath, args, name, cwd, output)
        children.add(child)
        for (const url of [`http://127.0.0.1:${base}`, ...routerUrls]) {
          await waitUntil(`${name} answered ${url}/__lbheartbeat__`, () => answers(`${url}/__lbheartbeat__`), output)
        }
      },
      connections: async () => {
        let sum = 0
        for (const url of routerUrls) {
          const health = await fetch(`${url}/__heartbeat__`).then((res) => res.json() as Promise<{ connections?: number }>, () => ({ connections: 0 }))
          sum += health.connections ?? 0
        }
        return sum
      }
    }
    nodes.push(node)
  }

  const balancerPort = options.balancers > 0 ? await freePortRange(1) : undefined
  const sockets = Array.from({ length: options.balancers }, (_, b) => join(cwd, `haproxy-${b}.sock`))
  const poller = setInterval(() => {
    for (const node of nodes) for (const url of node.routerUrls) void read(url)
  }, 200)
  const stop = async () => {
    clearInterval(poller)
    await Promise.all([...children].map(terminate))
    rmSync(cwd, { recursive: true, force: true })
    await schema.drop()
  }
  try {
    await Promise.all(nodes.map((node) => node.up()))
    await waitUntil("the endpoint node answered", () => answers(`${endpointUrl}/__lbheartbeat__`), output)
    for (const [b, socket] of sockets.entries()) {
      const config = join(cwd, `haproxy-${b}.cfg`)
      writeFileSync(config, [
        "global",
        `  maxconn ${CONNECTIONS_PER_BALANCER}`,
        `  stats socket ${socket} mode 600 level admin`,
        "defaults",
        "  mode tcp",
        // A refused connection is tried again after min(timeout connect, 1 s).
        "  timeout connect 500ms",
        "  timeout client 15m",
        "  timeout server 15m",
        // A connection to a node that has just closed its listener goes to another one.
        "  retries 3",
        "  option redispatch 1",
        "frontend websocket",
        `  bind 127.0.0.1:${balancerPort}`,
        `  maxconn ${CONNECTIONS_PER_BALANCER}`,
        "  default_backend connection_nodes",
        "backend connection_nodes",
        "  balance leastconn",
        "  option httpchk GET /__lbheartbeat__",
        // A stopping node refuses at once; a busy one may answer late, and is not taken out for it.
        "  timeout check 2s",
        "  default-server inter 500ms fall 2 rise 2",
        ...nodes.map((node) => `  server ${node.name} 127.0.0.1:${node.wsPort} check`),
        ""
      ].join("\n"))
      children.add(spawnLogged("haproxy", ["-db", "-f", config], `haproxy${b}`, cwd, output))
    }
    const fleet: Fleet = {
      wsUrl: `ws://127.0.0.1:${balancerPort ?? nodes[0]?.wsPort}/`,
      endpointUrl,
      nodes,
      inService: (node) =>
        waitUntil(`every balancer had ${node.name} in service`, async () => {
          for (const socket of sockets) if ((await serverStatus(socket, "connection_nodes")).get(node.name) !== "UP") return false
          return true
        }, output),
      storageOperations: () => {
        const sum: Record<string, number> = { ...finished }
        for (const counts of readings.values()) for (const [operation, n] of Object.entries(counts)) sum[operation] = (sum[operation] ?? 0) + n
        return sum
      },
      output,
      stop
    }
    for (const node of nodes) await fleet.inService(node)
    return fleet
  } catch (error) {
    await stop()
    throw error
  }
}
