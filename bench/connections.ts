/**
 * `npm run bench:connections [N]`: memory per identified WebSocket connection, autopush's connection
 * node against a bare `ws` server that only answers hello, in the same run.
 *
 * Each server runs in its own process (with --expose-gc); N clients (default 15 000) connect from
 * several client processes over 127.0.x.y source addresses (a process here cannot open more than
 * 20 000 files). Clients connect in batches of 5 000; after each batch, a settle and full GCs, the
 * server's memory is read; the figure per connection is the slope of memory over connections from
 * the first batch on. BENCH_BROADCASTS=1: every client follows a broadcast the node serves (the cost
 * of broadcast subscriptions is the difference to a run without).
 *
 * Also read: the kernel's memory for them (the machine's slab, /proc/meminfo: sockets, their files
 * and buffers — both ends of each loopback connection, and whatever else the machine does), per
 * connection, and so the connections one GiB holds (process RSS and
 * kernel memory together). A server process holds at most its open-file limit of connections: a
 * larger N is cut to what the limit allows, and the run says so.
 */
import { fork, type ChildProcess } from "node:child_process"
import { readFileSync } from "node:fs"
import { setTimeout as sleep } from "node:timers/promises"

const PER_PROCESS = 5_000
/** Files a server process keeps for itself (listeners, IPC, its libraries). */
const SPARE_FILES = 1_000
/** The open-file limit of processes started here (what the servers inherit). */
const fileLimit = Number(/Max open files\s+(\d+)/.exec(readFileSync("/proc/self/limits", "utf8"))?.[1] ?? Number.POSITIVE_INFINITY)
const asked = Number(process.argv[2] ?? process.env["BENCH_CONNECTIONS"] ?? 15_000)
const N = Math.min(asked, Math.floor((fileLimit - SPARE_FILES) / PER_PROCESS) * PER_PROCESS)

/** The kernel's slab memory (socket structures, files, buffers of the whole machine), in bytes. */
const kernelSlabBytes = (): number => Number(/^Slab:\s+(\d+) kB/m.exec(readFileSync("/proc/meminfo", "utf8"))?.[1] ?? 0) * 1024
/** Idle time before reading memory: past V8's memory-reducer delay (8 s), as for a server at rest. */
const SETTLE_MS = Number(process.env["BENCH_SETTLE_MS"] ?? 10_000)
const here = new URL(".", import.meta.url).pathname

interface Sample {
  readonly rss: number
  readonly heapUsed: number
  readonly heapTotal: number
  readonly external: number
  readonly connections: number
}

const once = <T>(child: ChildProcess, predicate: (m: unknown) => boolean = () => true) =>
  new Promise<T>((resolve, reject) => {
    const onMessage = (m: unknown) => {
      if (!predicate(m)) return
      child.off("message", onMessage)
      resolve(m as T)
    }
    child.on("message", onMessage)
    child.once("exit", (code) => reject(new Error(`child exited with ${code}`)))
  })

const measure = async (server: ChildProcess): Promise<Sample> => {
  const sample = once<Sample>(server, (m) => typeof m === "object" && m !== null && "rss" in m)
  server.send("measure")
  return sample
}

/**
 * Each server gets its own client source addresses (127.0.<subnet>.x): the sockets a previous run
 * left in TIME_WAIT would otherwise make every bind() of the next run search the port table, and
 * the second server would look several times slower to accept than it is.
 */
const run = async (kind: "autopush" | "bare", subnet: number) => {
  const server = fork(`${here}connection-servers.ts`, [kind], { execArgv: ["--expose-gc"], stdio: ["ignore", "ignore", "inherit", "ipc"] })
  const { port } = await once<{ port: number }>(server, (m) => typeof m === "object" && m !== null && "port" in m)
  await sleep(500)
  // Memory after each batch: the slope over these points is the cost of one more connection, less
  // sensitive to where the baseline happens to sit than one difference.
  const points: Array<{ readonly connections: number; readonly sample: Sample; readonly kernel: number }> = [
    { connections: 0, sample: await measure(server), kernel: kernelSlabBytes() }
  ]
  const clients: Array<ChildProcess> = []
  let identified = 0
  let failed = 0
  let connectMs = 0
  for (let i = 0; i * PER_PROCESS < N; i++) {
    const count = Math.min(PER_PROCESS, N - i * PER_PROCESS)
    const started = Date.now()
    const child = fork(`${here}connection-clients.ts`, [String(port), String(count), `127.0.${subnet}.${i + 2}`], { stdio: ["ignore", "ignore", "inherit", "ipc"] })
    clients.push(child)
    const result = await once<{ identified: number; failed: number }>(child)
    connectMs += Date.now() - started
    identified += result.identified
    failed += result.failed
    await sleep(SETTLE_MS)
    points.push({ connections: identified, sample: await measure(server), kernel: kernelSlabBytes() })
  }
  for (const c of clients) c.kill()
  server.kill()
  const last = points[points.length - 1]!.sample
  // The empty server's reading is left out of the fit: its heap pages are not yet in use the way
  // they are once connections arrive, which pulls the slope down (below the heap's own slope).
  const loaded = points.length > 2 ? points.slice(1) : points
  const perConnection = (field: keyof Sample) => slope(loaded.map((p) => [p.connections, p.sample[field]] as const))
  return {
    kind,
    identified,
    failed,
    connectSeconds: connectMs / 1000,
    serverConnections: last.connections,
    rssPerConn: perConnection("rss"),
    heapPerConn: perConnection("heapUsed"),
    heapTotalPerConn: perConnection("heapTotal"),
    externalPerConn: perConnection("external"),
    kernelPerConn: slope(loaded.map((p) => [p.connections, p.kernel] as const)),
    rssTotalMiB: last.rss / 2 ** 20
  }
}

/** Least-squares slope of y over x. */
const slope = (xy: ReadonlyArray<readonly [number, number]>): number => {
  const n = xy.length
  const mx = xy.reduce((a, [x]) => a + x, 0) / n
  const my = xy.reduce((a, [, y]) => a + y, 0) / n
  const sxy = xy.reduce((a, [x, y]) => a + (x - mx) * (y - my), 0)
  const sxx = xy.reduce((a, [x]) => a + (x - mx) ** 2, 0)
  return sxy / sxx
}

const kib = (bytes: number) => `${(bytes / 1024).toFixed(2)} KiB`

const main = async () => {
  if (N < asked) {
    console.log(
      `asked for ${asked} connections; this machine lets a process open ${fileLimit} files (the hard limit, which only ` +
        `a process with CAP_SYS_RESOURCE may raise): one server holds at most about ${fileLimit - SPARE_FILES}, so N = ${N}`
    )
  }
  console.log(`bench:connections — N = ${N} identified connections per server`)
  const bare = await run("bare", 1)
  const ours = await run("autopush", 2)
  for (const r of [bare, ours]) {
    console.log(
      `${r.kind.padEnd(9)} identified ${r.identified} (failed ${r.failed}, server sees ${r.serverConnections}) in ${r.connectSeconds.toFixed(1)} s; ` +
        `RSS ${kib(r.rssPerConn)}/conn, heap used ${kib(r.heapPerConn)}/conn (heap total ${kib(r.heapTotalPerConn)}, external ${kib(r.externalPerConn)}), RSS total ${r.rssTotalMiB.toFixed(1)} MiB; ` +
        `kernel ${kib(r.kernelPerConn)}/conn (slab, both ends); ${Math.floor(2 ** 30 / (r.rssPerConn + r.kernelPerConn)).toLocaleString("en")} connections per GiB (RSS + kernel)`
    )
  }
  console.log(`ratio autopush / bare: RSS ${(ours.rssPerConn / bare.rssPerConn).toFixed(2)}×, heap ${(ours.heapPerConn / bare.heapPerConn).toFixed(2)}×`)
  const within = (ratio: number) => (ratio <= 1.2 ? "met" : "NOT met")
  console.log(
    `target: heap and RSS per connection ≤ 1.2× bare: heap ${within(ours.heapPerConn / bare.heapPerConn)}, RSS ${within(ours.rssPerConn / bare.rssPerConn)}`
  )
}

await main()
