/**
 * `npm run bench:connections [-- --count N]`: memory per identified WebSocket connection, autopush's connection
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
 *
 * Options (flag or environment): --count/BENCH_CONNECTIONS (15000; N as the first argument works
 * too), --workers/BENCH_WORKERS, BENCH_SETTLE_MS (10000).
 *
 * `--workers W` (or `auto`: one per 15,000 connections) measures a node of several processes, for
 * more connections than one process may open files:
 *
 *     npm run bench:connections -- --count 100000 --workers 7
 *
 * - ours: the real entrypoint, `bin/autopush.js --workers W` on embedded storage (its supervisor runs
 *   the store, the W workers share the WebSocket port with SO_REUSEPORT, worker i has router port
 *   `router_port + i`); bare: W `ws` processes sharing one port (SO_REUSEPORT) that answer hello
 *   (with the client's uaid) and register;
 * - the clients, from max(3, ⌈count / 15,000⌉) processes started one after the other, say hello and
 *   register one channel each; after each process's batch, a settle and a reading. Then the server
 *   is restarted (ours: SIGTERM to the supervisor, started again on the same data directory; bare:
 *   its processes stopped and started again), and every client comes back with its uaid (a hello
 *   with uaid and channelIDs), batch after batch, a reading after each;
 * - per connection, as slopes over the batches, registered and resumed: RSS of the processes holding
 *   the connections (ours: the workers; from /proc), RSS of all server processes (ours: the
 *   supervisor too, with the embedded storage), V8 heap used (ours: `process_heap_used_bytes` on each
 *   worker's /metrics, which forces no GC, so neither side is GC'd before a reading in this mode;
 *   bare: process.memoryUsage over IPC), the kernel's slab (Slab, SUnreclaim) and TCP socket buffers
 *   (/proc/net/sockstat `mem`) — the machine's, both ends of each loopback connection — and the
 *   connections one GiB holds; as a markdown table, ours against bare. The client processes' memory
 *   is in no figure but the kernel's.
 */
import { fork, type ChildProcess } from "node:child_process"
import { readFileSync } from "node:fs"
import { setTimeout as sleep } from "node:timers/promises"
import { kernelMemory, rssBytes, sampleSum, scrape, startNode, type WorkersNode } from "./storm-node.ts"

const PER_PROCESS = 5_000
/** Files a server process keeps for itself (listeners, IPC, its libraries). */
const SPARE_FILES = 1_000
/** The open-file limit of processes started here (what the servers inherit). */
const fileLimit = Number(/Max open files\s+(\d+)/.exec(readFileSync("/proc/self/limits", "utf8"))?.[1] ?? Number.POSITIVE_INFINITY)
/** A flag's value, else the environment's, else the fallback. */
const option = (flag: string, env: string, fallback: string): string => {
  const i = process.argv.indexOf(`--${flag}`)
  return (i >= 0 ? process.argv[i + 1] : undefined) ?? process.env[env] ?? fallback
}
/** `--count N`, or N as the first argument (as before), or BENCH_CONNECTIONS. */
const asked = Number(/^\d+$/.test(process.argv[2] ?? "") ? process.argv[2] : option("count", "BENCH_CONNECTIONS", "15000"))
const WORKERS_OPTION = option("workers", "BENCH_WORKERS", "")
const N = WORKERS_OPTION !== "" ? asked : Math.min(asked, Math.floor((fileLimit - SPARE_FILES) / PER_PROCESS) * PER_PROCESS)

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
    const onExit = (code: number | null) => reject(new Error(`child exited with ${code}`))
    const onMessage = (m: unknown) => {
      if (!predicate(m)) return
      child.off("message", onMessage)
      child.off("exit", onExit)
      resolve(m as T)
    }
    child.on("message", onMessage)
    child.once("exit", onExit)
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

// ── --workers: the node of several processes, registered clients, a restart and their resume ─────

/** Connections one worker (and one client process) is meant to hold: well under the 20,000 files a process may open here. */
const WORKER_CONNECTIONS = 15_000

/** One reading of a group of server processes and of the machine's kernel. */
interface Reading {
  readonly connections: number
  /** RSS of the processes holding the connections (ours: the workers; bare: its processes). */
  readonly rss: number
  /** RSS of every server process (ours: the supervisor, with the embedded storage, too). */
  readonly rssAll: number
  /** V8 heap used, summed over the processes holding the connections (NaN when not readable). */
  readonly heap: number
  readonly tcpBuffers: number
  readonly slab: number
  readonly slabUnreclaimable: number
}

/** A group of server processes sharing one WebSocket port. */
interface Group {
  readonly port: number
  readonly read: () => Promise<Reading>
  readonly restart: () => Promise<void>
  readonly stop: () => Promise<void>
  /** Its processes, for the log. */
  readonly describe: () => string
}

const kernelPart = () => {
  const { tcpBuffers, slab, slabUnreclaimable } = kernelMemory()
  return { tcpBuffers, slab, slabUnreclaimable }
}

/** Ours: `bin/autopush.js --workers W`; RSS from /proc, heap and connections from each worker's /metrics (router port). */
const oursGroup = async (workers: number, count: number): Promise<Group> => {
  // max_connections is the node's, shared among its workers: room for SO_REUSEPORT's uneven split.
  const node: WorkersNode = await startNode(workers, ["--max-connections", String(Math.ceil(count * 1.5) + 1_000)])
  return {
    port: node.wsPort,
    read: async () => {
      const pages = await Promise.all(node.routerUrls.map((url) => scrape(`${url}/metrics`)))
      const answered = pages.filter((page) => page.size > 0)
      return {
        connections: pages.reduce((sum, page) => sum + sampleSum(page, "net_connections", 'port="websocket"'), 0),
        rss: node.workerPids().reduce((sum, pid) => sum + rssBytes(pid), 0),
        rssAll: node.pids().reduce((sum, pid) => sum + rssBytes(pid), 0),
        heap: answered.length < pages.length ? Number.NaN : pages.reduce((sum, page) => sum + sampleSum(page, "process_heap_used_bytes"), 0),
        ...kernelPart()
      }
    },
    restart: node.restart,
    stop: node.stop,
    describe: () => `supervisor pid ${node.pid()}, workers ${node.workerPids().join(", ")}`
  }
}

/** Bare: W `ws` processes sharing the port (SO_REUSEPORT); RSS from /proc, heap through IPC. */
const bareGroup = async (workers: number): Promise<Group> => {
  let children: Array<ChildProcess> = []
  let port = 0
  const spawnOne = async (on: number) => {
    const child = fork(`${here}connection-servers.ts`, ["bare", String(on)], { stdio: ["ignore", "ignore", "inherit", "ipc"] })
    children.push(child)
    return (await once<{ port: number }>(child, (m) => typeof m === "object" && m !== null && "port" in m)).port
  }
  const up = async () => {
    children = []
    port = await spawnOne(port)
    for (let i = 1; i < workers; i++) await spawnOne(port)
  }
  const down = async () => {
    await Promise.all(children.map((child) =>
      new Promise<void>((resolve) => {
        if (child.exitCode !== null || child.signalCode !== null) return resolve()
        child.once("exit", () => resolve())
        child.kill("SIGTERM")
      })
    ))
  }
  await up()
  return {
    port,
    read: async () => {
      const samples = await Promise.all(children.map((child) => {
        const sample = once<Sample>(child, (m) => typeof m === "object" && m !== null && "rss" in m)
        child.send({ measure: true, gc: false })
        return sample
      }))
      const rss = children.reduce((sum, child) => sum + rssBytes(child.pid as number), 0)
      return {
        connections: samples.reduce((sum, s) => sum + s.connections, 0),
        rss,
        rssAll: rss,
        heap: samples.reduce((sum, s) => sum + s.heapUsed, 0),
        ...kernelPart()
      }
    },
    restart: async () => {
      await down()
      await up()
    },
    stop: down,
    describe: () => `pids ${children.map((c) => c.pid).join(", ")}`
  }
}

/** What a reading measures per connection (every field but the count). */
type Measured = Exclude<keyof Reading, "connections">

/** Per-connection figures of one phase: slopes over its readings, and the last reading's totals. */
type PhaseFigures = Record<Measured, number> & { readonly rssTotal: number; readonly serverConnections: number }

const phaseFigures = (points: ReadonlyArray<{ readonly clients: number; readonly reading: Reading }>): PhaseFigures => {
  const per = (field: Measured) => slope(points.map((p) => [p.clients, p.reading[field]] as const))
  const last = points[points.length - 1]!.reading
  return {
    rss: per("rss"),
    rssAll: per("rssAll"),
    heap: per("heap"),
    tcpBuffers: per("tcpBuffers"),
    slab: per("slab"),
    slabUnreclaimable: per("slabUnreclaimable"),
    rssTotal: last.rssAll,
    serverConnections: last.connections
  }
}

/**
 * Client process k's source addresses, 127.<block>.<k>.1-4: a few thousand sockets each (a bind to
 * an address with most of its ephemeral ports taken searches long), and addresses of their own for
 * each server and each phase, away from the TIME_WAIT sockets of the one before.
 */
const sourceAddresses = (block: number, k: number) => [1, 2, 3, 4].map((j) => `127.${block}.${k}.${j}`).join(",")

/** Waits (at most 70 s) until the TIME_WAIT sockets a stopped server left are gone, so that their end does not fall into a slope. */
const timeWaitGone = async (before: number) => {
  const deadline = Date.now() + 70_000
  while (kernelMemory().timeWait > before + 500 && Date.now() < deadline) await sleep(1_000)
}

/**
 * One pipeline: clients connect (hello, register) from `clientProcesses` processes one after the
 * other, a reading after each; the servers are restarted; every client comes back with its uaid,
 * process after process, a reading after each.
 */
const runWorkers = async (kind: "autopush" | "bare", subnet: number, count: number, workers: number) => {
  const clientProcesses = Math.max(3, Math.ceil(count / WORKER_CONNECTIONS))
  const shares = Array.from({ length: clientProcesses }, (_, i) => Math.floor((count * (i + 1)) / clientProcesses) - Math.floor((count * i) / clientProcesses))
  const timeWaitBefore = kernelMemory().timeWait
  const group = kind === "autopush" ? await oursGroup(workers, count) : await bareGroup(workers)
  console.log(`  ${kind}: ${workers} server processes on port ${group.port} (${group.describe()}); ${clientProcesses} client processes`)
  const clients: Array<ChildProcess> = []
  try {
    await sleep(SETTLE_MS)
    const registered: Array<{ readonly clients: number; readonly reading: Reading }> = [{ clients: 0, reading: await group.read() }]
    let identified = 0
    let registeredCount = 0
    let failed = 0
    let connectMs = 0
    for (const [i, share] of shares.entries()) {
      const started = Date.now()
      const child = fork(`${here}connection-clients.ts`, [String(group.port), String(share), sourceAddresses(10 + subnet, i), "register"], {
        stdio: ["ignore", "ignore", "inherit", "ipc"]
      })
      clients.push(child)
      const result = await once<{ identified: number; registered: number; failed: number }>(child)
      connectMs += Date.now() - started
      identified += result.identified
      registeredCount += result.registered
      failed += result.failed
      await sleep(SETTLE_MS)
      registered.push({ clients: identified, reading: await group.read() })
    }
    console.log(`  ${kind}: ${identified} identified, ${registeredCount} registered, ${failed} failed in ${(connectMs / 1000).toFixed(1)} s; the servers see ${registered[registered.length - 1]!.reading.connections}`)

    const restartStarted = Date.now()
    await group.restart()
    console.log(`  ${kind}: restarted in ${((Date.now() - restartStarted) / 1000).toFixed(1)} s (${group.describe()})`)
    await timeWaitGone(timeWaitBefore)
    await sleep(SETTLE_MS)
    const resumedPoints: Array<{ readonly clients: number; readonly reading: Reading }> = [{ clients: 0, reading: await group.read() }]
    let resumed = 0
    let changed = 0
    let resumeFailed = 0
    let resumeMs = 0
    for (const [i, child] of clients.entries()) {
      const started = Date.now()
      const result = once<{ resumed: number; changed: number; failed: number }>(child, (m) => typeof m === "object" && m !== null && "resumed" in m)
      child.send({ cmd: "resume", port: group.port, localAddress: sourceAddresses(20 + subnet, i) })
      const { resumed: r, changed: c, failed: f } = await result
      resumeMs += Date.now() - started
      resumed += r
      changed += c
      resumeFailed += f
      await sleep(SETTLE_MS)
      resumedPoints.push({ clients: resumed + changed, reading: await group.read() })
    }
    console.log(
      `  ${kind}: after the restart ${resumed} resumed with their uaid, ${changed} answered with another, ${resumeFailed} failed, in ${(resumeMs / 1000).toFixed(1)} s; ` +
        `the servers see ${resumedPoints[resumedPoints.length - 1]!.reading.connections}`
    )
    // The empty servers' readings are left out of the fits (as in the default mode).
    return {
      identified,
      registered: registeredCount,
      failed,
      resumed,
      changed,
      resumeFailed,
      connectSeconds: connectMs / 1000,
      resumeSeconds: resumeMs / 1000,
      before: phaseFigures(registered.slice(1)),
      after: phaseFigures(resumedPoints.slice(1))
    }
  } finally {
    for (const child of clients) child.kill()
    await group.stop()
  }
}

const mainWorkers = async (count: number, workers: number) => {
  const perWorker = Math.ceil(count / workers)
  console.log(
    `bench:connections --workers — ${count} connections (hello, then one channel registered each) over ${workers} server processes ` +
      `(~${perWorker} each; a process may open ${fileLimit} files), then the servers restarted and every client back with its uaid`
  )
  if (perWorker > fileLimit - SPARE_FILES) console.log(`  ! ${perWorker} connections per server process is more than the ${fileLimit}-file limit allows: use more --workers`)
  const bare = await runWorkers("bare", 1, count, workers)
  const ours = await runWorkers("autopush", 2, count, workers)
  const k = (bytes: number) => (Number.isNaN(bytes) ? "n/a" : kib(bytes))
  const ratio = (a: number, b: number) => (Number.isNaN(a) || Number.isNaN(b) ? "–" : `${(a / b).toFixed(2)}×`)
  const perGiB = (f: PhaseFigures) => Math.floor(2 ** 30 / (f.rss + f.slab + f.tcpBuffers))
  const perGiBAll = (f: PhaseFigures) => Math.floor(2 ** 30 / (f.rssAll + f.slab + f.tcpBuffers))
  const rows: ReadonlyArray<readonly [string, (f: PhaseFigures) => number, (n: number) => string]> = [
    ["RSS, processes holding the connections", (f) => f.rss, k],
    ["RSS, all server processes (ours: + the supervisor and its embedded storage)", (f) => f.rssAll, k],
    ["V8 heap used (ours: `process_heap_used_bytes` of each worker's /metrics; no forced GC on either side)", (f) => f.heap, k],
    ["kernel: slab, /proc/meminfo (both ends of each loopback connection)", (f) => f.slab, k],
    ["kernel: of which unreclaimable (SUnreclaim)", (f) => f.slabUnreclaimable, k],
    ["kernel: TCP socket buffers, /proc/net/sockstat `mem` (both ends)", (f) => f.tcpBuffers, k],
    ["connections per GiB (RSS of the connection processes + slab + TCP buffers)", perGiB, (n) => n.toLocaleString("en")],
    ["connections per GiB (RSS of all server processes + slab + TCP buffers)", perGiBAll, (n) => n.toLocaleString("en")]
  ]
  console.log("")
  console.log(`| per connection (slope over ${Math.max(3, Math.ceil(count / WORKER_CONNECTIONS))} batches) | ours, registered | bare | ours / bare | ours, resumed after the restart | bare | ours / bare |`)
  console.log("| --- | --- | --- | --- | --- | --- | --- |")
  for (const [name, value, show] of rows) {
    const [ob, bb, oa, ba] = [value(ours.before), value(bare.before), value(ours.after), value(bare.after)]
    console.log(`| ${name} | ${show(ob)} | ${show(bb)} | ${ratio(ob, bb)} | ${show(oa)} | ${show(ba)} | ${ratio(oa, ba)} |`)
  }
  const mib = (bytes: number) => `${(bytes / 2 ** 20).toFixed(0)} MiB`
  console.log(`| RSS of all server processes at the end | ${mib(ours.before.rssTotal)} | ${mib(bare.before.rssTotal)} | ${ratio(ours.before.rssTotal, bare.before.rssTotal)} | ${mib(ours.after.rssTotal)} | ${mib(bare.after.rssTotal)} | ${ratio(ours.after.rssTotal, bare.after.rssTotal)} |`)
  console.log(`| connections the servers see at the end | ${ours.before.serverConnections} | ${bare.before.serverConnections} | | ${ours.after.serverConnections} | ${bare.after.serverConnections} | |`)
  console.log(`| clients: connected and registered (failed) / resumed with their uaid (other uaid, failed) | ${ours.registered} (${ours.failed}) | ${bare.registered} (${bare.failed}) | | ${ours.resumed} (${ours.changed}, ${ours.resumeFailed}) | ${bare.resumed} (${bare.changed}, ${bare.resumeFailed}) | |`)
  console.log(`| seconds to connect them (batches one after the other, ${Math.ceil(count / Math.max(3, Math.ceil(count / WORKER_CONNECTIONS)))} per batch) | ${ours.connectSeconds.toFixed(1)} | ${bare.connectSeconds.toFixed(1)} | ${ratio(ours.connectSeconds, bare.connectSeconds)} | ${ours.resumeSeconds.toFixed(1)} | ${bare.resumeSeconds.toFixed(1)} | ${ratio(ours.resumeSeconds, bare.resumeSeconds)} |`)
  console.log(
    "\nKernel figures are the whole machine's and count both ends of each loopback connection (the clients' sockets too): about half is the server's." +
      " The clients' processes are not in any RSS or heap figure."
  )
}

if (WORKERS_OPTION === "") await main()
else await mainWorkers(N, WORKERS_OPTION === "auto" ? Math.max(1, Math.ceil(N / WORKER_CONNECTIONS)) : Number(WORKERS_OPTION))
