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
 * senders  the server's CPU per push with the rate limits off (every rate_limit_* 0) and on (the
 *           defaults, behind a listed proxy: the loopback), in one invocation, and their ratio: N
 *           pushes signed by 10 senders, each with its own VAPID key, to 5 subscriptions bound to
 *           it (counted per key and per subscription), then N unsigned pushes to 50 subscriptions
 *           (per address and per subscription), 16 at a time, from 100 client addresses in
 *           `X-Forwarded-For`; every client connected and acking. No push is refused at these
 *           rates (each answer is checked). `--configs` lists the runs in order (off,on,off,on:
 *           interleaved, medians compared); `on` alone for a server of another checkout
 *           (`AUTOPUSH_SERVER_ROOT`) that may not know every option.
 *
 * Options (flag or environment): --parts/BENCH_PARTS (channels,slow,senders), --channels/BENCH_CHANNELS
 * (10000), --others/BENCH_OTHERS (20), --idle/BENCH_IDLE (5000), --slow/BENCH_SLOW (200),
 * --megabytes/BENCH_MEGABYTES (12), --probes/BENCH_PROBES (50), --pushes/BENCH_PUSHES (6000),
 * --configs/BENCH_CONFIGS (off,on).
 */
import { randomBytes, randomUUID } from "node:crypto"
import { request } from "node:http"
import { setTimeout as sleep } from "node:timers/promises"
import { exportJWK, generateKeyPair, SignJWT } from "jose"
import type { TestClient } from "../test/connection/client.ts"
import { agent, cpuMs, fmt, hello, idleSockets, option, push, quantile, register, rssMiB, start } from "./harness.ts"

const PARTS = option("parts", "BENCH_PARTS", "channels,slow,senders").split(",")
const CHANNELS = Number(option("channels", "BENCH_CHANNELS", "10000"))
const OTHERS = Number(option("others", "BENCH_OTHERS", "20"))
const IDLE = Number(option("idle", "BENCH_IDLE", "5000"))
const SLOW = Number(option("slow", "BENCH_SLOW", "200"))
const MEGABYTES = Number(option("megabytes", "BENCH_MEGABYTES", "12"))
const PROBES = Number(option("probes", "BENCH_PROBES", "50"))
const PUSHES = Number(option("pushes", "BENCH_PUSHES", "6000"))
const CONFIGS = option("configs", "BENCH_CONFIGS", "off,on").split(",")

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
  // The storm goes to one subscription: its own limit lifted, so that the pushes are taken.
  const { deployment, pid } = await start(["--msg-limit", "1000000", "--rate-limit-per-subscription", "0"])
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

// ── senders ──────────────────────────────────────────────────────────────────────────────────────

const LIMITS: Readonly<Record<string, ReadonlyArray<string>>> = {
  off: ["--rate-limit-per-address", "0", "--rate-limit-per-vapid-key", "0", "--rate-limit-per-subscription", "0"],
  on: ["--trusted-proxies", "127.0.0.1"]
}

/** A sender: a VAPID key, and the `Authorization` of one JWT it signed for `origin` (reused, as a sender may for 24 h). */
const senderFor = async (origin: string) => {
  const { privateKey, publicKey } = await generateKeyPair("ES256", { extractable: true })
  const jwk = await exportJWK(publicKey)
  const raw = Buffer.concat([Buffer.from([4]), Buffer.from(jwk.x ?? "", "base64url"), Buffer.from(jwk.y ?? "", "base64url")]).toString("base64url")
  const jwt = await new SignJWT({ aud: origin, exp: Math.floor(Date.now() / 1000) + 12 * 3600, sub: "mailto:bench@example.com" })
    .setProtectedHeader({ alg: "ES256", typ: "JWT" })
    .sign(privateKey)
  return { key: raw, authorization: `vapid t=${jwt}, k=${raw}` }
}

/** A client that acks what it gets, as a browser does. */
const acking = async (wsUrl: string): Promise<TestClient> => {
  const client = await hello(wsUrl)
  client.ws.on("message", (data) => {
    const m = JSON.parse(data.toString()) as Record<string, unknown>
    if (m["messageType"] === "notification") client.send({ messageType: "ack", updates: [{ channelID: m["channelID"], version: m["version"] }] })
  })
  return client
}

const registerBound = async (client: TestClient, key: string): Promise<string> => {
  client.send({ messageType: "register", channelID: randomUUID(), key })
  const reply = await client.next((m) => m["messageType"] === "register", 30_000)
  if (reply["status"] !== 200) throw new Error(`register answered ${JSON.stringify(reply)}`)
  return reply["pushEndpoint"] as string
}

const pushFrom = (endpoint: string, body: Buffer, headers: Readonly<Record<string, string>>): Promise<number> =>
  new Promise((resolve, reject) => {
    const req = request(endpoint, { method: "POST", agent, headers: { TTL: "600", "Content-Encoding": "aes128gcm", "Content-Length": body.length, ...headers } }, (res) => {
      res.resume()
      res.on("end", () => resolve(res.statusCode ?? 0))
    })
    req.on("error", reject)
    req.end(body)
  })

/** `count` pushes, 16 at a time, the i-th made by `target(i)`: the server's CPU ms per push, and the answers. */
const cpuPerPush = async (pid: number, count: number, target: (i: number) => readonly [string, Readonly<Record<string, string>>]) => {
  const statuses = new Map<number, number>()
  const body = randomBytes(200)
  let next = 0
  const before = cpuMs(pid)
  await Promise.all(Array.from({ length: 16 }, async () => {
    while (next < count) {
      const [endpoint, headers] = target(next++)
      const status = await pushFrom(endpoint, body, headers)
      statuses.set(status, (statuses.get(status) ?? 0) + 1)
    }
  }))
  await sleep(500) // the last deliveries and acks
  const perPush = (cpuMs(pid) - before) / count
  if (statuses.size !== 1 || !statuses.has(201)) throw new Error(`pushes answered ${JSON.stringify(Object.fromEntries(statuses))}`)
  return perPush
}

const sendersRun = async (config: string) => {
  const flags = LIMITS[config]
  if (flags === undefined) throw new Error(`--configs: off or on, not ${config}`)
  const { deployment, pid } = await start(flags)
  try {
    const origin = new URL(deployment.endpointUrl).origin
    const senders = await Promise.all(Array.from({ length: 10 }, () => senderFor(origin)))
    const clients: Array<TestClient> = []
    const bound: Array<readonly [string, string]> = []
    for (const sender of senders) {
      for (let i = 0; i < 5; i++) {
        const client = await acking(deployment.wsUrl)
        clients.push(client)
        bound.push([await registerBound(client, sender.key), sender.authorization])
      }
    }
    const unbound: Array<string> = []
    for (let i = 0; i < 50; i++) {
      const client = await acking(deployment.wsUrl)
      clients.push(client)
      unbound.push(await register(client))
    }
    const from = (i: number) => `198.51.100.${i % 100}`
    const signed = (i: number) => {
      const [endpoint, authorization] = bound[i % bound.length]!
      return [endpoint, { authorization, "x-forwarded-for": from(i) }] as const
    }
    const unsigned = (i: number) => [unbound[i % unbound.length]!, { "x-forwarded-for": from(i) }] as const
    // Warm: every module loaded and compiled, the router cache holding every client.
    await cpuPerPush(pid, 500, signed)
    await cpuPerPush(pid, 500, unsigned)
    const result = { signed: await cpuPerPush(pid, PUSHES, signed), unsigned: await cpuPerPush(pid, PUSHES, unsigned) }
    await Promise.all(clients.map((c) => c.close()))
    return result
  } finally {
    await deployment.stop()
  }
}

/** Each configuration run in turn, as often as `--configs` names it (e.g. off,on,off,on: runs interleaved, medians compared). */
const senders = async () => {
  const runs = new Map<string, Array<{ readonly signed: number; readonly unsigned: number }>>()
  for (const config of CONFIGS) {
    const run = await sendersRun(config)
    runs.set(config, [...(runs.get(config) ?? []), run])
  }
  console.log(`senders: server CPU per push (whole process), ${PUSHES} pushes of each kind, 16 at a time`)
  const medians = new Map<string, { readonly signed: number; readonly unsigned: number }>()
  for (const [config, list] of runs) {
    const median = { signed: quantile(list.map((r) => r.signed), 0.5), unsigned: quantile(list.map((r) => r.unsigned), 0.5) }
    medians.set(config, median)
    const each = (kind: "signed" | "unsigned") => list.map((r) => fmt(r[kind] * 1000, 0)).join(", ")
    console.log(`  limits ${config}: signed by a bound key ${fmt(median.signed * 1000, 0)} µs (runs: ${each("signed")}), unsigned ${fmt(median.unsigned * 1000, 0)} µs (runs: ${each("unsigned")})`)
  }
  const off = medians.get("off")
  const on = medians.get("on")
  if (off !== undefined && on !== undefined) {
    console.log(`  on / off: signed ${fmt(on.signed / off.signed, 3)}, unsigned ${fmt(on.unsigned / off.unsigned, 3)}`)
  }
}

if (PARTS.includes("channels")) await channels()
if (PARTS.includes("slow")) {
  await slowRun(true)
  await slowRun(false)
}
if (PARTS.includes("senders")) await senders()
agent.destroy()
