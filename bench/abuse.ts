/**
 * `npm run bench:abuse`: what abusive clients cost a well-behaved one, against the real all-in-one
 * process (`npm start`'s, embedded storage on disk), measured from outside.
 *
 * One victim client (hello, register, ack) gets a push through the public API (`fetch` POST,
 * `TTL: 60`) every 50 ms. Then, one after the other, each abuse runs for --seconds/BENCH_SECONDS
 * (10) from its own process (`abuse-client.ts`), the victim's pushes going on meanwhile:
 *
 *   baseline            no abuse
 *   silent endpoint     2,000 TCP connections to the endpoint port that send nothing, from the
 *                       abusers' address (below)
 *   silent websocket    the same on the WebSocket port
 *   ping flood          one WebSocket sends `{}` frames as fast as its socket takes them
 *   garbage flood       the same with random non-JSON text frames
 *   ping flood again    the ping flood once more: whether the V8 heap grows again (retained, a
 *                       leak) or not (a high-water mark)
 *   receipt collectors  300 `GET /receipts/{id}` (server-sent events) of one receipt subscription,
 *                       from the abusers' address
 *   matrix notify       notify requests of 64 KiB built for work, one after the other from the loopback (not limited by address; `abuse-gateway.ts`:
 *                       its note has the worst and p99 time per notify)
 *   websocket …         the costliest frames of each WebSocket command, and a client that never
 *                       acks (`abuse-websocket.ts`, with its own table)
 *   route …             in this process, one per route of the endpoint port (`abuse-routes.ts`):
 *                       its most expensive requests at each protocol's size limits, one after the
 *                       other over HTTP/1.1 and HTTP/2; the worst time one took is the table's
 *                       "worst request" (cases made in this process are listed in `IN_PROCESS`)
 *
 * For each: the victim's POST→notification latency p50 / p99 / max, the pushes that failed (not
 * 201, or not delivered by the "after" reading), the node's RSS (VmRSS) before, at its peak
 * during and --settle (4) s after the abuse, its open file descriptors likewise, and its V8 heap
 * in use likewise (`process_heap_used_bytes` of its `GET /metrics`, on the all-in-one's router
 * port; the peak is sampled every 250 ms, and garbage not yet collected counts as in use). The
 * node is started with `--client-request-timeout 5`, so that silent connections are closed within
 * the window, and otherwise default limits.
 *
 * The abusers' address: the machine's first non-internal IPv4 address (`os.networkInterfaces()`),
 * to which the silent sockets and the receipt collectors connect, their source bound to it; the
 * node is then started with `--bind-host 0.0.0.0` (its private router port stays on 127.0.0.1)
 * and counts them toward `max_connections_per_address` (1,000: of 2,000 silent sockets, about
 * 1,000 are answered 503 and closed) and the receipt routes' per-address limits. Without one, they
 * connect to 127.0.0.1 from 127.0.0.2, the loopback, which the node never counts: that cap is not
 * exercised then (the bench says so), only the time bounds are. The victim and the floods are on
 * 127.0.0.1 either way.
 *
 * Options (flag or environment): --seconds/BENCH_SECONDS (10), --sockets/BENCH_SOCKETS (2000),
 * --collectors/BENCH_COLLECTORS (300), --settle/BENCH_SETTLE (4: seconds from the abuse's end to the
 * "after" figures), --only/BENCH_ONLY (comma-separated case names). AUTOPUSH_SERVER_ROOT=<checkout>
 * runs that checkout's all-in-one instead of this one's (the same cases against an earlier commit,
 * e.g. a `git worktree` of it, to compare the two in one session).
 */
import { fork } from "node:child_process"
import { once } from "node:events"
import { randomBytes } from "node:crypto"
import { readdirSync } from "node:fs"
import { cpus, networkInterfaces } from "node:os"
import { setTimeout as sleep } from "node:timers/promises"
import { gatewayCases } from "./abuse-gateway.ts"
import { endpointRouteCases, type InProcessCase, type InProcessCases } from "./abuse-routes.ts"
import { fmt, hello, option, quantile, register, rssMiB, start } from "./harness.ts"
import { webSocketCommands } from "./abuse-websocket.ts"

/** Groups of cases run in this process (after the forked ones), one line each. */
const IN_PROCESS: ReadonlyArray<InProcessCases> = [
  endpointRouteCases
]

const SECONDS = Number(option("seconds", "BENCH_SECONDS", "10"))
const SOCKETS = Number(option("sockets", "BENCH_SOCKETS", "2000"))
const COLLECTORS = Number(option("collectors", "BENCH_COLLECTORS", "300"))
const ONLY = option("only", "BENCH_ONLY", "").split(",").filter((s) => s.length > 0)
const PUSH_EVERY_MS = 50
const SETTLE_MS = Number(option("settle", "BENCH_SETTLE", "4")) * 1000

const fds = (pid: number): number => readdirSync(`/proc/${pid}/fd`).length

/** The node's V8 heap in use (MiB), from its Prometheus text; NaN when it has none. */
const heapMiB = async (metricsUrl: string): Promise<number> => {
  const res = await fetch(metricsUrl, { signal: AbortSignal.timeout(5_000) })
  const match = /^process_heap_used_bytes (\S+)$/m.exec(await res.text())
  return match === null ? Number.NaN : Number(match[1]) / (1024 * 1024)
}

/** The machine's first non-internal IPv4 address, which the node counts toward its per-address caps (unlike the loopback). */
const outsideAddress = (): string | undefined =>
  Object.values(networkInterfaces())
    .flatMap((addresses) => addresses ?? [])
    .find((a) => a.family === "IPv4" && !a.internal)?.address

interface Row {
  readonly name: string
  readonly pushes: number
  readonly failed: number
  readonly p50: number
  readonly p99: number
  readonly max: number
  readonly rss: readonly [number, number, number]
  readonly fds: readonly [number, number, number]
  readonly heap: readonly [number, number, number]
  /** The longest an abusive request took to be answered (in-process cases); NaN for the others. */
  readonly worst: number
  readonly note: string
}

const main = async () => {
  console.log(`bench:abuse on ${cpus()[0]?.model ?? "?"} × ${cpus().length}, node ${process.version}`)
  const outside = outsideAddress()
  // The abusers connect to `to` from `from`; the node listens on every interface when `to` is not the loopback.
  const [to, from] = outside === undefined ? ["127.0.0.1", "127.0.0.2"] : [outside, outside]
  console.log(
    outside === undefined
      ? "abusers' address: no non-internal IPv4 address, so 127.0.0.2 → 127.0.0.1: the loopback, never counted toward max_connections_per_address (not exercised)"
      : `abusers' address: ${outside} (the node bound to 0.0.0.0), counted toward max_connections_per_address`
  )
  // The victim is pushed to every 50 ms throughout: its subscription's own limit lifted, so that every probe is taken.
  const { deployment, pid } = await start([
    "--client-request-timeout", "5",
    "--rate-limit-per-subscription", "0",
    ...(outside === undefined ? [] : ["--bind-host", "0.0.0.0"])
  ])
  const endpointUrl = new URL(deployment.endpointUrl)
  const wsUrl = new URL(deployment.wsUrl)
  const abusedEndpointUrl = new URL(deployment.endpointUrl)
  abusedEndpointUrl.hostname = to
  // The all-in-one serves /metrics on its router port.
  const metricsUrl = new URL("/metrics", deployment.routerUrl).href
  const cases: Array<{ readonly name: string; readonly args?: ReadonlyArray<string>; readonly script?: string; readonly run?: InProcessCase["run"] }> = [
    { name: "baseline" },
    { name: "silent endpoint", args: ["silent", `${to}:${endpointUrl.port}`, String(SOCKETS), from] },
    { name: "silent websocket", args: ["silent", `${to}:${wsUrl.port}`, String(SOCKETS), from] },
    { name: "ping flood", args: ["ping", deployment.wsUrl] },
    { name: "garbage flood", args: ["garbage", deployment.wsUrl] },
    { name: "ping flood again", args: ["ping", deployment.wsUrl] },
    { name: "receipt collectors", args: ["receipts", abusedEndpointUrl.href, String(COLLECTORS), from] },
    ...gatewayCases(deployment.endpointUrl)
  ]
  const rows: Array<Row> = []
  const closes: Array<() => Promise<void>> = []
  try {
    for (const make of IN_PROCESS) {
      const made = await make(deployment)
      closes.push(made.close)
      cases.push(...made.cases)
    }
    const victim = await hello(deployment.wsUrl)
    const endpoint = await register(victim)
    // A push's body, base64url, is the notification's `data`: the key to its send time.
    const sentAt = new Map<string, number>()
    let latencies: Array<number> = []
    victim.ws.on("message", (raw) => {
      const frame = JSON.parse(raw.toString()) as Record<string, unknown>
      if (frame["messageType"] !== "notification") return
      victim.send({ messageType: "ack", updates: [{ channelID: frame["channelID"], version: frame["version"], code: 100 }] })
      const began = sentAt.get(frame["data"] as string)
      if (began === undefined) return
      sentAt.delete(frame["data"] as string)
      latencies.push(performance.now() - began)
    })
    const pushOne = async (): Promise<boolean> => {
      const body = randomBytes(32)
      const key = body.toString("base64url")
      sentAt.set(key, performance.now())
      try {
        const res = await fetch(endpoint, {
          method: "POST",
          headers: { TTL: "60", "Content-Encoding": "aes128gcm" },
          body,
          signal: AbortSignal.timeout(10_000)
        })
        await res.arrayBuffer()
        if (res.status === 201) return true
      } catch {
        // counted as failed below
      }
      sentAt.delete(key)
      return false
    }

    for (const c of cases) {
      if (ONLY.length > 0 && !ONLY.includes(c.name)) continue
      await sleep(1_000)
      const rssBefore = rssMiB(pid)
      const fdsBefore = fds(pid)
      const heapBefore = await heapMiB(metricsUrl)
      let rssPeak = rssBefore
      let fdsPeak = fdsBefore
      let heapPeak = heapBefore
      const sampler = setInterval(() => {
        rssPeak = Math.max(rssPeak, rssMiB(pid))
        fdsPeak = Math.max(fdsPeak, fds(pid))
      }, 100)
      // The heap over HTTP, one request at a time: a reading the node is too busy to answer is skipped.
      let reading = false
      const heapSampler = setInterval(() => {
        if (reading) return
        reading = true
        heapMiB(metricsUrl).then(
          (heap) => {
            if (Number.isFinite(heap)) heapPeak = Math.max(heapPeak, heap)
          },
          () => {}
        ).finally(() => {
          reading = false
        })
      }, 250)
      const child = c.args === undefined
        ? undefined
        : fork(c.script ?? new URL("./abuse-client.ts", import.meta.url).pathname, [...c.args], { stdio: ["ignore", "inherit", "inherit", "ipc"] })
      let note = ""
      child?.on("message", (m) => {
        if (typeof m === "object" && m !== null && "note" in m) note = String(m.note)
      })
      if (child !== undefined) {
        // The abuse is under way (its sockets open, its flood begun), or 10 s have passed.
        await Promise.race([once(child, "message"), sleep(10_000)])
      }
      // The victim's pushes, one every 50 ms, for the abuse's duration (an in-process abuse meanwhile).
      latencies = []
      sentAt.clear()
      const sends: Array<Promise<boolean>> = []
      const until = performance.now() + SECONDS * 1000
      const inProcess = c.run?.(until)
      while (performance.now() < until) {
        sends.push(pushOne())
        await sleep(PUSH_EVERY_MS)
      }
      if (child !== undefined && child.exitCode === null) {
        const exited = once(child, "exit")
        child.send("stop")
        const timer = setTimeout(() => child.kill("SIGKILL"), 3_000)
        await exited
        clearTimeout(timer)
      }
      const ran = await inProcess
      if (ran !== undefined) note = ran.note
      const accepted = (await Promise.all(sends)).filter(Boolean).length
      // Deliveries still on their way get the settling time from the abuse's end.
      await sleep(SETTLE_MS)
      clearInterval(sampler)
      clearInterval(heapSampler)
      const heapAfter = await heapMiB(metricsUrl)
      const delivered = latencies.length
      rows.push({
        name: c.name,
        pushes: sends.length,
        failed: sends.length - Math.min(accepted, delivered),
        p50: quantile(latencies, 0.5),
        p99: quantile(latencies, 0.99),
        max: Math.max(...latencies),
        rss: [rssBefore, rssPeak, rssMiB(pid)],
        fds: [fdsBefore, fdsPeak, fds(pid)],
        heap: [heapBefore, Math.max(heapPeak, heapAfter), heapAfter],
        worst: ran?.worstMs ?? Number.NaN,
        note: child === undefined && ran === undefined ? "" : note
      })
      const r = rows[rows.length - 1] as Row
      console.log(`  ${r.name}: ${r.pushes} pushes, ${r.failed} failed, p50 ${fmt(r.p50)} ms, p99 ${fmt(r.p99)} ms; ${r.note}`)
    }
    await webSocketCommands(deployment, SECONDS, ONLY)
    await victim.close()
  } finally {
    for (const close of closes) await close().catch(() => {})
    await deployment.stop()
  }

  console.log(
    `\nWorst request: the longest one abusive request took to be answered (the route cases). Victim POST→notification latency (ms) and the node's RSS (MiB), V8 heap in use (MiB) and fds, ${SECONDS} s per case, one push per ${PUSH_EVERY_MS} ms; abusers from ${
      outside ?? "127.0.0.2 (the loopback: max_connections_per_address not exercised)"
    }`
  )
  console.log("| case | worst request | pushes | failed | p50 | p99 | max | RSS before / peak / after | heap before / peak / after | fds before / peak / after |")
  console.log("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
  for (const r of rows) {
    console.log(
      `| ${r.name} | ${Number.isNaN(r.worst) ? "–" : fmt(r.worst)} | ${r.pushes} | ${r.failed} | ${fmt(r.p50)} | ${fmt(r.p99)} | ${fmt(r.max)} | ${r.rss.map((v) => fmt(v, 0)).join(" / ")} | ${
        r.heap.map((v) => fmt(v, 0)).join(" / ")
      } | ${r.fds.join(" / ")} |`
    )
  }
  console.log("\nWhat each abuser did and what it was answered:")
  for (const r of rows) if (r.note !== "") console.log(`  ${r.name}: ${r.note}`)
}

main().then(() => process.exit(0), (error: unknown) => {
  console.error(error)
  process.exit(1)
})
