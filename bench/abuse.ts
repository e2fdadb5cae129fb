/**
 * `npm run bench:abuse`: what abusive clients cost a well-behaved one, against the real all-in-one
 * process (`npm start`'s, embedded storage on disk), measured from outside.
 *
 * One victim client (hello, register, ack) gets a push through the public API (`fetch` POST,
 * `TTL: 60`) every 50 ms. Then, one after the other, each abuse runs for --seconds/BENCH_SECONDS
 * (10) from its own process (`abuse-client.ts`), the victim's pushes going on meanwhile:
 *
 *   baseline            no abuse
 *   silent endpoint     2,000 TCP connections to the endpoint port that send nothing (from 127.0.0.2)
 *   silent websocket    the same on the WebSocket port
 *   ping flood          one WebSocket sends `{}` frames as fast as its socket takes them
 *   garbage flood       the same with random non-JSON text frames
 *   receipt collectors  300 `GET /receipts/{id}` (server-sent events) of one receipt subscription
 *
 * For each: the victim's POST→notification latency p50 / p99 / max, the pushes that failed (not
 * 201, or not delivered by the "after" reading), the node's RSS (VmRSS) before, at its peak
 * during and --settle (4) s after the abuse, and its open file descriptors likewise. The node is started with
 * `--client-request-timeout 5`, so that silent connections are closed within the window.
 *
 * Every address is on 127.0.0.0/8, which the node exempts from `max_connections_per_address` (the
 * loopback is never counted): that cap is not exercised here, only the time bounds are.
 *
 * Options (flag or environment): --seconds/BENCH_SECONDS (10), --sockets/BENCH_SOCKETS (2000),
 * --collectors/BENCH_COLLECTORS (300), --settle/BENCH_SETTLE (4: seconds from the abuse's end to the
 * "after" figures), --only/BENCH_ONLY (comma-separated case names).
 */
import { fork } from "node:child_process"
import { once } from "node:events"
import { randomBytes } from "node:crypto"
import { readdirSync } from "node:fs"
import { cpus } from "node:os"
import { setTimeout as sleep } from "node:timers/promises"
import { fmt, hello, option, quantile, register, rssMiB, start } from "./harness.ts"

const SECONDS = Number(option("seconds", "BENCH_SECONDS", "10"))
const SOCKETS = Number(option("sockets", "BENCH_SOCKETS", "2000"))
const COLLECTORS = Number(option("collectors", "BENCH_COLLECTORS", "300"))
const ONLY = option("only", "BENCH_ONLY", "").split(",").filter((s) => s.length > 0)
const PUSH_EVERY_MS = 50
const SETTLE_MS = Number(option("settle", "BENCH_SETTLE", "4")) * 1000

const fds = (pid: number): number => readdirSync(`/proc/${pid}/fd`).length

interface Row {
  readonly name: string
  readonly pushes: number
  readonly failed: number
  readonly p50: number
  readonly p99: number
  readonly max: number
  readonly rss: readonly [number, number, number]
  readonly fds: readonly [number, number, number]
  readonly note: string
}

const main = async () => {
  console.log(`bench:abuse on ${cpus()[0]?.model ?? "?"} × ${cpus().length}, node ${process.version}`)
  const { deployment, pid } = await start(["--client-request-timeout", "5"])
  const endpointUrl = new URL(deployment.endpointUrl)
  const wsUrl = new URL(deployment.wsUrl)
  const cases: ReadonlyArray<{ readonly name: string; readonly args?: ReadonlyArray<string> }> = [
    { name: "baseline" },
    { name: "silent endpoint", args: ["silent", `127.0.0.1:${endpointUrl.port}`, String(SOCKETS), "127.0.0.2"] },
    { name: "silent websocket", args: ["silent", `127.0.0.1:${wsUrl.port}`, String(SOCKETS), "127.0.0.2"] },
    { name: "ping flood", args: ["ping", deployment.wsUrl] },
    { name: "garbage flood", args: ["garbage", deployment.wsUrl] },
    { name: "receipt collectors", args: ["receipts", deployment.endpointUrl, String(COLLECTORS), "127.0.0.2"] }
  ]
  const rows: Array<Row> = []
  try {
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
      let rssPeak = rssBefore
      let fdsPeak = fdsBefore
      const sampler = setInterval(() => {
        rssPeak = Math.max(rssPeak, rssMiB(pid))
        fdsPeak = Math.max(fdsPeak, fds(pid))
      }, 100)
      const child = c.args === undefined
        ? undefined
        : fork(new URL("./abuse-client.ts", import.meta.url).pathname, [...c.args], { stdio: ["ignore", "inherit", "inherit", "ipc"] })
      let note = ""
      child?.on("message", (m) => {
        if (typeof m === "object" && m !== null && "note" in m) note = String(m.note)
      })
      if (child !== undefined) {
        // The abuse is under way (its sockets open, its flood begun), or 10 s have passed.
        await Promise.race([once(child, "message"), sleep(10_000)])
      }
      // The victim's pushes, one every 50 ms, for the abuse's duration.
      latencies = []
      sentAt.clear()
      const sends: Array<Promise<boolean>> = []
      const until = performance.now() + SECONDS * 1000
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
      const accepted = (await Promise.all(sends)).filter(Boolean).length
      // Deliveries still on their way get the settling time from the abuse's end.
      await sleep(SETTLE_MS)
      clearInterval(sampler)
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
        note: child === undefined ? "" : note
      })
      const r = rows[rows.length - 1] as Row
      console.log(`  ${r.name}: ${r.pushes} pushes, ${r.failed} failed, p50 ${fmt(r.p50)} ms, p99 ${fmt(r.p99)} ms; ${r.note}`)
    }
    await victim.close()
  } finally {
    await deployment.stop()
  }

  console.log(`\nVictim POST→notification latency (ms) and the node's RSS (MiB) and fds, ${SECONDS} s per case, one push per ${PUSH_EVERY_MS} ms`)
  console.log("| case | pushes | failed | p50 | p99 | max | RSS before / peak / after | fds before / peak / after |")
  console.log("| --- | --- | --- | --- | --- | --- | --- | --- |")
  for (const r of rows) {
    console.log(
      `| ${r.name} | ${r.pushes} | ${r.failed} | ${fmt(r.p50)} | ${fmt(r.p99)} | ${fmt(r.max)} | ${r.rss.map((v) => fmt(v, 0)).join(" / ")} | ${r.fds.join(" / ")} |`
    )
  }
  console.log("\nWhat each abuser did and what it was answered:")
  for (const r of rows) if (r.note !== "") console.log(`  ${r.name}: ${r.note}`)
}

main().then(() => process.exit(0), (error: unknown) => {
  console.error(error)
  process.exit(1)
})
