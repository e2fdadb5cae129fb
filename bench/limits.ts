/**
 * `npm run bench:limits`: hostile clients against the real all-in-one process (`npm start`'s,
 * embedded storage on disk), measured from outside through /proc.
 *
 * channels  one connection registers N channels back to back (the per-client command budget and
 *           max_channels_per_user lifted, so storage cost is what is measured): total time, the
 *           server's CPU per register over the first and the last 500, and meanwhile the register
 *           round trip of P other clients (p50/p99).
 * slow      I idle connections plus S clients that never read, while M bytes are pushed at one of
 *           them through the public API; meanwhile Q probe clients get a push every 100 ms each:
 *           their POST→notification latency p50/p99, and the server's RSS before/peak/after. Run
 *           twice in one invocation: with the non-readers, and without them (M then goes to a client
 *           that reads), so the two are comparable.
 *
 * Options (flag or environment): --parts/BENCH_PARTS (channels,slow), --channels/BENCH_CHANNELS
 * (10000), --others/BENCH_OTHERS (20), --idle/BENCH_IDLE (5000), --slow/BENCH_SLOW (200),
 * --megabytes/BENCH_MEGABYTES (12), --probes/BENCH_PROBES (50).
 */
import { randomBytes, randomUUID } from "node:crypto"
import { setTimeout as sleep } from "node:timers/promises"
import { agent, cpuMs, fmt, hello, idleSockets, option, push, quantile, register, rssMiB, start } from "./harness.ts"

const PARTS = option("parts", "BENCH_PARTS", "channels,slow").split(",")
const CHANNELS = Number(option("channels", "BENCH_CHANNELS", "10000"))
const OTHERS = Number(option("others", "BENCH_OTHERS", "20"))
const IDLE = Number(option("idle", "BENCH_IDLE", "5000"))
const SLOW = Number(option("slow", "BENCH_SLOW", "200"))
const MEGABYTES = Number(option("megabytes", "BENCH_MEGABYTES", "12"))
const PROBES = Number(option("probes", "BENCH_PROBES", "50"))

// ── channels ─────────────────────────────────────────────────────────────────────────────────────

const channels = async () => {
  const { deployment, pid } = await start([
    "--max-channels-per-user", String(CHANNELS),
    "--client-commands-per-second", "1000000",
    "--client-command-burst", "1000000"
  ])
  try {
    const heavy = await hello(deployment.wsUrl)
    const others = await Promise.all(Array.from({ length: OTHERS }, () => hello(deployment.wsUrl)))
    let done = false
    const rtts: Array<number> = []
    // Each other client registers and unregisters in a loop, one at a time, while the heavy one works.
    const otherLoops = others.map(async (client) => {
      while (!done) {
        const began = performance.now()
        const channelID = randomUUID()
        client.send({ messageType: "register", channelID })
        await client.next((m) => m["messageType"] === "register", 30_000)
        rtts.push(performance.now() - began)
        client.send({ messageType: "unregister", channelID })
        await client.next((m) => m["messageType"] === "unregister", 30_000)
        await sleep(50)
      }
    })
    const window = Math.min(500, Math.floor(CHANNELS / 2))
    const began = performance.now()
    let cpuFirst = 0
    let cpuLast = 0
    let cpuMark = cpuMs(pid)
    for (let i = 1; i <= CHANNELS; i++) {
      await register(heavy)
      if (i === window) cpuFirst = cpuMs(pid) - cpuMark
      if (i === CHANNELS - window) cpuMark = cpuMs(pid)
      if (i % 2000 === 0) process.stdout.write(`  ${i} channels, ${fmt((performance.now() - began) / 1000)} s\n`)
    }
    cpuLast = cpuMs(pid) - cpuMark
    const seconds = (performance.now() - began) / 1000
    done = true
    await Promise.all(otherLoops)
    // One more register beyond the limit: refused with the documented status.
    heavy.send({ messageType: "register", channelID: randomUUID() })
    const refused = await heavy.next((m) => m["messageType"] === "register", 30_000)
    console.log(`channels: ${CHANNELS} registers on one connection in ${fmt(seconds)} s (${fmt(CHANNELS / seconds, 0)}/s)`)
    console.log(`  server CPU per register (whole process, incl. embedded storage): first ${window} ${fmt(cpuFirst / window, 2)} ms, last ${window} ${fmt(cpuLast / window, 2)} ms`)
    console.log(`  ${OTHERS} other clients meanwhile: ${rtts.length} register round trips, p50 ${fmt(quantile(rtts, 0.5))} ms, p99 ${fmt(quantile(rtts, 0.99))} ms, max ${fmt(Math.max(...rtts))} ms`)
    console.log(`  register ${CHANNELS + 1}: status ${refused["status"]}`)
    await Promise.all([heavy, ...others].map((c) => c.close()))
  } finally {
    await deployment.stop()
  }
}

// ── slow clients ─────────────────────────────────────────────────────────────────────────────────

const slowRun = async (withNonReaders: boolean) => {
  const { deployment, pid } = await start(["--msg-limit", "1000000"])
  try {
    const idle = await idleSockets(deployment.wsUrl, IDLE)
    // The non-readers: registered, then their sockets stop reading.
    const nonReaders = await Promise.all(Array.from({ length: withNonReaders ? SLOW : 1 }, async () => {
      const client = await hello(deployment.wsUrl)
      const endpoint = await register(client)
      if (withNonReaders) client.ws.pause()
      else {
        // The reader acks what it gets, as a browser does.
        client.ws.on("message", (data) => {
          const m = JSON.parse(data.toString()) as Record<string, unknown>
          if (m["messageType"] === "notification") client.send({ messageType: "ack", updates: [{ channelID: m["channelID"], version: m["version"] }] })
        })
      }
      return { client, endpoint }
    }))
    const probes = await Promise.all(Array.from({ length: PROBES }, async () => {
      const client = await hello(deployment.wsUrl)
      return { client, endpoint: await register(client) }
    }))
    await sleep(1_000)
    const rssBefore = rssMiB(pid)
    let rssPeak = rssBefore
    const sampler = setInterval(() => {
      rssPeak = Math.max(rssPeak, rssMiB(pid))
    }, 100)

    // The probes: a push each every 100 ms, its latency measured to the notification, then acked.
    let storming = true
    const latencies: Array<number> = []
    const probeLoops = probes.map(async ({ client, endpoint }) => {
      await sleep(Math.random() * 100)
      while (storming) {
        const began = performance.now()
        const { status } = await push(endpoint, randomBytes(200))
        if (status === 201) {
          const n = await client.next((m) => m["messageType"] === "notification", 30_000)
          latencies.push(performance.now() - began)
          client.send({ messageType: "ack", updates: [{ channelID: n["channelID"], version: n["version"] }] })
        }
        await sleep(100)
      }
    })
    // The storm: M bytes in 4 KiB bodies at one non-reader (or, without them, at a reader).
    const target = nonReaders[0]!
    const bodies = Math.ceil((MEGABYTES * 1024 * 1024) / 4096)
    const statuses = new Map<number, number>()
    let sent = 0
    const began = performance.now()
    await Promise.all(Array.from({ length: 16 }, async () => {
      while (sent < bodies) {
        sent++
        const { status } = await push(target.endpoint, randomBytes(4096))
        statuses.set(status, (statuses.get(status) ?? 0) + 1)
      }
    }))
    const stormSeconds = (performance.now() - began) / 1000
    await sleep(2_000)
    storming = false
    await Promise.all(probeLoops)
    clearInterval(sampler)
    for (const { client } of nonReaders) client.ws.terminate()
    await sleep(3_000)
    const rssAfter = rssMiB(pid)
    const label = withNonReaders ? `with ${SLOW} non-readers` : "without non-readers"
    console.log(`slow clients, ${label}: ${IDLE} idle, ${PROBES} probes; ${MEGABYTES} MB (${bodies} × 4 KiB) pushed in ${fmt(stormSeconds)} s, answers ${JSON.stringify(Object.fromEntries(statuses))}`)
    console.log(`  probe delivery latency: ${latencies.length} pushes, p50 ${fmt(quantile(latencies, 0.5))} ms, p99 ${fmt(quantile(latencies, 0.99))} ms`)
    console.log(`  server RSS: before ${fmt(rssBefore)} MiB, peak ${fmt(rssPeak)} MiB, after ${fmt(rssAfter)} MiB`)
    for (const ws of idle) ws.terminate()
    for (const { client } of probes) client.ws.terminate()
  } finally {
    await deployment.stop()
  }
}

if (PARTS.includes("channels")) await channels()
if (PARTS.includes("slow")) {
  await slowRun(true)
  await slowRun(false)
}
agent.destroy()
