/**
 * Clients and load generator of `bench:delivery`, in one child process (one clock for both ends):
 * `node delivery-clients.ts autopush WS_URL K ROUTER_URL RESUMED` or `… bare WS_URL K ENDPOINT_BASE`
 * (ROUTER_URL may be several, comma-separated: the workers of one node, `bench:scaling`).
 *
 * Against a bare pipeline it opens K WebSockets; each says hello and takes the id of the reply
 * (`ENDPOINT_BASE/push/{id}`); then `{ ready, failed }`. Against autopush, as Firefox's clients are:
 * first RESUMED of the K say hello and register one channel (no key: a v1 endpoint), then
 * `{ registered, failed }`; the parent may restart the server, and after `{ cmd: "resume" }` those
 * clients close (if the server has not closed them), say hello again with their uaid, and the rest
 * say hello as new clients and register; then `{ ready, failed }` (a resumed client given another
 * uaid is a failure). Every notification is acked at once and its arrival time recorded.
 *
 * On `{ cmd: "warm", c }` it opens the next level's connections (2·c unmeasured POSTs). On
 * `{ cmd: "level", c, count, timeoutMs }` it POSTs `count` notifications round-robin over the K
 * endpoints, `c` at a time (`node:http`, keep-alive agent with `maxSockets = c`): BENCH_BYTES-byte bodies (256)
 * whose first 4 bytes are a sequence number (the rest random), `TTL: 60`,
 * `Content-Encoding: aes128gcm`, no VAPID; with BENCH_RATE (notifications/s) a level's POSTs start
 * on that schedule (open loop, still at most `c` at a time) instead of as soon as one is answered.
 * It answers with the level's figures once every accepted
 * notification has arrived (or the timeout passed). With `BENCH_DELIVERY_DUMP=DIR` it also writes
 * each level's raw times to `DIR/{mode}-c{c}-{first seq}.csv`.
 */
import { randomBytes, randomUUID } from "node:crypto"
import { writeFileSync } from "node:fs"
import { Agent, request } from "node:http"
import WebSocket from "ws"
import { deliveredSource, type Routes, routesOf } from "./trace.ts"

const [mode, wsUrl, kArg, base, resumedArg] = process.argv.slice(2) as [string, string, string, string, string | undefined]
const K = Number(kArg)
/**
 * Bare: where pushes go; autopush: the router port, whose `/__trace__` says how each message was
 * delivered — of a node with several workers, every worker's (a trace is on the worker that delivered).
 */
const endpointBase = base
const routerUrls = base.split(",")
/** Clients (the first targets) that resume a uaid; the others are new. */
const RESUMED = mode === "autopush" ? Number(resumedArg ?? 0) : 0
const HANDSHAKES_IN_FLIGHT = 100
/** Body size: BENCH_BYTES from the parent (`bench:delivery --bytes`), 256 by default. */
const BODY_BYTES = Number(process.env["BENCH_BYTES"] ?? 256)
/** POSTs per second a level starts (`bench:delivery --rate`); 0: each as soon as one of the `c` is answered. */
const RATE = Number(process.env["BENCH_RATE"] ?? 0)
/** A POST unanswered this long fails (BENCH_POST_TIMEOUT_MS: under valgrind a server takes far longer). */
const POST_TIMEOUT_MS = Number(process.env["BENCH_POST_TIMEOUT_MS"] ?? 10_000)

process.on("disconnect", () => process.exit(0))
process.on("SIGTERM", () => process.exit(0))

interface Target {
  readonly host: string
  readonly port: number
  readonly path: string
}

const targets: Array<Target> = []
let failed = 0
let opened = 0
/** Sockets to open in this phase; the uaid each resumed one says hello with. */
let toOpen = mode === "autopush" ? RESUMED : K
const resuming: Array<string | undefined> = []
const uaids: Array<string> = []
const sockets: Array<WebSocket> = []
const claimed = new WeakMap<WebSocket, string>()

/**
 * BENCH_ROUTE=router: push URLs with a query string, which the endpoint's plain fast path leaves to
 * the platform's router (the same handler behind it): the two paths measured against each other.
 */
const VIA_ROUTER = process.env["BENCH_ROUTE"] === "router"

const toTarget = (url: string): Target => {
  const u = new URL(url)
  return { host: u.hostname, port: Number(u.port), path: VIA_ROUTER && u.pathname.startsWith("/wpush/") ? `${u.pathname}?via=router` : u.pathname }
}

// ── receiving ──────────────────────────────────────────────────────────────────────────────────

interface Level {
  readonly base: number
  readonly count: number
  readonly received: Float64Array
  got: number
  onProgress: () => void
}
let level: Level | undefined
let duplicates = 0

function onFrame(this: WebSocket, data: WebSocket.RawData): void {
  const now = performance.now()
  const frame = JSON.parse(data.toString()) as Record<string, unknown>
  switch (frame["messageType"]) {
    case "notification": {
      this.send(JSON.stringify({ messageType: "ack", updates: [{ channelID: frame["channelID"], version: frame["version"] }] }))
      const seq = Buffer.from(frame["data"] as string, "base64url").readUInt32BE(0)
      const l = level
      if (l === undefined) return
      const i = seq - l.base
      if (i < 0 || i >= l.count) return
      if (l.received[i] !== 0) {
        duplicates++
        return
      }
      l.received[i] = now
      l.got++
      l.onProgress()
      return
    }
    case "hello": {
      const uaid = frame["uaid"] as string
      const claim = claimed.get(this)
      if (claim !== undefined) {
        // A resumed client: its target is the endpoint it registered before.
        if (uaid !== claim) failed++
        return identified()
      }
      if (mode === "autopush") {
        uaids.push(uaid)
        return void this.send(JSON.stringify({ messageType: "register", channelID: randomUUID() }))
      }
      targets.push(toTarget(`${endpointBase}/push/${uaid}`))
      return identified()
    }
    case "register":
      if (frame["status"] !== 200) {
        failed++
        return identified()
      }
      targets.push(toTarget(frame["pushEndpoint"] as string))
      return identified()
  }
}

let identifiedCount = 0
const identified = () => {
  identifiedCount++
  if (identifiedCount === toOpen) phaseDone()
  openOne()
}

/** The end of a phase: the first RESUMED registered (autopush), or everyone ready. */
let phaseDone = () => {
  if (mode === "autopush" && targets.length < K && opened === RESUMED && resuming.length === 0) {
    process.send?.({ registered: targets.length, failed })
  } else process.send?.({ ready: targets.length, failed })
}

const openOne = () => {
  if (opened >= toOpen) return
  const claim = resuming[opened]
  opened++
  const ws = new WebSocket(wsUrl, { perMessageDeflate: false })
  sockets.push(ws)
  if (claim !== undefined) claimed.set(ws, claim)
  ws.once("open", () => ws.send(JSON.stringify({ messageType: "hello", use_webpush: true, ...(claim === undefined ? {} : { uaid: claim }) })))
  ws.on("message", onFrame)
  ws.once("error", () => {
    failed++
    identified()
  })
}
const openPhase = () => {
  if (toOpen === 0) return phaseDone()
  for (let i = 0; i < HANDSHAKES_IN_FLIGHT; i++) openOne()
}
openPhase()

/** The resumed clients come back with their uaids (after closing, unless the server closed them), then the new ones. */
const resume = async () => {
  await Promise.all(sockets.map((ws) =>
    ws.readyState === ws.CLOSED ? undefined : new Promise<void>((resolve) => {
      ws.once("close", () => resolve())
      ws.close()
    })
  ))
  sockets.length = 0
  resuming.push(...uaids)
  resuming.length = K // the new clients: no uaid
  opened = 0
  identifiedCount = 0
  toOpen = K
  phaseDone = () => process.send?.({ ready: targets.length, failed })
  openPhase()
}

// ── sending ────────────────────────────────────────────────────────────────────────────────────

let nextSeq = 1
const template = randomBytes(BODY_BYTES)

/** Nearest-rank percentile of the non-zero values, in ms. */
const percentile = (sorted: Float64Array, p: number): number =>
  sorted.length === 0 ? Number.NaN : (sorted[Math.max(0, Math.ceil(p * sorted.length) - 1)] as number)

const latencies = (from: Float64Array, to: Float64Array): Float64Array => {
  const out: Array<number> = []
  for (let i = 0; i < from.length; i++) if (to[i] !== 0 && from[i] !== 0) out.push((to[i] as number) - (from[i] as number))
  return Float64Array.from(out).sort()
}

const f3 = (n: number) => n.toFixed(3)

/** One POST of sequence number `seq`: `onHead` gets the status and `Location` when they arrive; resolves once read. */
const post = (agent: Agent, seq: number, onHead: (status: number, location: string | undefined) => void): Promise<string> =>
  new Promise((resolve) => {
    const target = targets[seq % targets.length] as Target
    const body = Buffer.from(template)
    body.writeUInt32BE(seq, 0)
    const req = request({
      host: target.host,
      port: target.port,
      path: target.path,
      method: "POST",
      agent,
      headers: {
        ttl: "60",
        "content-encoding": "aes128gcm",
        "content-type": "application/octet-stream",
        "content-length": BODY_BYTES
      }
    }, (res) => {
      onHead(res.statusCode ?? 0, res.headers.location)
      res.resume()
      res.on("end", () => resolve(String(res.statusCode)))
      res.on("error", () => resolve("response error"))
    })
    req.setTimeout(POST_TIMEOUT_MS, () => req.destroy(new Error("timeout")))
    req.on("error", (e) => resolve(e.message === "timeout" ? "timeout" : "request error"))
    req.end(body)
  })

/** `send(i)` for i < `count`, `c` at a time. */
const postAll = async (c: number, count: number, send: (i: number) => Promise<void>, rate = 0) => {
  let next = 0
  const start = performance.now()
  const worker = async () => {
    while (next < count) {
      const i = next++
      // Paced: the i-th POST starts at its time, not earlier (later when all c are in flight).
      const wait = rate > 0 ? start + (i * 1000) / rate - performance.now() : 0
      if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait))
      await send(i)
    }
  }
  await Promise.all(Array.from({ length: c }, worker))
}

/** The keep-alive agent of the level about to run, warmed by `warm`. */
let warmed: { readonly c: number; readonly agent: Agent } | undefined

/**
 * Before a level (not measured): 2·c POSTs on the level's agent, so that the level starts with its
 * c keep-alive connections, and the server's connections to its peers, already open.
 */
const warm = async (c: number) => {
  warmed?.agent.destroy()
  const agent = new Agent({ keepAlive: true, maxSockets: c })
  warmed = { c, agent }
  const base = nextSeq
  nextSeq += 2 * c
  await postAll(c, 2 * c, (i) => post(agent, base + i, () => {}).then(() => {}))
  // Let the last of them be delivered and acked.
  await new Promise((resolve) => setTimeout(resolve, 100))
}

const runLevel = async (c: number, count: number, timeoutMs: number) => {
  const base = nextSeq
  nextSeq += count
  const sent = new Float64Array(count)
  const answered = new Float64Array(count)
  const received = new Float64Array(count)
  const statuses: Record<string, number> = {}
  const messageIds: Array<string | undefined> = new Array(count)
  lastLevel = { base, messageIds }
  let accepted = 0
  const agent = warmed?.c === c ? warmed.agent : new Agent({ keepAlive: true, maxSockets: c })
  warmed = undefined
  let allPosted = false
  let finish: () => void = () => {}
  const complete = new Promise<void>((resolve) => (finish = resolve))
  const l: Level = {
    base,
    count,
    received,
    got: 0,
    onProgress: () => {
      if (allPosted && l.got >= accepted) finish()
    }
  }
  level = l
  const cpuBefore = process.cpuUsage()
  const deadline = setTimeout(finish, timeoutMs)

  await postAll(c, count, async (i) => {
    sent[i] = performance.now()
    const status = await post(agent, base + i, (code, location) => {
      answered[i] = performance.now()
      if (code === 201) accepted++
      messageIds[i] = location?.slice(location.lastIndexOf("/") + 1)
    })
    statuses[status] = (statuses[status] ?? 0) + 1
  }, RATE)
  allPosted = true
  l.onProgress()
  await complete
  clearTimeout(deadline)
  level = undefined
  agent.destroy()
  const cpu = process.cpuUsage(cpuBefore)

  let first = Number.POSITIVE_INFINITY
  let last = 0
  for (let i = 0; i < count; i++) {
    if (sent[i] !== 0) first = Math.min(first, sent[i] as number)
    last = Math.max(last, answered[i] as number, received[i] as number)
  }
  const toAnswer = latencies(sent, answered)
  const toClient = latencies(sent, received)
  /** POST→client of one group's messages (autopush: resumed or new clients). */
  const ofGroup = (resumed: boolean) => {
    const mask = (times: Float64Array) => times.map((t, i) => ((base + i) % targets.length < RESUMED) === resumed ? t : 0)
    const sorted = latencies(mask(sent), mask(received))
    return { received: sorted.length, p50Client: percentile(sorted, 0.5), p99Client: percentile(sorted, 0.99) }
  }
  const dump = process.env["BENCH_DELIVERY_DUMP"]
  if (dump !== undefined) {
    // Raw per-notification times (ms since the level's first POST), for a closer look.
    const rows = Array.from(sent, (t, i) => `${base + i},${f3(t - first)},${f3(answered[i] as number - first)},${f3(received[i] as number - first)}`)
    writeFileSync(`${dump}/${mode}-c${c}-${base}.csv`, `seq,sent,answered,received\n${rows.join("\n")}\n`)
  }
  return {
    c,
    count,
    accepted,
    received: l.got,
    statuses,
    duplicates,
    wallMs: last - first,
    p50Answer: percentile(toAnswer, 0.5),
    p99Answer: percentile(toAnswer, 0.99),
    p50Client: percentile(toClient, 0.5),
    p99Client: percentile(toClient, 0.99),
    byGroup: { resumed: ofGroup(true), fresh: ofGroup(false) },
    clientCpuUs: cpu.user + cpu.system
  }
}

export type LevelResult = Awaited<ReturnType<typeof runLevel>>

/** The message ids of the last level (from each 201's `Location`), by index from `base`. */
let lastLevel: { readonly base: number; readonly messageIds: ReadonlyArray<string | undefined> } | undefined

export type DirectShare = { readonly resumed: Routes; readonly fresh: Routes }

/** `routesOf` over several workers: each message's source from the first worker that has its trace. */
const routesOnAny = async (messageIds: ReadonlyArray<string>, agent: Agent): Promise<Routes> => {
  const sourceOf = async (id: string) => {
    for (const url of routerUrls) {
      const source = await deliveredSource(url, id, agent)
      if (source !== undefined) return source
    }
    return undefined
  }
  const sources = await Promise.all(messageIds.map(sourceOf))
  const count = (s: string | undefined) => sources.filter((source) => source === s).length
  return { direct: count("direct"), stored: count("stored"), unknown: messageIds.length - count("direct") - count("stored") }
}

/**
 * How the last level's messages reached their clients, by group (resumed or new clients): for up
 * to `sample` messages of each, the connection node's `/__trace__` says `direct` or `stored`.
 */
const directShare = async (sample: number): Promise<DirectShare> => {
  const groups = { resumed: [] as Array<string>, fresh: [] as Array<string> }
  const level = lastLevel
  if (level !== undefined) {
    level.messageIds.forEach((id, i) => {
      if (id !== undefined) groups[(level.base + i) % targets.length < RESUMED ? "resumed" : "fresh"].push(id)
    })
  }
  const agent = new Agent({ keepAlive: true, maxSockets: 8 })
  const count = (ids: ReadonlyArray<string>): Promise<Routes> => {
    const step = Math.max(1, Math.floor(ids.length / sample))
    const sampled = ids.filter((_, i) => i % step === 0).slice(0, sample)
    return routerUrls.length === 1 ? routesOf(routerUrls[0] as string, sampled, agent) : routesOnAny(sampled, agent)
  }
  const share = { resumed: await count(groups.resumed), fresh: await count(groups.fresh) }
  agent.destroy()
  return share
}

process.on("message", (m) => {
  const message = m as { cmd?: string; c?: number; count?: number; timeoutMs?: number }
  if (message.cmd === "warm") void warm(message.c ?? 1).then(() => process.send?.({ warmed: true }))
  if (message.cmd === "resume") void resume()
  if (message.cmd === "share") void directShare(message.count ?? 200).then((share) => process.send?.({ share }))
  if (message.cmd === "level") {
    void runLevel(message.c ?? 1, message.count ?? 1, message.timeoutMs ?? 60_000).then((result) => process.send?.({ level: result }))
  }
})
