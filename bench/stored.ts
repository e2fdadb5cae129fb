/**
 * `npm run bench:stored`: stored delivery, ours against a bare baseline in the same run, one after
 * the other, each server in its own process and the clients in this one.
 *
 * - ours: the real all-in-one process on its embedded storage (the SQLite database; with
 *   --data-dir a data directory of your choice, e.g. one holding an earlier version's dynalite
 *   data), or with --db-dsn on that PostgreSQL (`db_dsn`), in a schema of its own dropped after. A
 *   client registers and goes away; N messages are pushed to it through the public API (stored);
 * - bare: plain `node:http` + `ws` on the same store as ours by default: `stored-sqlite-server.ts`,
 *   one `node:sqlite` file in WAL mode as ours, one INSERT per message; with `--bare dynalite`,
 *   `stored-servers.ts` on embedded dynalite on a worker thread (for ours on dynalite data), one
 *   PutItem per message; with --db-dsn (or `--bare postgres`, which needs it),
 *   `stored-postgres-server.ts` on that PostgreSQL in a schema of its own, one INSERT per message.
 *   The user's router record is written directly, and the N messages are POSTed to it;
 *
 * then the client connects again and acks each message as it comes, as Firefox does. Printed: one
 * table of the store rate and the drain rate from hello to the last ack, each with the server's CPU
 * per message (user + system from /proc, worker threads included: dynalite's, or SQLite's
 * checkpoints; not PostgreSQL's, which runs in processes of its own), ours / bare, and the storage
 * operations per message in each phase (ours: its storage operations, from the `storage.time`
 * counts of its /metrics; bare: the statements or requests it made; draining counts the 1 s of quiet
 * after the last ack, when the last page is deleted), and the target (ours drains ≥ 2,000 msg/s);
 * then the store phase's CPU per message by thread (main, the storage thread, I/O threads, V8's
 * helpers), which shows what bounds the store rate.
 *
 * Options (flag or environment): --messages/BENCH_MESSAGES (10000), --bytes/BENCH_BYTES (256),
 * --only/BENCH_ONLY (ours or bare; both by default), --data-dir/BENCH_DATA_DIR (ours: data_dir; a fresh one by default),
 * --db-dsn/BENCH_DB_DSN (postgres://…: ours on it, and bare unless --bare says otherwise),
 * --bare/BENCH_BARE (sqlite, the default without --db-dsn; dynalite; postgres, the default with it).
 */
import { randomBytes, randomUUID } from "node:crypto"
import { generateFernetKey } from "../src/crypto/fernet.ts"
import { openClient } from "../test/connection/client.ts"
import { postgresSchema } from "../test/e2e/servers.ts"
import { cpuMeter, fmt, hello, measurePipelines, option, printComparison, push, register, start, startBare, threadMeter } from "./harness.ts"
import { scrape } from "./storm-node.ts"
import { ROUTER_TABLE, storageClient, userItem } from "./stored-tables.ts"

const MESSAGES = Number(option("messages", "BENCH_MESSAGES", "10000"))
const BYTES = Number(option("bytes", "BENCH_BYTES", "256"))
const DATA_DIR = option("data-dir", "BENCH_DATA_DIR", "")
const DB_DSN = option("db-dsn", "BENCH_DB_DSN", "")
const BARE_STORE = option("bare", "BENCH_BARE", DB_DSN === "" ? "sqlite" : "postgres")
if (BARE_STORE !== "sqlite" && BARE_STORE !== "dynalite" && BARE_STORE !== "postgres") throw new Error(`--bare: sqlite, dynalite or postgres, not ${BARE_STORE}`)
if (BARE_STORE === "postgres" && DB_DSN === "") throw new Error("--bare postgres needs --db-dsn postgres://…")
if (DB_DSN !== "" && DATA_DIR !== "") throw new Error("--db-dsn and --data-dir: ours runs on one store, not both")
const TARGET = 2000

interface Server {
  readonly pid: number
  readonly wsUrl: string
  /** A user with one channel, offline: its uaid and its push endpoint. */
  readonly subscribe: () => Promise<{ readonly uaid: string; readonly endpoint: string }>
  /** Storage operations made so far (a running count). */
  readonly storageOperations: () => Promise<number>
  readonly stop: () => Promise<void>
}

/** The statements or requests a bare server made so far, of every kind (its `GET /statements`). */
const bareStatements = async (httpUrl: string): Promise<number> =>
  Object.values(await (await fetch(`${httpUrl}/statements`)).json() as Record<string, number>).reduce((sum, n) => sum + n, 0)

const ours = async (): Promise<Server> => {
  const postgres = DB_DSN === "" ? undefined : await postgresSchema(DB_DSN, "bench_ours")
  const store = postgres === undefined
    ? (DATA_DIR === "" ? [] : ["--data-dir", DATA_DIR])
    // Keys: with no data directory, none is generated and kept for it.
    : ["--db-dsn", postgres.dsn, "--crypto-key", generateFernetKey(), "--auth-keys", generateFernetKey()]
  // N messages to one subscription: its own limits lifted, so that every push is taken.
  const { deployment, pid } = await start(["--msg-limit", String(MESSAGES * 2), "--max-stored-per-subscription", String(MESSAGES * 2), "--rate-limit-per-subscription", "0", ...store])
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
    storageOperations: async () => {
      let operations = 0
      for (const [key, value] of await scrape(`${deployment.routerUrl}/metrics`)) {
        if (key.startsWith("storage_time_milliseconds_count{")) operations += value
      }
      return operations
    },
    stop: async () => {
      await deployment.stop()
      await postgres?.drop()
    }
  }
}

/** The bare server on SQL: `stored-sqlite-server.ts` on a fresh data directory, or `stored-postgres-server.ts` in a schema of its own. */
const bareOnSql = async (): Promise<Server> => {
  const postgres = BARE_STORE === "postgres" ? await postgresSchema(DB_DSN, "bench_bare") : undefined
  const server = postgres === undefined ? await startBare("./stored-sqlite-server.ts") : await startBare("./stored-postgres-server.ts", postgres.dsn)
  return {
    pid: server.pid,
    wsUrl: server.wsUrl,
    subscribe: async () => {
      const uaid = randomUUID().replaceAll("-", "")
      const res = await fetch(`${server.httpUrl}/user/${uaid}`, { method: "PUT" })
      if (res.status !== 204) throw new Error(`the bare server answered ${res.status} to the user's record`)
      return { uaid, endpoint: `${server.httpUrl}/push/${uaid}/${randomUUID()}` }
    },
    storageOperations: () => bareStatements(server.httpUrl),
    stop: async () => {
      await server.stop()
      await postgres?.drop()
    }
  }
}

const bareOnDynalite = async (): Promise<Server> => {
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
    storageOperations: () => bareStatements(server.httpUrl),
    stop: server.stop
  }
}

/** The store phase's server CPU per message by thread group, per pipeline. */
const storeThreads = new Map<string, Record<string, number>>()

/**
 * Store N messages, then drain them: [store msg/s, store CPU µs/msg, of which the storage thread's,
 * storage operations per stored message, drain msg/s, drain CPU µs/msg, of which the storage
 * thread's, storage operations per drained message].
 */
const run = async (name: string, server: Server): Promise<Array<number>> => {
  const { uaid, endpoint } = await server.subscribe()

  const statuses = new Map<number, number>()
  let sent = 0
  let cpu = cpuMeter(server.pid)
  const threads = threadMeter(server.pid)
  const operationsBefore = await server.storageOperations()
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
  const operationsStored = await server.storageOperations()
  const operationsPerPush = (operationsStored - operationsBefore) / Math.max(1, stored)

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
  const operationsPerDrained = (await server.storageOperations() - operationsStored) / Math.max(1, delivered)
  console.log(`  ${name}: push answers ${JSON.stringify(Object.fromEntries(statuses))}; drained and acked ${delivered}; nothing more after: ${quiet}`)
  return [MESSAGES / storeSeconds, ...storeCpu, operationsPerPush, delivered / drainSeconds, ...drainCpu, operationsPerDrained]
}

const rows = await measurePipelines({ ours, bare: BARE_STORE === "dynalite" ? bareOnDynalite : bareOnSql }, run)
const bareStore = {
  sqlite: "SQLite (node:sqlite, WAL), one INSERT per message",
  dynalite: "embedded dynalite, one PutItem per message",
  postgres: "the same PostgreSQL in a schema of its own, one INSERT per message"
}[BARE_STORE]

printComparison(
  `stored delivery: ${MESSAGES} messages of ${BYTES} bytes stored for one offline client, then drained (each acked); ` +
    `ours on ${DB_DSN === "" ? "its embedded storage" : "PostgreSQL (db_dsn, a schema of its own)"}, bare on ${bareStore}` +
    `\n  (server CPU µs per message, user + system${DB_DSN === "" ? "" : ", PostgreSQL's own not counted"}; thread µs: its worker threads' part of it (dynalite; SQLite's checkpoints);` +
    " storage ops: per stored message, then per drained one; bare drains with a read and a delete per 25)",
  [
    { header: "store msg/s", digits: 0, ratio: true },
    { header: "CPU µs", digits: 0, ratio: true },
    { header: "thread µs", digits: 0, ratio: false },
    { header: "storage ops", digits: 2, ratio: true },
    { header: "drain msg/s", digits: 0, ratio: true },
    { header: "CPU µs", digits: 0, ratio: true },
    { header: "thread µs", digits: 0, ratio: false },
    { header: "storage ops", digits: 2, ratio: true }
  ],
  rows,
  `ours drains ≥ ${TARGET} msg/s`,
  (ours) => `${(ours[4] as number) >= TARGET ? "met" : "NOT met"} (${fmt(ours[4] as number, 0)} msg/s)`
)
console.log("  storing, server CPU µs per message by thread (main; storage thread: dynalite, or SQLite's checkpoints; I/O threads: libuv's pool; V8 helpers: GC, compiler):")
for (const [name, groups] of storeThreads) {
  console.log(`    ${name.padEnd(5)} ${Object.entries(groups).filter(([, us]) => us > 0).map(([group, us]) => `${group} ${fmt(us, 0)}`).join(", ")}`)
}
