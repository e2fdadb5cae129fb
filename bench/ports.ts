/**
 * `npm run bench:ports`: how N processes should share a public port, measured on the storm a
 * restart brings: N bare `ws` servers take K WebSocket connections opened at once (`--inflight`
 * handshakes in flight), the processes sharing the port
 *
 * - by SO_REUSEPORT (`listen({ reusePort: true })`, what `workers` does): each process has its own
 *   listening socket and the kernel hands each new connection to one of them;
 * - by Node's cluster module (round-robin, its default on Linux): the primary process accepts every
 *   connection and passes it to a worker over IPC.
 *
 * Printed per mode (modes alternate, `--reps` times; medians): time until all K are open, the
 * connections each process got (min/max share), and the CPU of the primary (cluster) — the one
 * process every connection goes through.
 *
 * Options (flag or environment): --processes/BENCH_PROCESSES (2), --connections/BENCH_CONNECTIONS
 * (10000), --inflight/BENCH_INFLIGHT (500), --reps/BENCH_REPS (3).
 */
import cluster from "node:cluster"
import { type ChildProcess, fork } from "node:child_process"
import { cpus, availableParallelism } from "node:os"
import { readFileSync } from "node:fs"
import { createServer } from "node:http"
import { WebSocket, WebSocketServer } from "ws"
import { freePort } from "../test/e2e/servers.ts"
import { option } from "./harness.ts"

const PROCESSES = Number(option("processes", "BENCH_PROCESSES", "2"))
const CONNECTIONS = Number(option("connections", "BENCH_CONNECTIONS", "10000"))
const INFLIGHT = Number(option("inflight", "BENCH_INFLIGHT", "500"))
const REPS = Number(option("reps", "BENCH_REPS", "3"))

type Mode = "reuseport" | "cluster"

/** A server process: counts its connections, tells them on request. */
const serve = (port: number, reusePort: boolean): void => {
  let count = 0
  const wss = new WebSocketServer({ noServer: true })
  const http = createServer()
  http.on("upgrade", (req, socket, head) => wss.handleUpgrade(req, socket, head, () => void count++))
  // A cluster worker's listen goes through the primary unless exclusive; with reusePort it is its own.
  http.listen({ port, host: "127.0.0.1", reusePort, exclusive: reusePort }, () => process.send?.({ ready: true }))
  process.on("message", (message: { readonly count?: boolean }) => {
    if (message.count === true) process.send?.({ count })
  })
}

const cpuTicks = (pid: number): number => {
  const fields = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]!.split(" ")
  return Number(fields[11]) + Number(fields[12])
}

/** Open `n` WebSockets, `inflight` handshakes at a time; ms until all are open. */
const storm = async (port: number, n: number, inflight: number): Promise<{ ms: number; sockets: Array<WebSocket> }> => {
  const sockets: Array<WebSocket> = []
  let next = 0
  const started = performance.now()
  const one = async (): Promise<void> => {
    while (next < n) {
      next++
      const ws = new WebSocket(`ws://127.0.0.1:${port}/`)
      await new Promise<void>((resolve, reject) => {
        ws.once("open", () => resolve())
        ws.once("error", reject)
      })
      sockets.push(ws)
    }
  }
  await Promise.all(Array.from({ length: inflight }, one))
  return { ms: performance.now() - started, sockets }
}

const ask = (child: ChildProcess | NodeJS.Process, message: unknown, key: string): Promise<unknown> =>
  new Promise((resolve) => {
    const on = (reply: Record<string, unknown>) => {
      if (key in reply) {
        child.off("message", on)
        resolve(reply[key])
      }
    }
    child.on("message", on)
    if (message !== undefined) child.send?.(message as never)
  })

/** One storm against N processes sharing the port in `mode`. */
const runOnce = async (mode: Mode) => {
  const port = await freePort()
  const children: Array<ChildProcess> = []
  const primary = mode === "cluster"
    ? fork(new URL(import.meta.url).pathname, ["--role", "primary", String(port), String(PROCESSES)], { stdio: ["ignore", "inherit", "inherit", "ipc"] })
    : undefined
  if (primary !== undefined) children.push(primary)
  else {
    for (let i = 0; i < PROCESSES; i++) {
      children.push(fork(new URL(import.meta.url).pathname, ["--role", "server", String(port)], { stdio: ["ignore", "inherit", "inherit", "ipc"] }))
    }
  }
  await Promise.all(children.map((child) => ask(child, undefined, "ready")))
  const primaryBefore = primary === undefined ? 0 : cpuTicks(primary.pid!)
  const { ms, sockets } = await storm(port, CONNECTIONS, INFLIGHT)
  const primaryMs = primary === undefined ? 0 : (cpuTicks(primary.pid!) - primaryBefore) * 10
  const counts = primary !== undefined
    ? (await ask(primary, { counts: true }, "counts")) as Array<number>
    : await Promise.all(children.map((child) => ask(child, { count: true }, "count") as Promise<number>))
  for (const ws of sockets) ws.terminate()
  for (const child of children) child.kill("SIGKILL")
  return { ms, counts, primaryMs }
}

const median = (values: ReadonlyArray<number>): number => {
  const sorted = [...values].sort((a, b) => a - b)
  return sorted[Math.floor(sorted.length / 2)]!
}

const role = process.argv[process.argv.indexOf("--role") + 1]
if (process.argv.includes("--role") && role === "server") {
  serve(Number(process.argv.at(-1)), true)
} else if (process.argv.includes("--role") && role === "primary") {
  // Node's cluster: the primary listens, round-robin hands the connections to its workers.
  const port = Number(process.argv.at(-2))
  const n = Number(process.argv.at(-1))
  if (cluster.isPrimary) {
    cluster.setupPrimary({ exec: new URL(import.meta.url).pathname, args: ["--role", "cluster-worker", String(port)] })
    const workers = Array.from({ length: n }, () => cluster.fork())
    let ready = 0
    for (const worker of workers) {
      worker.on("message", (message: Record<string, unknown>) => {
        if (message["ready"] === true && ++ready === n) process.send?.({ ready: true })
      })
    }
    process.on("message", async (message: Record<string, unknown> | undefined) => {
      if (message?.["counts"] !== true) return
      process.send?.({ counts: await Promise.all(workers.map((w) => ask(w.process as ChildProcess, { count: true }, "count"))) })
    })
  }
} else if (process.argv.includes("--role") && role === "cluster-worker") {
  serve(Number(process.argv.at(-1)), false)
} else {
  console.log(`# bench:ports: ${PROCESSES} processes sharing a port, ${CONNECTIONS} WebSockets opened, ${INFLIGHT} handshakes in flight`)
  console.log(`${cpus()[0]?.model ?? "?"}; ${availableParallelism()} core(s); the clients share them with the servers`)
  const results: Record<Mode, Array<Awaited<ReturnType<typeof runOnce>>>> = { reuseport: [], cluster: [] }
  for (let rep = 0; rep < REPS; rep++) {
    for (const mode of ["reuseport", "cluster"] as const) results[mode].push(await runOnce(mode))
  }
  console.log("\n| mode | all open (ms) | connections/s | share per process, min–max | primary CPU (ms) |")
  console.log("| --- | ---: | ---: | --- | ---: |")
  for (const mode of ["reuseport", "cluster"] as const) {
    const runs = results[mode]
    const ms = median(runs.map((r) => r.ms))
    const shares = runs.flatMap((r) => r.counts.map((c) => c / CONNECTIONS))
    console.log(
      `| ${mode} | ${ms.toFixed(0)} | ${(CONNECTIONS / (ms / 1000)).toFixed(0)} | ${(Math.min(...shares) * 100).toFixed(1)}–${(Math.max(...shares) * 100).toFixed(1)} % | ${mode === "cluster" ? median(runs.map((r) => r.primaryMs)).toFixed(0) : "—"} |`
    )
  }
  process.exit(0)
}
