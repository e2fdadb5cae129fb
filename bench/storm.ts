/**
 * `npm run bench:storm`: a reconnect storm on the real all-in-one process (embedded dynalite on
 * disk). N clients register and go away, one message is pushed to each (stored), then all of them
 * reconnect at once (at most --inflight handshakes in flight) and each waits for its message and
 * acks it. Printed: time until every client has its message, hellos/s, per-client time to its
 * message (p50/p99/max), and how many failed or timed out (30 s).
 *
 * Options (flag or environment): --clients/BENCH_CLIENTS (10000), --inflight/BENCH_INFLIGHT (2000).
 */
import { randomBytes, randomUUID } from "node:crypto"
import WebSocket from "ws"
import { agent, cpuMs, fmt, option, push, quantile, start } from "./harness.ts"

const CLIENTS = Number(option("clients", "BENCH_CLIENTS", "10000"))
const INFLIGHT = Number(option("inflight", "BENCH_INFLIGHT", "2000"))
const TIMEOUT_MS = 30_000

/** Client i's source address: 200 per address, so the ephemeral ports of one address suffice. */
const localAddress = (i: number) => `127.0.${1 + Math.floor(i / 50_000)}.${1 + (i % 200)}`

interface Session {
  readonly ws: WebSocket
  readonly frames: (onFrame: (m: Record<string, unknown>) => void) => void
}

const connect = (wsUrl: string, i: number): Promise<Session> =>
  new Promise((resolve, reject) => {
    const ws = new WebSocket(wsUrl, { localAddress: localAddress(i), perMessageDeflate: false })
    ws.once("open", () => resolve({ ws, frames: (onFrame) => ws.on("message", (data) => onFrame(JSON.parse(data.toString()))) }))
    ws.once("error", reject)
  })

/** Run `task` for 0..n-1 with at most `limit` at once. */
const pool = async (n: number, limit: number, task: (i: number) => Promise<void>) => {
  let next = 0
  await Promise.all(Array.from({ length: Math.min(limit, n) }, async () => {
    while (next < n) await task(next++)
  }))
}

const { deployment, pid } = await start([])
try {
  // Users with one channel each, then offline.
  const users: Array<{ uaid: string; endpoint: string }> = []
  await pool(CLIENTS, 100, async (i) => {
    const s = await connect(deployment.wsUrl, i)
    const channelID = randomUUID()
    await new Promise<void>((resolve) => {
      let uaid = ""
      s.frames((m) => {
        if (m["messageType"] === "hello") {
          uaid = m["uaid"] as string
          s.ws.send(JSON.stringify({ messageType: "register", channelID }))
        }
        if (m["messageType"] === "register") {
          users[i] = { uaid, endpoint: m["pushEndpoint"] as string }
          resolve()
        }
      })
      s.ws.send(JSON.stringify({ messageType: "hello", use_webpush: true }))
    })
    s.ws.close()
  })
  // One stored message each.
  let stored = 0
  await pool(CLIENTS, 32, async (i) => {
    if ((await push(users[i]!.endpoint, randomBytes(128))) === 201) stored++
  })
  process.stdout.write(`  ${CLIENTS} users registered, ${stored} messages stored\n`)

  // The storm.
  const times: Array<number> = []
  let failed = 0
  const cpuBefore = cpuMs(pid)
  const began = performance.now()
  let hellos = 0
  let helloDone = 0
  const sockets: Array<WebSocket> = []
  await pool(CLIENTS, INFLIGHT, async (i) => {
    const t0 = performance.now()
    try {
      const s = await connect(deployment.wsUrl, i)
      sockets.push(s.ws)
      await new Promise<void>((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error("timeout")), TIMEOUT_MS)
        s.frames((m) => {
          if (m["messageType"] === "hello") {
            hellos++
            helloDone = performance.now()
          }
          if (m["messageType"] === "notification") {
            s.ws.send(JSON.stringify({ messageType: "ack", updates: [{ channelID: m["channelID"], version: m["version"] }] }))
            clearTimeout(timer)
            times.push(performance.now() - t0)
            resolve()
          }
        })
        s.ws.send(JSON.stringify({ messageType: "hello", uaid: users[i]!.uaid, use_webpush: true }))
      })
    } catch {
      failed++
    }
  })
  const seconds = (performance.now() - began) / 1000
  const cpu = cpuMs(pid) - cpuBefore
  for (const ws of sockets) ws.terminate()
  console.log(`reconnect storm, all-in-one on embedded dynalite: ${CLIENTS} clients with 1 stored message each, ${INFLIGHT} handshakes in flight`)
  console.log(`  all delivered in ${fmt(seconds, 2)} s; ${hellos} hellos answered in ${fmt((helloDone - began) / 1000, 2)} s (${fmt(hellos / ((helloDone - began) / 1000), 0)} hellos/s)`)
  console.log(`  connect → message: p50 ${fmt(quantile(times, 0.5), 0)} ms, p99 ${fmt(quantile(times, 0.99), 0)} ms, max ${fmt(Math.max(...times), 0)} ms; ${times.length} delivered, ${failed} failed or timed out`)
  console.log(`  server CPU ${fmt(cpu / 1000, 1)} s (${fmt((cpu * 1000) / CLIENTS, 0)} µs per reconnecting client)`)
} finally {
  agent.destroy()
  await deployment.stop()
}
