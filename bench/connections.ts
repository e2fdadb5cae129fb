/**
 * `npm run bench:connections [N]`: memory per identified WebSocket connection, autopush's connection
 * node against a bare `ws` server that only answers hello, in the same run.
 *
 * Each server runs in its own process (with --expose-gc); N clients (default 15 000) connect from
 * several client processes over 127.0.0.x source addresses (a process here cannot open more than
 * 20 000 files). The figure is (RSS or heap after N identified connections − before) / N, after a
 * full GC and a settle.
 */
import { fork, type ChildProcess } from "node:child_process"
import { setTimeout as sleep } from "node:timers/promises"

const N = Number(process.argv[2] ?? process.env["BENCH_CONNECTIONS"] ?? 15_000)
const PER_PROCESS = 5_000
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

const run = async (kind: "autopush" | "bare") => {
  const server = fork(`${here}connection-servers.ts`, [kind], { execArgv: ["--expose-gc"], stdio: ["ignore", "ignore", "inherit", "ipc"] })
  const { port } = await once<{ port: number }>(server, (m) => typeof m === "object" && m !== null && "port" in m)
  await sleep(500)
  const before = await measure(server)
  const started = Date.now()
  const clients: Array<ChildProcess> = []
  const ready: Array<Promise<{ identified: number; failed: number }>> = []
  for (let i = 0; i * PER_PROCESS < N; i++) {
    const count = Math.min(PER_PROCESS, N - i * PER_PROCESS)
    const child = fork(`${here}connection-clients.ts`, [String(port), String(count), `127.0.0.${i + 2}`], { stdio: ["ignore", "ignore", "inherit", "ipc"] })
    clients.push(child)
    ready.push(once(child))
  }
  const results = await Promise.all(ready)
  const identified = results.reduce((a, r) => a + r.identified, 0)
  const failed = results.reduce((a, r) => a + r.failed, 0)
  const connectSeconds = (Date.now() - started) / 1000
  await sleep(SETTLE_MS)
  const after = await measure(server)
  for (const c of clients) c.kill()
  server.kill()
  return {
    kind,
    identified,
    failed,
    connectSeconds,
    serverConnections: after.connections,
    rssPerConn: (after.rss - before.rss) / identified,
    heapPerConn: (after.heapUsed - before.heapUsed) / identified,
    heapTotalPerConn: (after.heapTotal - before.heapTotal) / identified,
    externalPerConn: (after.external - before.external) / identified,
    rssTotalMiB: after.rss / 2 ** 20
  }
}

const kib = (bytes: number) => `${(bytes / 1024).toFixed(2)} KiB`

const main = async () => {
  console.log(`bench:connections — N = ${N} identified connections per server`)
  const bare = await run("bare")
  const ours = await run("autopush")
  for (const r of [bare, ours]) {
    console.log(
      `${r.kind.padEnd(9)} identified ${r.identified} (failed ${r.failed}, server sees ${r.serverConnections}) in ${r.connectSeconds.toFixed(1)} s; ` +
        `RSS ${kib(r.rssPerConn)}/conn, heap used ${kib(r.heapPerConn)}/conn (heap total ${kib(r.heapTotalPerConn)}, external ${kib(r.externalPerConn)}), RSS total ${r.rssTotalMiB.toFixed(1)} MiB`
    )
  }
  console.log(`ratio autopush / bare: RSS ${(ours.rssPerConn / bare.rssPerConn).toFixed(2)}×, heap ${(ours.heapPerConn / bare.heapPerConn).toFixed(2)}×`)
  console.log(`target: ≤ 8 KiB RSS per connection (${ours.rssPerConn <= 8192 ? "met" : "NOT met"}), ≤ 1.3× bare (${ours.rssPerConn <= 1.3 * bare.rssPerConn ? "met" : "NOT met"})`)
}

await main()
