/**
 * `npm run bench:stored`: stored delivery, ours against a bare baseline in the same run, one after
 * the other, each server in its own process and the clients in this one.
 *
 * - ours: the real all-in-one process on its embedded storage (the SQLite database; with
 *   --data-dir a data directory of your choice, e.g. one holding an earlier version's dynalite
 *   data). A client registers and goes away; N messages are pushed to it through the public API
 *   (stored);
 * - bare: `stored-servers.ts`, plain `node:http` + `ws` on embedded dynalite on a worker thread
 *   (not SQLite: unless ours runs on dynalite data, the two are on different stores), the same
 *   tables: the user's router record is written directly, and the N messages are POSTed to it,
 *   each one PutItem;
 *
 * then the client connects again and acks each message as it comes, as Firefox does. Printed: one
 * table of the store rate and the drain rate from hello to the last ack, each with the server's CPU
 * per message (user + system from /proc, storage thread included), ours / bare, and the target
 * (ours drains ≥ 2,000 msg/s); then the store phase's CPU per message by thread (main, dynalite's
 * thread, its LevelDB I/O threads, V8's helpers), which shows what bounds the store rate.
 *
 * Options (flag or environment): --messages/BENCH_MESSAGES (10000), --bytes/BENCH_BYTES (256),
 * --only/BENCH_ONLY (ours or bare; both by default), --data-dir/BENCH_DATA_DIR (ours: data_dir; a fresh one by default).
 */
import { randomBytes, randomUUID } from "node:crypto"
import { openClient } from "../test/connection/client.ts"
import { cpuMeter, fmt, hello, measurePipelines, option, printComparison, push, register, start, startBare, threadMeter } from "./harness.ts"
import { ROUTER_TABLE, storageClient, userItem } from "./stored-tables.ts"

const MESSAGES = Number(option("messages", "BENCH_MESSAGES", "10000"))
const BYTES = Number(option("bytes", "BENCH_BYTES", "256"))
const DATA_DIR = option("data-dir", "BENCH_DATA_DIR", "")
const TARGET = 2000

interface Server {
  readonly pid: number
  readonly wsUrl: string
  /** A user with one channel, offline: its uaid and its push endpoint. */
  readonly subscribe: () => Promise<{ readonly uaid: string; readonly endpoint: string }>
  readonly stop: () => Promise<void>
}

const ours = async (): Promise<Server> => {
  const { deployment, pid } = await start(["--msg-limit", String(MESSAGES * 2), ...(DATA_DIR === "" ? [] : ["--data-dir", DATA_DIR])])
  return {
    pid,
    wsUrl: deployment.wsUrl,
    subscribe: async () => {
      const first = await hello(deployment.wsUrl)
      const uaid = first.received.find((m) => m["messageType"] === "hello")?.["uaid"] as string
      const endpoint = await register(first)
      await first.close()
      return { uaid, endpoint }
    },
    stop: deployment.stop
  }
}

const bare = async (): Promise<Server> => {
  const server = await startBare()
  return {
    pid: server.pid,
    wsUrl: server.wsUrl,
    subscribe: async () => {
      const uaid = randomUUID().replaceAll("-", "")
      const storage = await storageClient(server.dynamoUrl)
      await storage.send("PutItem", { TableName: ROUTER_TABLE, Item: userItem(uaid, Date.now()) })
      storage.destroy()
      return { uaid, endpoint: `${server.httpUrl}/push/${uaid}/${randomUUID()}` }
    },
    stop: server.stop
  }
}

/** The store phase's server CPU per message by thread group, per pipeline. */
const storeThreads = new Map<string, Record<string, number>>()

/**
 * Store N messages, then drain them: [store msg/s, store CPU µs/msg, of which the storage thread's,
 * drain msg/s, drain CPU µs/msg, of which the storage thread's].
 */
const run = async (name: string, server: Server): Promise<Array<number>> => {
  const { uaid, endpoint } = await server.subscribe()

  const statuses = new Map<number, number>()
  let sent = 0
  let cpu = cpuMeter(server.pid)
  const threads = threadMeter(server.pid)
  let began = performance.now()
  await Promise.all(Array.from({ length: 32 }, async () => {
    while (sent < MESSAGES) {
      sent++
      const { status } = await push(endpoint, randomBytes(BYTES))
      statuses.set(status, (statuses.get(status) ?? 0) + 1)
    }
  }))
  const storeSeconds = (performance.now() - began) / 1000
  const storeCpu = cpu(MESSAGES)
  storeThreads.set(name, threads(MESSAGES))
  const stored = statuses.get(201) ?? 0

  const client = await openClient(server.wsUrl)
  cpu = cpuMeter(server.pid)
  began = performance.now()
  client.send({ messageType: "hello", uaid, use_webpush: true })
  let delivered = 0
  while (delivered < stored) {
    const n = await client.next((m) => m["messageType"] === "notification", 30_000)
    client.send({ messageType: "ack", updates: [{ channelID: n["channelID"], version: n["version"] }] })
    delivered++
  }
  const drainSeconds = (performance.now() - began) / 1000
  const drainCpu = cpu(Math.max(1, delivered))
  const quiet = await client.quiet(1_000, (m) => m["messageType"] === "notification")
  await client.close()
  console.log(`  ${name}: push answers ${JSON.stringify(Object.fromEntries(statuses))}; drained and acked ${delivered}; nothing more after: ${quiet}`)
  return [MESSAGES / storeSeconds, ...storeCpu, delivered / drainSeconds, ...drainCpu]
}

const rows = await measurePipelines({ ours, bare }, run)

printComparison(
  `stored delivery: ${MESSAGES} messages of ${BYTES} bytes stored for one offline client, then drained (each acked); ours on its embedded storage, bare on embedded dynalite` +
    "\n  (server CPU µs per message, user + system; dynalite: its storage thread's part of it; bare stores with one PutItem" +
    " per message, drains with a Query and a BatchWriteItem per 25)",
  [
    { header: "store msg/s", digits: 0, ratio: true },
    { header: "CPU µs", digits: 0, ratio: true },
    { header: "dynalite µs", digits: 0, ratio: true },
    { header: "drain msg/s", digits: 0, ratio: true },
    { header: "CPU µs", digits: 0, ratio: true },
    { header: "dynalite µs", digits: 0, ratio: true }
  ],
  rows,
  `ours drains ≥ ${TARGET} msg/s`,
  (ours) => `${(ours[3] as number) >= TARGET ? "met" : "NOT met"} (${fmt(ours[3] as number, 0)} msg/s)`
)
console.log("  storing, server CPU µs per message by thread (main; storage thread: dynalite; I/O threads: its LevelDB; V8 helpers: GC, compiler):")
for (const [name, groups] of storeThreads) {
  console.log(`    ${name.padEnd(5)} ${Object.entries(groups).filter(([, us]) => us > 0).map(([group, us]) => `${group} ${fmt(us, 0)}`).join(", ")}`)
}
