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
 * With --db-dsn/BENCH_DB_DSN (postgres://…), both on that PostgreSQL, each in a schema of its own
 * (dropped after): ours is the all-in-one on it (`db_dsn`); bare is `stored-postgres-server.ts`,
 * one plain INSERT per push, a SELECT and a DELETE per page of 25 to drain. Printed too: ours'
 * storage operations per message in each phase (its `/metrics`); PostgreSQL's own CPU is in
 * neither server's figure.
 *
 * Options (flag or environment): --messages/BENCH_MESSAGES (10000), --bytes/BENCH_BYTES (256),
 * --only/BENCH_ONLY (ours or bare; both by default), --data-dir/BENCH_DATA_DIR (ours: data_dir; a fresh one by default),
 * --db-dsn/BENCH_DB_DSN (both on PostgreSQL).
 */
import { fork } from "node:child_process"
import { randomBytes, randomUUID } from "node:crypto"
import { once } from "node:events"
import pg from "pg"
import { generateFernetKey } from "../src/crypto/fernet.ts"
import { openClient } from "../test/connection/client.ts"
import { cpuMeter, fmt, hello, measurePipelines, option, printComparison, push, register, start, startBare, threadMeter } from "./harness.ts"
import { ROUTER_TABLE, storageClient, userItem } from "./stored-tables.ts"

const MESSAGES = Number(option("messages", "BENCH_MESSAGES", "10000"))
const BYTES = Number(option("bytes", "BENCH_BYTES", "256"))
const DATA_DIR = option("data-dir", "BENCH_DATA_DIR", "")
const DB_DSN = option("db-dsn", "BENCH_DB_DSN", "")
const TARGET = 2000

/** A schema of its own on the bench's PostgreSQL: a DSN into it, and how to drop it. */
const postgresSchema = async (name: string) => {
  const schema = `bench_${name}_${Date.now().toString(36)}`
  const statement = async (sql: string, values: Array<unknown> = [], dsn = DB_DSN) => {
    const client = new pg.Client({ connectionString: dsn })
    await client.connect()
    try {
      await client.query(sql, values)
    } finally {
      await client.end()
    }
  }
  await statement(`CREATE SCHEMA ${schema}`)
  const url = new URL(DB_DSN)
  url.searchParams.set("options", `-c search_path=${schema}`)
  return { dsn: url.href, statement, drop: () => statement(`DROP SCHEMA ${schema} CASCADE`) }
}

/** Storage operations a process has done so far (the counts of its `storage.time` timer, from its `/metrics`). */
const storageOperations = async (metricsUrl: string): Promise<number> => {
  const text = await (await fetch(`${metricsUrl}/metrics`)).text()
  return text.split("\n").filter((line) => /^storage_time\w*_count\{/.test(line)).reduce((sum, line) => sum + Number(line.split(" ").at(-1)), 0)
}

interface Server {
  readonly pid: number
  readonly wsUrl: string
  /** A user with one channel, offline: its uaid and its push endpoint. */
  readonly subscribe: () => Promise<{ readonly uaid: string; readonly endpoint: string }>
  /** Ours: storage operations so far. */
  readonly storageOperations?: () => Promise<number>
  readonly stop: () => Promise<void>
}

const ours = async (): Promise<Server> => {
  const postgres = DB_DSN === "" ? undefined : await postgresSchema("ours")
  const store = postgres === undefined
    ? (DATA_DIR === "" ? [] : ["--data-dir", DATA_DIR])
    : ["--db-dsn", postgres.dsn, "--crypto-key", generateFernetKey(), "--auth-keys", generateFernetKey()]
  const { deployment, pid } = await start(["--msg-limit", String(MESSAGES * 2), ...store])
  return {
    pid,
    wsUrl: deployment.wsUrl,
    storageOperations: () => storageOperations(deployment.routerUrl),
    subscribe: async () => {
      const first = await hello(deployment.wsUrl)
      const uaid = first.received.find((m) => m["messageType"] === "hello")?.["uaid"] as string
      const endpoint = await register(first)
      await first.close()
      return { uaid, endpoint }
    },
    stop: async () => {
      await deployment.stop()
      await postgres?.drop()
    }
  }
}

/** The bare pipeline on PostgreSQL (`stored-postgres-server.ts`). */
const barePostgres = async (): Promise<Server> => {
  const postgres = await postgresSchema("bare")
  const child = fork(new URL("./stored-postgres-server.ts", import.meta.url).pathname, [postgres.dsn], { stdio: ["ignore", "inherit", "inherit", "ipc"] })
  const [ports] = await Promise.race([
    once(child, "message") as Promise<[{ ws: number; http: number }]>,
    once(child, "exit").then(([code]) => Promise.reject(new Error(`the bare server exited (${code})`)))
  ])
  return {
    pid: child.pid as number,
    wsUrl: `ws://127.0.0.1:${ports.ws}/`,
    subscribe: async () => {
      const uaid = randomUUID().replaceAll("-", "")
      await postgres.statement(`INSERT INTO ${ROUTER_TABLE} (uaid, connected_at, router_type, router_data) VALUES ($1, $2, 'webpush', '{}')`, [uaid, Date.now()], postgres.dsn)
      return { uaid, endpoint: `http://127.0.0.1:${ports.http}/push/${uaid}/${randomUUID()}` }
    },
    stop: async () => {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill("SIGTERM")
        await once(child, "exit")
      }
      await postgres.drop()
    }
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

  const operations = server.storageOperations ?? (() => Promise.resolve(Number.NaN))
  const opsBefore = await operations()
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
  const opsStored = await operations()

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
  const opsDrained = await operations()
  console.log(`  ${name}: push answers ${JSON.stringify(Object.fromEntries(statuses))}; drained and acked ${delivered}; nothing more after: ${quiet}`)
  if (server.storageOperations !== undefined) {
    console.log(`  ${name}: storage operations per message: ${fmt((opsStored - opsBefore) / MESSAGES, 2)} storing, ${fmt((opsDrained - opsStored) / Math.max(1, delivered), 2)} draining (hello, reads, deletes; the 1 s quiet after included)`)
  }
  return [MESSAGES / storeSeconds, ...storeCpu, delivered / drainSeconds, ...drainCpu]
}

const rows = await measurePipelines({ ours, bare: DB_DSN === "" ? bare : barePostgres }, run)

printComparison(
  DB_DSN === ""
    ? `stored delivery: ${MESSAGES} messages of ${BYTES} bytes stored for one offline client, then drained (each acked); ours on its embedded storage, bare on embedded dynalite` +
      "\n  (server CPU µs per message, user + system; dynalite: its storage thread's part of it; bare stores with one PutItem" +
      " per message, drains with a Query and a BatchWriteItem per 25)"
    : `stored delivery on PostgreSQL: ${MESSAGES} messages of ${BYTES} bytes stored for one offline client, then drained (each acked); both on one server` +
      "\n  (server CPU µs per message, user + system, PostgreSQL's own not counted; the dynalite columns are the servers' other threads;" +
      " bare stores with one INSERT per message, drains with a SELECT and a DELETE per 25)",
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
