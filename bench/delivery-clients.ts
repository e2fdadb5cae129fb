/**
 * Clients and load generator of `bench:delivery`, in one child process (one clock for both ends):
 * `node delivery-clients.ts autopush|bare WS_URL K [ENDPOINT_BASE]`.
 *
 * Opens K WebSockets; each says hello and then, against autopush, registers one channel (no key:
 * a v1 endpoint), against a bare pipeline takes the id of the hello reply (`ENDPOINT_BASE/push/{id}`).
 * Reports `{ ready, failed }`. Every notification is acked at once and its arrival time recorded.
 *
 * On `{ cmd: "warm", c }` it opens the next level's connections (2·c unmeasured POSTs). On
 * `{ cmd: "level", c, count, timeoutMs }` it POSTs `count` notifications round-robin over the K
 * endpoints, `c` at a time (`node:http`, keep-alive agent with `maxSockets = c`): BENCH_BYTES-byte bodies (256)
 * whose first 4 bytes are a sequence number (the rest random), `TTL: 60`,
 * `Content-Encoding: aes128gcm`, no VAPID. It answers with the level's figures once every accepted
 * notification has arrived (or the timeout passed). With `BENCH_DELIVERY_DUMP=DIR` it also writes
 * each level's raw times to `DIR/{mode}-c{c}-{first seq}.csv`.
 */
import { randomBytes, randomUUID } from "node:crypto"
import { writeFileSync } from "node:fs"
import { Agent, request } from "node:http"
import WebSocket from "ws"

const [mode, wsUrl, kArg, endpointBase] = process.argv.slice(2) as [string, string, string, string | undefined]
const K = Number(kArg)
const HANDSHAKES_IN_FLIGHT = 100
/** Body size: BENCH_BYTES from the parent (`bench:delivery --bytes`), 256 by default. */
const BODY_BYTES = Number(process.env["BENCH_BYTES"] ?? 256)
const POST_TIMEOUT_MS = 10_000

process.on("disconnect", () => process.exit(0))
process.on("SIGTERM", () => process.exit(0))

interface Target {
  readonly host: string
  readonly port: number
  readonly path: string
}

const targets: Array<Target> = []
const sockets: Array<WebSocket> = []
let failed = 0
let opened = 0

const toTarget = (url: string): Target => {
  const u = new URL(url)
  return { host: u.hostname, port: Number(u.port), path: u.pathname }
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
    case "hello":
      if (mode === "autopush") return void this.send(JSON.stringify({ messageType: "register", channelID: randomUUID() }))
      targets.push(toTarget(`${endpointBase}/push/${frame["uaid"] as string}`))
      return identified()
    case "register":
      if (frame["status"] !== 200) {
        failed++
        return identified()
      }
      targets.push(toTarget(frame["pushEndpoint"] as string))
      return identified()
  }
}

const identified = () => {
  if (targets.length + failed === K) process.send?.({ ready: targets.length, failed })
  openOne()
}

const openOne = () => {
  if (opened >= K) return
  opened++
  const ws = new WebSocket(wsUrl, { perMessageDeflate: false })
  sockets.push(ws)
  ws.once("open", () => ws.send(JSON.stringify({ messageType: "hello", use_webpush: true })))
  ws.on("message", onFrame)
  ws.once("error", () => {
    failed++
    if (targets.length + failed === K) process.send?.({ ready: targets.length, failed })
    openOne()
  })
}
for (let i = 0; i < HANDSHAKES_IN_FLIGHT; i++) openOne()

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

/** One POST of sequence number `seq`: `onHead` gets the status when it arrives; resolves once read. */
const post = (agent: Agent, seq: number, onHead: (status: number) => void): Promise<string> =>
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
      onHead(res.statusCode ?? 0)
      res.resume()
      res.on("end", () => resolve(String(res.statusCode)))
      res.on("error", () => resolve("response error"))
    })
    req.setTimeout(POST_TIMEOUT_MS, () => req.destroy(new Error("timeout")))
    req.on("error", (e) => resolve(e.message === "timeout" ? "timeout" : "request error"))
    req.end(body)
  })

/** `send(i)` for i < `count`, `c` at a time. */
const postAll = async (c: number, count: number, send: (i: number) => Promise<void>) => {
  let next = 0
  const worker = async () => {
    while (next < count) await send(next++)
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
    const status = await post(agent, base + i, (code) => {
      answered[i] = performance.now()
      if (code === 201) accepted++
    })
    statuses[status] = (statuses[status] ?? 0) + 1
  })
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
    clientCpuUs: cpu.user + cpu.system
  }
}

export type LevelResult = Awaited<ReturnType<typeof runLevel>>

process.on("message", (m) => {
  const message = m as { cmd?: string; c?: number; count?: number; timeoutMs?: number }
  if (message.cmd === "warm") void warm(message.c ?? 1).then(() => process.send?.({ warmed: true }))
  if (message.cmd === "level") {
    void runLevel(message.c ?? 1, message.count ?? 1, message.timeoutMs ?? 60_000).then((result) => process.send?.({ level: result }))
  }
})
