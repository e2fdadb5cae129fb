/**
 * The pipelines of `bench:scaling`, each with N processes:
 *
 * - ours: the real all-in-one entrypoint `bin/autopush.js --workers N` on its embedded storage (a
 *   fresh data_dir), as an operator starts it: the process started is the supervisor (it runs the
 *   embedded dynalite) and forks N workers sharing the WebSocket and endpoint ports, each with its
 *   router port `router_port + i`. N = 1 is started without the flag: one process, as today;
 * - bare, connected delivery: N `delivery-servers.ts bare-worker` processes sharing the WS and HTTP
 *   ports (SO_REUSEPORT), each with its own router port; a push reaching the wrong one is forwarded;
 * - bare, stored delivery: a dynalite server process (`delivery-dynalite.ts`, LevelDB on disk) and N
 *   `stored-servers.ts --shared` processes on it, sharing their two ports.
 *
 * Each is seen from outside: its process ids (for CPU from /proc) and its storage's CPU.
 */
import { join } from "node:path"
import { freePorts } from "../test/e2e/servers.ts"
import { threadCpuMs } from "./harness.ts"
import { answers, cpuOfMs, forkNode, freePortRange, next, type Proc, processTree, rememberTree, stopAll, spawnNode, waitUntil } from "./scaling-procs.ts"
import { createTables, storageClient } from "./stored-tables.ts"

const here = new URL(".", import.meta.url).pathname
const root = new URL("../", import.meta.url).pathname
const HOST = "127.0.0.1"

export interface Servers {
  readonly name: "ours" | "bare"
  readonly wsUrl: string
  /** Every server process now (ours: the supervisor and its workers; bare: its processes and its storage's). */
  readonly pids: () => ReadonlyArray<number>
  /** CPU ms so far of the storage, which `pids` include: ours, the dynalite thread; bare, its dynalite process. */
  readonly storageCpuMs: () => number
  /** "supervisor + 2 workers": what `pids` are, for the header. */
  readonly describe: () => string
  readonly stop: () => Promise<void>
}

export interface Ours extends Servers {
  /** Every worker's router URL, comma-separated: where the delivery clients look up how a message was delivered. */
  readonly routerUrls: string
  /** Stop every process and start them again on the same ports and data (the resumed clients' restart). */
  readonly restart: () => Promise<void>
}

/** Our ready line, from the process started (the supervisor logs it once every worker is ready). */
const isReadyLine = (line: string, pid: number) =>
  line.includes("ready: ") && (!line.includes(`"Pid":`) || line.includes(`"Pid":${pid},`))

const storageThreadMs = (pid: number): number => {
  try {
    return threadCpuMs(pid)["storage thread"] ?? 0
  } catch {
    return 0 // gone
  }
}

/** `bin/autopush.js` with `workers` processes (`extra` flags last), in `dir`; its data under `dir/data`. */
export const startOurs = async (workers: number, dir: string, extra: ReadonlyArray<string> = []): Promise<Ours> => {
  const [ws, endpoint] = (await freePorts(2)) as [number, number]
  const router = await freePortRange(workers)
  const flags = [
    "--port", String(ws),
    "--endpoint-port", String(endpoint),
    "--router-port", String(router),
    "--bind-host", HOST,
    "--endpoint-hostname", HOST,
    "--router-hostname", HOST,
    "--data-dir", join(dir, "data"),
    // Every client is on the loopback (not counted anyway): no cap to think about.
    "--max-connections-per-address", "0",
    ...(workers > 1 ? ["--workers", String(workers)] : []),
    ...extra
  ]
  const routerUrls = Array.from({ length: workers }, (_, i) => `http://${HOST}:${router + i}`)
  const up = async (): Promise<Proc> => {
    const proc = spawnNode(`autopush --workers ${workers}`, join(root, "bin/autopush.js"), flags, dir)
    // The ready line, and every worker's router port and the shared endpoint port answering.
    await waitUntil(proc, "autopush ready", async () =>
      proc.output.some((line) => isReadyLine(line, proc.pid)) &&
      (await Promise.all([...routerUrls, `http://${HOST}:${endpoint}`].map((url) => answers(`${url}/__lbheartbeat__`)))).every(Boolean))
    rememberTree(proc)
    const count = processTree(proc.pid).length
    if (workers > 1 && count < workers + 1) {
      throw new Error(`autopush --workers ${workers}: ${count} process(es), expected a supervisor and ${workers} workers`)
    }
    return proc
  }
  let proc = await up()
  return {
    name: "ours",
    wsUrl: `ws://${HOST}:${ws}/`,
    routerUrls: routerUrls.join(","),
    pids: () => processTree(proc.pid),
    storageCpuMs: () => storageThreadMs(proc.pid),
    describe: () => {
      const count = processTree(proc.pid).length
      return count === 1 ? "one process" : `supervisor + ${count - 1} workers`
    },
    restart: async () => {
      await stopAll([proc])
      proc = await up()
    },
    stop: () => stopAll([proc]).then(() => {})
  }
}

const ready = (proc: Proc) => next(proc, (m) => "ready" in m, 60_000)

/** Bare, connected delivery: `n` processes; push URLs `{httpBase}/push/{i}/{id}`. */
export const startBareConnected = async (n: number, dir: string): Promise<Servers & { readonly httpBase: string }> => {
  const [ws, http] = (await freePorts(2)) as [number, number]
  const router = await freePortRange(n)
  const routers = Array.from({ length: n }, (_, i) => router + i).join(",")
  const procs = Array.from({ length: n }, (_, i) =>
    forkNode(`bare ${i}`, join(here, "delivery-servers.ts"), ["bare-worker", String(ws), String(http), routers, String(i)], dir))
  await Promise.all(procs.map(ready))
  return {
    name: "bare",
    wsUrl: `ws://${HOST}:${ws}/`,
    httpBase: `http://${HOST}:${http}`,
    pids: () => procs.map((p) => p.pid),
    storageCpuMs: () => 0,
    describe: () => `${n} process${n === 1 ? "" : "es"}`,
    stop: () => stopAll(procs).then(() => {})
  }
}

/** Bare, stored delivery: a dynalite server process and `n` processes on it. */
export const startBareStored = async (n: number, dir: string): Promise<Servers & { readonly httpBase: string; readonly dynamoUrl: string }> => {
  const [dynamo, ws, http] = (await freePorts(3)) as [number, number, number]
  const dynamoUrl = `http://${HOST}:${dynamo}`
  const dynalite = forkNode("bare dynalite", join(here, "delivery-dynalite.ts"), [String(dynamo), join(dir, "dynalite")], dir)
  await ready(dynalite)
  const storage = await storageClient(dynamoUrl)
  await createTables(storage.send)
  storage.destroy()
  const procs = Array.from({ length: n }, (_, i) =>
    forkNode(`bare ${i}`, join(here, "stored-servers.ts"), ["--shared", dynamoUrl, String(ws), String(http), String(i), String(n)], dir))
  await Promise.all(procs.map(ready))
  return {
    name: "bare",
    wsUrl: `ws://${HOST}:${ws}/`,
    httpBase: `http://${HOST}:${http}`,
    dynamoUrl,
    pids: () => [...procs, dynalite].map((p) => p.pid),
    storageCpuMs: () => cpuOfMs([dynalite.pid]),
    describe: () => `${n} process${n === 1 ? "" : "es"} + a dynalite process`,
    stop: () => stopAll([...procs, dynalite]).then(() => {})
  }
}
