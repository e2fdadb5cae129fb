/**
 * `npm run bench:receipts`: what a push receipt costs. The all-in-one service as `npm start` builds it
 * (settings defaults, the router cache on), over in-memory storage whose every operation is counted
 * (each is one DynamoDB request on a real store: no operation here pages or retries), with K clients
 * that ack what they get. For pushes without and with `Push-Receipt`, to connected clients and to
 * clients that are offline and come back: storage requests per push by operation, and pushes/s (c
 * in flight), in the same run. Collecting the receipts (JSON `GET`s) is counted on its own.
 *
 * Offline clients get 3 pushes each while away: the first is routed on the record of their last
 * session, the next ones on the record the first read (what the router cache saves).
 *
 * Options (flag or environment): --clients/BENCH_CLIENTS (500), --concurrency/BENCH_CONCURRENCY (10).
 */
import { Effect, Layer } from "effect"
import WebSocket from "ws"
import { allInOneLayer, withServices } from "../src/bin/app.ts"
import { loggingLayer } from "../src/observability/logging.ts"
import { layerMemory } from "../src/storage/memory/layer.ts"
import { createActiveTables, mapStorageOperations, Storage } from "../src/storage/Storage.ts"
import { freePorts } from "../test/e2e/servers.ts"
import { option } from "./harness.ts"
import { allInOneSettings, HOST } from "./settings.ts"

const CLIENTS = Number(option("clients", "BENCH_CLIENTS", "500"))
const CONCURRENCY = Number(option("concurrency", "BENCH_CONCURRENCY", "10"))

// ── the service, its storage counted ────────────────────────────────────────────────────────────

const counts = new Map<string, number>()
const [wsPort, routerPort, endpointPort] = (await freePorts(3)) as [number, number, number]
const settings = allInOneSettings(wsPort, routerPort, endpointPort)
const counted = Layer.effect(
  Storage,
  Effect.map(Effect.service(Storage), (inner) =>
    mapStorageOperations(inner, (name) => (operation) =>
      Effect.andThen(Effect.sync(() => void counts.set(name, (counts.get(name) ?? 0) + 1)), operation), { values: false }))
).pipe(
  Layer.provideMerge(Layer.effectDiscard(createActiveTables)),
  Layer.provide(layerMemory({ routerTable: settings.routerTablename, messageTablePrefix: settings.messageTablename, noTableRotation: settings.noTableRotation }))
)
const app = withServices("autopush", settings, counted)(allInOneLayer(settings))
await new Promise<void>((resolve, reject) =>
  Effect.runFork(
    Effect.scoped(Effect.andThen(Layer.build(app), Effect.andThen(Effect.sync(resolve), Effect.never))).pipe(
      Effect.provide(loggingLayer({ human: false, level: "error", role: "autopush", hostname: HOST })),
      Effect.tapCause((cause) => Effect.sync(() => reject(cause)))
    )
  ))
const endpointUrl = `http://${HOST}:${endpointPort}`

// ── clients that ack ────────────────────────────────────────────────────────────────────────────

interface Client {
  readonly uaid: string
  readonly endpoint: string
  readonly socket: WebSocket
}

let acked = 0
const open = (uaid?: string, channelID?: string) =>
  new Promise<{ socket: WebSocket; uaid: string; endpoint: string }>((resolve, reject) => {
    const socket = new WebSocket(`ws://${HOST}:${wsPort}/`)
    let me = uaid ?? ""
    socket.on("error", reject)
    socket.on("open", () => socket.send(JSON.stringify({ messageType: "hello", use_webpush: true, ...(uaid === undefined ? {} : { uaid }) })))
    socket.on("message", (data) => {
      const frame = JSON.parse(String(data)) as Record<string, unknown>
      if (frame["messageType"] === "hello") {
        me = frame["uaid"] as string
        if (channelID === undefined) socket.send(JSON.stringify({ messageType: "register", channelID: crypto.randomUUID() }))
        else resolve({ socket, uaid: me, endpoint: "" })
      } else if (frame["messageType"] === "register") resolve({ socket, uaid: me, endpoint: frame["pushEndpoint"] as string })
      else if (frame["messageType"] === "notification") {
        socket.send(JSON.stringify({ messageType: "ack", updates: [{ channelID: frame["channelID"], version: frame["version"], code: 100 }] }))
        acked++
      }
    })
  })

const closeAll = (clients: ReadonlyArray<Client>) =>
  Promise.all(clients.map((c) => new Promise<void>((resolve) => {
    c.socket.once("close", () => resolve())
    c.socket.close()
  })))

const clients: Array<Client> = []
for (let i = 0; i < CLIENTS; i += 50) {
  clients.push(...await Promise.all(Array.from({ length: Math.min(50, CLIENTS - i) }, () => open())))
}

const receiptSubscription = async (): Promise<string> => {
  const res = await fetch(`${endpointUrl}/receipts`, { method: "POST" })
  await res.arrayBuffer()
  return res.headers.get("location") as string
}

const pushAll = async (targets: ReadonlyArray<Client>, receipt: string | undefined): Promise<number> => {
  const started = performance.now()
  let next = 0
  await Promise.all(Array.from({ length: CONCURRENCY }, async () => {
    while (next < targets.length) {
      const target = targets[next++] as Client
      const res = await fetch(target.endpoint, {
        method: "POST",
        headers: { TTL: "3600", "Content-Encoding": "aes128gcm", ...(receipt === undefined ? {} : { "Push-Receipt": receipt }) },
        body: "x".repeat(256)
      })
      await res.arrayBuffer()
      if (res.status !== (receipt === undefined ? 201 : 202)) throw new Error(`push answered ${res.status}`)
    }
  }))
  return targets.length / ((performance.now() - started) / 1000)
}

const settle = async (until: () => boolean) => {
  for (let i = 0; i < 600 && !until(); i++) await new Promise((resolve) => setTimeout(resolve, 50))
  // What is written in the background (receipt statuses) lands.
  await new Promise((resolve) => setTimeout(resolve, 300))
}

/** Storage operations during `run`, per push (of `pushes`). */
const measure = async (run: () => Promise<number>, pushes = CLIENTS) => {
  counts.clear()
  const rate = await run()
  const perPush = [...counts].map(([op, n]) => [op, n / pushes] as const).sort(([a], [b]) => (a < b ? -1 : 1))
  return { rate, perPush, total: perPush.reduce((sum, [, n]) => sum + n, 0) }
}

const connected = (receipt: string | undefined) =>
  measure(async () => {
    const before = acked
    const rate = await pushAll(clients, receipt)
    await settle(() => acked - before >= CLIENTS)
    return rate
  })

/** Pushes per client while it is away: the first finds the record of its last session, the next ones the record the first read. */
const OFFLINE_PUSHES = 3

/**
 * Offline: every client leaves, `OFFLINE_PUSHES` pushes each are stored (measured), then every
 * client comes back, drains and acks (measured apart, per push).
 */
const offline = async (receipt: string | undefined) => {
  await closeAll(clients)
  const targets = clients.flatMap((c) => Array.from({ length: OFFLINE_PUSHES }, () => c))
  const stored = await measure(() => pushAll(targets, receipt), targets.length)
  const back = await measure(async () => {
    const before = acked
    const returned: Array<Client> = []
    for (let i = 0; i < clients.length; i += 50) {
      returned.push(...await Promise.all(clients.slice(i, i + 50).map(async (c) => ({ ...(await open(c.uaid, "resume")), endpoint: c.endpoint }))))
    }
    clients.splice(0, clients.length, ...returned)
    await settle(() => acked - before >= targets.length)
    return 0
  }, targets.length)
  return { stored, back }
}

/** Collect every receipt of a subscription with JSON GETs; how many came. */
const collect = async (subscription: string): Promise<Record<string, number>> => {
  const outcomes: Record<string, number> = {}
  for (;;) {
    const res = await fetch(subscription, { headers: { accept: "application/json", prefer: "wait=0" } })
    const { receipts } = (await res.json()) as { receipts: ReadonlyArray<{ outcome: string }> }
    if (receipts.length === 0) return outcomes
    for (const r of receipts) outcomes[r.outcome] = (outcomes[r.outcome] ?? 0) + 1
  }
}

type Measured = Awaited<ReturnType<typeof measure>>
const rows: Array<[string, Measured]> = []
await connected(undefined) // unmeasured: the router cache and the JIT warm
rows.push(["connected, no receipt", await connected(undefined)])
const sub1 = await receiptSubscription()
rows.push(["connected, receipt", await connected(sub1)])
await offline(undefined) // unmeasured: both measured rounds start from clients that came back
const plain = await offline(undefined)
const sub2 = await receiptSubscription()
const receipted = await offline(sub2)
rows.push(
  [`offline, no receipt: stored (${OFFLINE_PUSHES} per client)`, plain.stored],
  ["offline, no receipt: the client back, drained", plain.back],
  [`offline, receipt: stored (${OFFLINE_PUSHES} per client)`, receipted.stored],
  ["offline, receipt: the client back, drained", receipted.back]
)
counts.clear()
const outcomes = [await collect(sub1), await collect(sub2)]
const collectOps = [...counts].map(([op, n]) => `${op} ${n}`).join(", ")

console.log(`bench:receipts — ${CLIENTS} clients, c = ${CONCURRENCY}, all-in-one over counted in-memory storage`)
console.log("")
console.log("| pushes | storage requests / push | by operation | pushes/s |")
console.log("| --- | --- | --- | --- |")
for (const [name, r] of rows) {
  console.log(`| ${name} | ${r.total.toFixed(2)} | ${r.perPush.map(([op, n]) => `${op} ${n.toFixed(2)}`).join(", ")} | ${r.rate > 0 ? r.rate.toFixed(0) : "—"} |`)
}
const [cn, cr] = [rows[0]?.[1], rows[1]?.[1]] as [Measured, Measured]
const extraOffline = receipted.stored.total + receipted.back.total - plain.stored.total - plain.back.total
console.log("")
console.log(`extra storage requests per push with a receipt: connected ${(cr.total - cn.total).toFixed(2)}, offline ${extraOffline.toFixed(2)}`)
console.log(`pushes/s with a receipt / without: connected ${(cr.rate / cn.rate).toFixed(2)}, offline ${(receipted.stored.rate / plain.stored.rate).toFixed(2)}`)
console.log(`receipts collected: ${JSON.stringify(outcomes)}; collecting them took ${collectOps}`)
process.exit(0)
