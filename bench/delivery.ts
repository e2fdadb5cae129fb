/**
 * `npm run bench:delivery`: notifications/s, POST→201 and POST→client latency, and server CPU per
 * notification, of autopush against bare pipelines in the same run (issue #4 item 8).
 *
 * (a) the all-in-one process (connection + endpoint layers as `npm start` builds them, in-memory
 *     storage) against a bare single-process pipeline (`node:http` POST → Map → `ws` send);
 * (b) the real entrypoints `src/bin/autoconnect.ts` and `src/bin/autoendpoint.ts` as separate
 *     processes sharing one store (--store): the SQLite database of one host (both nodes with
 *     `--embedded-storage` and one `data_dir`, as separate nodes of one machine run), PostgreSQL
 *     (`--db-dsn`, in a schema of its own, dropped after) or a dynalite server (LevelDB on disk);
 *     against a bare two-process pipeline (POST → HTTP PUT → `ws` send). The bare pipeline stores
 *     nothing: its clients are all connected, and autopush writes nothing either for a push to a
 *     connected client delivered directly (it reads the user's router record, and the channel
 *     when its endpoint has not seen it); so the bare pipeline is the same whatever the store.
 *     Storage operations per push: DynamoDB requests counted at dynalite by `X-Amz-Target`; SQL
 *     statements counted in the nodes by their first word (`delivery-statements.ts`, preloaded:
 *     every `node:sqlite` statement and `pg` query). On PostgreSQL the server's CPU is read from
 *     /proc for the backends of the nodes' connections (found by an `application_name` of the
 *     bench's own in the DSN), shown beside the nodes' as the storage's; on SQLite it is in the
 *     nodes' own CPU (the statements run in their main thread).
 *
 * Every server is its own process, measured over IPC (`delivery-probe.ts`, preloaded with `--import`
 * into the entrypoints); the K clients and the load generator share one other process
 * (`delivery-clients.ts`), so both ends of a latency are read on one clock. Levels are repeated
 * `reps` times, bare and autopush alternating, and every figure printed is the median over the reps.
 * Each level starts on open keep-alive connections (2·c unmeasured POSTs just before it), so that
 * it measures the steady state rather than 2·c TCP handshakes.
 * A last unmeasured c = max level run per pipeline, bare and autopush, is CPU-profiled (self time by
 * function and package) and allocation-sampled (bytes allocated per notification, and by which
 * functions); the `.cpuprofile` and `.heapprofile` files are kept in a temp directory.
 *
 * Autopush's clients are those Firefox has: a share of them (--resumed, half by default) registered
 * in an earlier session and say hello with their uaid again — after a restart of the connection node
 * in (b); in (a), whose storage is in memory, after a second away — and the rest are new. After each
 * level, a sample of its messages per group is looked up in the connection node's `/__trace__`:
 * the share delivered directly (rather than stored and drained) is printed for each group.
 *
 * Options (flag or environment): --clients/BENCH_CLIENTS (1000), --count/BENCH_COUNT (3000 per
 * level), --levels/BENCH_LEVELS (1,10,50), --reps/BENCH_REPS (3), --scenarios/BENCH_SCENARIOS (a,b),
 * --profile/BENCH_PROFILE (1), --timeout/BENCH_TIMEOUT_S (whole run, 1800 s), --bytes/BENCH_BYTES
 * (body size, 256; at most the service's max_data_bytes, 4096), --rate/BENCH_RATE (notifications/s
 * each level's POSTs start at, at most c at a time: both pipelines then do the same work per second,
 * where as fast as c allows each runs at its own rate; 0, the default: as fast as c allows), --resumed/BENCH_RESUMED (share of
 * the clients that resume a uaid, 0.5), --store/BENCH_STORE (b's store: sqlite, postgres or
 * dynalite; sqlite), --db-dsn/BENCH_DB_DSN (postgres://…; AUTOPUSH_TEST_POSTGRES_DSN when unset);
 * --counter/BENCH_COUNTER (cpu: the servers' CPU time; instructions: instructions counted by
 * valgrind, see COUNTER); AUTOPUSH_SERVER_ROOT=<checkout> (environment only) runs that checkout's
 * all-in-one in (a) instead of this one's, e.g. main's beside a branch's, run after run.
 * BENCH_ROUTE=router (environment only) sends the pushes with a query string, so that they take the
 * platform's HTTP router instead of the endpoint's plain fast path.
 */
import { type ChildProcess, execFile, fork } from "node:child_process"
import { copyFileSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs"
import { promisify } from "node:util"
import { freePorts, postgresSchema } from "../test/e2e/servers.ts"
import { cpus, loadavg, tmpdir } from "node:os"
import { join } from "node:path"
import { pathToFileURL } from "node:url"
import { setTimeout as sleep } from "node:timers/promises"
import { generateFernetKey } from "../src/crypto/fernet.ts"
import type { DirectShare, LevelResult } from "./delivery-clients.ts"
import { directShareText, type Routes } from "./trace.ts"
import type { ProfileSummary } from "./delivery-probe.ts"
import { ask, next } from "./scaling-procs.ts"
import pg from "pg"
import { cpuMs } from "./harness.ts"
import { callgrindCosts, compiling } from "./delivery-instructions.ts"

// ── options ──────────────────────────────────────────────────────────────────────────────────────

const option = (flag: string, env: string, fallback: string): string => {
  const i = process.argv.indexOf(`--${flag}`)
  return (i >= 0 ? process.argv[i + 1] : undefined) ?? process.env[env] ?? fallback
}
const K = Number(option("clients", "BENCH_CLIENTS", "1000"))
const COUNT = Number(option("count", "BENCH_COUNT", "3000"))
const LEVELS = option("levels", "BENCH_LEVELS", "1,10,50").split(",").map(Number)
const REPS = Number(option("reps", "BENCH_REPS", "3"))
const SCENARIOS = option("scenarios", "BENCH_SCENARIOS", "a,b").split(",")
/**
 * `cpu` (the default): the servers' CPU time (`process.cpuUsage`). `instructions`: the servers run
 * under valgrind's callgrind, instrumented only during the measured levels, and the figure is
 * instructions executed per notification (every thread of the process: JIT code, GC, the compiler
 * threads) — a count that does not depend on what else the machine runs, unlike CPU time. V8
 * compiling is counted apart and left out of the figure: it is a cost of a process's first minutes,
 * and a level holds more or less of it from one run to the next.
 */
const COUNTER = option("counter", "BENCH_COUNTER", "cpu")
if (COUNTER !== "cpu" && COUNTER !== "instructions") throw new Error(`--counter: cpu or instructions, not ${COUNTER}`)
const INSTRUCTIONS = COUNTER === "instructions"
/** What the server figures are in. */
const SERVER_UNIT = INSTRUCTIONS ? "k instructions (not compiling)" : "CPU µs"
/**
 * CPU profiles of an extra level; with `--instructions` (off by default), callgrind's dump of every
 * measured level kept instead, by instruction address, with V8's map of its code
 * (`--perf-basic-prof`): `bench/delivery-instructions.ts` reads them by function.
 */
const PROFILE = option("profile", "BENCH_PROFILE", INSTRUCTIONS ? "0" : "1") !== "0"
const TIMEOUT_S = Number(option("timeout", "BENCH_TIMEOUT_S", "1800"))
const RESUMED = Math.round(K * Number(option("resumed", "BENCH_RESUMED", "0.5")))
const STORE = option("store", "BENCH_STORE", "sqlite")
if (STORE !== "sqlite" && STORE !== "postgres" && STORE !== "dynalite") throw new Error(`--store: sqlite, postgres or dynalite, not ${STORE}`)
const DB_DSN = option("db-dsn", "BENCH_DB_DSN", process.env["AUTOPUSH_TEST_POSTGRES_DSN"] ?? "")
if (STORE === "postgres" && DB_DSN === "") throw new Error("--store postgres needs --db-dsn postgres://… (or AUTOPUSH_TEST_POSTGRES_DSN)")
/** Messages per group and level whose delivery is looked up in the trace. */
const SHARE_SAMPLE = 200
const WARMUP = Math.min(COUNT, 1000)
const MAX_LEVEL = Math.max(...LEVELS)
// The client process reads them from its environment.
process.env["BENCH_BYTES"] = option("bytes", "BENCH_BYTES", "256")
process.env["BENCH_RATE"] = option("rate", "BENCH_RATE", "0")
if (INSTRUCTIONS) process.env["BENCH_POST_TIMEOUT_MS"] = "120000"

const here = new URL(".", import.meta.url).pathname
const root = new URL("../", import.meta.url).pathname
const probe = pathToFileURL(join(here, "delivery-probe.ts")).href
const statementCounter = pathToFileURL(join(here, "delivery-statements.ts")).href
const work = mkdtempSync(join(tmpdir(), "autopush-bench-delivery-"))

// ── processes ────────────────────────────────────────────────────────────────────────────────────

interface Proc {
  readonly name: string
  readonly child: ChildProcess
  /** The last lines it printed, for failure reports. */
  readonly output: Array<string>
}

const procs: Array<Proc> = []

/** The callgrind output of a counted server: `{prefix}.{n}`, one file per dump. */
const callgrindPrefix = (name: string) => join(work, `callgrind-${name.replace(/[^a-z0-9]+/gi, "-")}`)

/**
 * A Node process of the bench; a server (`counted`) runs under callgrind with `--instructions`, not
 * instrumented until a level starts (uninstrumented, valgrind runs it some 5× slower; instrumented,
 * some 50×). V8 writes and rewrites its code in anonymous memory: `--smc-check` makes valgrind see it.
 */
const spawnNode = (name: string, script: string, args: ReadonlyArray<string>, execArgv: ReadonlyArray<string> = [], counted = false): Proc => {
  const options = { cwd: work, stdio: ["ignore", "pipe", "pipe", "ipc"] as Array<"ignore" | "pipe" | "ipc"> }
  const child = counted && INSTRUCTIONS
    ? fork(script, args, {
      ...options,
      execPath: "valgrind",
      execArgv: [
        "--tool=callgrind", "--instr-atstart=no", "--smc-check=all-non-file", "--error-limit=no",
        `--callgrind-out-file=${callgrindPrefix(name)}`,
        ...(PROFILE ? ["--dump-instr=yes", "--dump-line=no"] : []),
        // V8 compiles and collects on the main thread, when its budgets say, not when a thread
        // of its own gets to it: a run's counts then do not depend on how valgrind schedules them.
        process.execPath, "--expose-gc", "--single-threaded",
        ...(PROFILE ? ["--perf-basic-prof", "--interpreted-frames-native-stack"] : []),
        ...execArgv
      ]
    })
    : fork(script, args, { ...options, execArgv: [...execArgv] })
  const output: Array<string> = []
  const collect = (chunk: Buffer) => {
    output.push(...chunk.toString().split("\n").filter((l) => l.length > 0))
    if (output.length > 200) output.splice(0, output.length - 100)
  }
  child.stdout?.on("data", collect)
  child.stderr?.on("data", collect)
  const proc = { name, child, output }
  procs.push(proc)
  return proc
}

/** The probe's reading: CPU µs so far; event-loop delay and GC pauses (ms) since the last reading. */
interface ProbeReading {
  readonly cpu: number
  readonly loopP99: number
  readonly loopMax: number
  readonly gcMs: number
  readonly gcMax: number
}
const readProbe = (proc: Proc) => ask<ProbeReading>(proc, { probe: "cpu" }, (m) => m["probe"] === "cpu")

let levelDumps = 0

const callgrindControl = (proc: Proc, ...args: Array<string>) =>
  promisify(execFile)("callgrind_control", [...args, String(proc.child.pid)], { timeout: 120_000 })

/**
 * `--instructions`: from now on, the server's instructions are counted (from zero). A full garbage
 * collection first: a level of a few thousand notifications either holds one of the heap's major
 * collections or not, which moved its count by half; after one, it holds those its own garbage
 * brings, as every level does.
 */
const startCounting = async (proc: Proc): Promise<void> => {
  await ask(proc, { probe: "gc" }, (m) => m["probe"] === "collected", 120_000)
  await callgrindControl(proc, "--instr=on")
  await callgrindControl(proc, "--zero")
}

/** Instructions: how long a server is watched idle before a level, for the work it does by the clock. */
const IDLE_MS = 5_000

/**
 * `--instructions`: the instructions per second a server spends idle, not compiling — its work by
 * the clock (the connection node's ticker over its sessions, timers), which a level under valgrind
 * holds some 50 times more of than the same level does natively, and more or less of with the load
 * of the machine (the clients' pace).
 */
const idleRate = async (proc: Proc): Promise<number> => {
  await startCounting(proc)
  const start = performance.now()
  await sleep(IDLE_MS)
  const seconds = (performance.now() - start) / 1000
  const { total, compiling } = await stopCounting(proc)
  return (total - compiling) / seconds
}

/**
 * `--instructions`: the server's instructions since `startCounting`, and how many of them were V8
 * compiling (`COMPILING`); it then runs uncounted again.
 */
const stopCounting = async (proc: Proc): Promise<{ readonly total: number; readonly compiling: number }> => {
  await callgrindControl(proc, "--dump")
  await callgrindControl(proc, "--instr=off")
  const prefix = callgrindPrefix(proc.name)
  const dir = join(prefix, "..")
  const base = prefix.slice(dir.length + 1)
  const dumps = readdirSync(dir).filter((f) => f.startsWith(`${base}.`))
  const last = dumps.sort((a, b) => Number(a.slice(base.length + 1)) - Number(b.slice(base.length + 1))).at(-1)
  if (last === undefined) throw new Error(`${proc.name}: no callgrind dump in ${dir}`)
  const text = readFileSync(join(dir, last), "utf8")
  if (PROFILE) {
    const kept = join(profileDir, `${base}-${++levelDumps}.callgrind`)
    copyFileSync(join(dir, last), kept)
    console.log(`  callgrind dump of ${proc.name}: ${kept} (code map /tmp/perf-${proc.child.pid}.map)`)
  }
  for (const f of dumps) rmSync(join(dir, f), { force: true })
  const costs = callgrindCosts(text)
  if (costs.total === 0) throw new Error(`${proc.name}: no instructions in its callgrind dump ${last}`)
  return { total: costs.total, compiling: compiling(costs) }
}

const stop = (proc: Proc): Promise<void> =>
  new Promise((resolve) => {
    if (proc.child.exitCode !== null || proc.child.signalCode !== null) return resolve()
    const kill = setTimeout(() => proc.child.kill("SIGKILL"), 5_000)
    proc.child.once("exit", () => {
      clearTimeout(kill)
      resolve()
    })
    proc.child.kill("SIGTERM")
  })

const stopAll = async (list: ReadonlyArray<Proc>) => {
  await Promise.all(list.map(stop))
  for (const p of list) procs.splice(procs.indexOf(p), 1)
}

/** Whatever happens, no child outlives the bench. */
const killAll = () => {
  for (const p of procs) if (p.child.exitCode === null && p.child.signalCode === null) p.child.kill("SIGKILL")
  rmSync(work, { recursive: true, force: true })
}
process.on("exit", killAll)
for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.on(signal, () => {
    killAll()
    process.exit(130)
  })
}
setTimeout(() => {
  console.error(`bench:delivery: not done after ${TIMEOUT_S} s, giving up`)
  process.exit(1)
}, TIMEOUT_S * 1000).unref()

const waitForHttp = async (proc: Proc, url: string, timeoutMs = 30_000): Promise<void> => {
  const deadline = Date.now() + timeoutMs
  while (Date.now() < deadline) {
    if (proc.child.exitCode !== null) break
    try {
      if ((await fetch(url)).ok) return
    } catch {
      // not up yet
    }
    await sleep(100)
  }
  throw new Error(`${proc.name}: ${url} did not come up; last output:\n${proc.output.slice(-15).join("\n")}`)
}

const ready = (proc: Proc, timeoutMs = 60_000) => next(proc, (m) => "ready" in m, timeoutMs)

// ── pipelines ────────────────────────────────────────────────────────────────────────────────────

/** A storage server's readings: a process of ours (its probe), or PostgreSQL's backends (/proc). */
interface StorageMeter {
  readonly name: string
  /** A Node process (event loop and GC readings), or not. */
  readonly node: boolean
  readonly read: () => Promise<ProbeReading>
}

type Counts = Record<string, { n: number; ms: number }>

interface Pipeline {
  readonly name: string
  /** The server processes; their CPU is the pipeline's server CPU. */
  readonly servers: ReadonlyArray<Proc>
  /** Storage: CPU reported beside, not in, the server CPU. */
  readonly storage: ReadonlyArray<StorageMeter>
  readonly clients: Proc
  /** Storage operations by kind since the last call (which resets them), and what they are. */
  readonly operations?: { readonly label: string; readonly take: () => Promise<Counts> } | undefined
  /** Every process of the pipeline, in stopping order. */
  readonly all: ReadonlyArray<Proc>
  /** After its processes stopped: what else it made goes (a PostgreSQL schema). */
  readonly cleanup?: () => Promise<void>
  /** A line on its store printed with the results. */
  readonly summary?: () => string
}

interface Measured {
  readonly result: LevelResult
  /** Server CPU µs per notification, per server process. */
  readonly serverCpu: ReadonlyArray<number>
  readonly storageCpu: ReadonlyArray<number>
  /** Per server then storage process, during the level: event-loop delay and GC pauses (ms). */
  readonly health: ReadonlyArray<Omit<ProbeReading, "cpu">>
  /** Storage operations per notification by kind, with the mean service time (ms). */
  readonly operations?: Record<string, { readonly perNotification: number; readonly meanMs: number }> | undefined
  /** Autopush: how a sample of the level's messages reached resumed and new clients. */
  readonly share?: DirectShare | undefined
  /** Instructions: k instructions per notification of V8 compiling, per server (not in `serverCpu`). */
  readonly compiling: ReadonlyArray<number>
  /** Instructions: k instructions per notification of the server's work by the clock (not in `serverCpu`). */
  readonly byClock: ReadonlyArray<number>
}

const subscribed = async (name: string, clients: Proc, predicate: (m: Record<string, unknown>) => boolean, expected: number) => {
  const answer = await next<{ ready?: number; registered?: number; failed: number }>(clients, predicate, 120_000)
  const n = answer.ready ?? answer.registered ?? 0
  if (answer.failed > 0 || n !== expected) {
    throw new Error(`${name}: ${n} of ${expected} clients subscribed, ${answer.failed} failed; last output:\n${clients.output.slice(-15).join("\n")}`)
  }
}

/** Bare: K new clients. */
const startBareClients = async (name: string, wsUrl: string, endpointBase: string) => {
  const clients = spawnNode(`${name} clients`, join(here, "delivery-clients.ts"), ["bare", wsUrl, String(K), endpointBase])
  await subscribed(name, clients, (m) => "ready" in m, K)
  return clients
}

/**
 * Autopush: RESUMED clients register, `between` happens (a restart), a second passes, they say hello
 * again with their uaids, and K − RESUMED new clients join.
 */
const startAutopushClients = async (name: string, wsUrl: string, routerUrl: string, between: () => Promise<void>) => {
  const clients = spawnNode(`${name} clients`, join(here, "delivery-clients.ts"), ["autopush", wsUrl, String(K), routerUrl, String(RESUMED)])
  await subscribed(name, clients, (m) => "registered" in m || "ready" in m, RESUMED)
  await between()
  await sleep(1_100)
  const answer = subscribed(name, clients, (m) => "ready" in m, K)
  clients.child.send({ cmd: "resume" })
  await answer
  return clients
}

const startAllInOne = async (): Promise<Pipeline> => {
  const [ws, router, endpoint] = (await freePorts(3)) as [number, number, number]
  const server = spawnNode("autopush (all-in-one)", join(here, "delivery-servers.ts"), ["autopush", String(ws), String(router), String(endpoint)], [], true)
  await ready(server)
  // In-memory storage does not survive a restart: the resumed clients are away for a second only.
  const clients = await startAutopushClients("autopush (a)", `ws://127.0.0.1:${ws}/`, `http://127.0.0.1:${router}`, async () => {})
  return { name: "autopush", servers: [server], storage: [], clients, all: [clients, server] }
}

const startBare = async (): Promise<Pipeline> => {
  const [ws, http] = (await freePorts(2)) as [number, number]
  const server = spawnNode("bare", join(here, "delivery-servers.ts"), ["bare", String(ws), String(http)], [], true)
  await ready(server)
  const clients = await startBareClients("bare (a)", `ws://127.0.0.1:${ws}/`, `http://127.0.0.1:${http}`)
  return { name: "bare", servers: [server], storage: [], clients, all: [clients, server] }
}

/** The store of scenario (b)'s nodes: their flags, its meters and counts, and what to remove after. */
interface SharedStore {
  readonly flags: ReadonlyArray<string>
  /** Preloaded into both nodes beside the probe. */
  readonly preload: ReadonlyArray<string>
  readonly storage: ReadonlyArray<StorageMeter>
  /** Its process, if it is one of ours. */
  readonly procs: ReadonlyArray<Proc>
  /** Storage operations since the last call, given the node processes. */
  readonly operations: { readonly label: string; readonly take: (nodes: ReadonlyArray<Proc>) => Promise<Counts> }
  /** A line on the store printed with the results. */
  readonly summary?: () => string
  readonly cleanup?: () => Promise<void>
}

const sumCounts = (all: ReadonlyArray<Counts>): Counts => {
  const sum: Counts = {}
  for (const counts of all) {
    for (const [kind, { n, ms }] of Object.entries(counts)) sum[kind] = { n: (sum[kind]?.n ?? 0) + n, ms: (sum[kind]?.ms ?? 0) + ms }
  }
  return sum
}

/** The statements the nodes ran since the last call (`delivery-statements.ts`), summed by kind. */
const nodeStatements = async (nodes: ReadonlyArray<Proc>): Promise<Counts> =>
  sumCounts((await Promise.all(nodes.map((p) => ask<{ counts: Counts }>(p, { probe: "statements" }, (m) => m["probe"] === "statements")))).map((a) => a.counts))

const dynaliteStore = async (): Promise<SharedStore> => {
  const [port] = (await freePorts(1)) as [number]
  const dynalite = spawnNode("dynalite", join(here, "delivery-dynalite.ts"), [String(port), join(work, "dynalite")])
  await ready(dynalite)
  return {
    flags: ["--storage-endpoint", `http://127.0.0.1:${port}`],
    preload: [],
    storage: [{ name: dynalite.name, node: true, read: () => readProbe(dynalite) }],
    procs: [dynalite],
    operations: {
      label: "DynamoDB requests",
      take: async () => (await ask<{ counts: Counts }>(dynalite, { cmd: "counts" }, (m) => "counts" in m)).counts
    }
  }
}

/** Both nodes on the SQLite database of one `data_dir`, as separate nodes of one host share it. */
const sqliteStore = (): SharedStore => ({
  flags: ["--embedded-storage", "--data-dir", join(work, "data")],
  preload: ["--import", statementCounter],
  storage: [],
  procs: [],
  operations: { label: "SQLite statements", take: nodeStatements }
})

/**
 * Both nodes on PostgreSQL at DB_DSN, in a schema of their own; their connections carry an
 * `application_name` of this run's, by which their backends are found for the server's CPU.
 */
const postgresStore = async (): Promise<SharedStore> => {
  const schema = await postgresSchema(DB_DSN, "bench_delivery")
  const application = `bench_delivery_${process.pid}`
  const url = new URL(schema.dsn)
  url.searchParams.set("application_name", application)
  const admin = new pg.Client({ connectionString: DB_DSN })
  await admin.connect()
  // CPU µs of the backends so far: a backend's CPU counts from the first reading that sees it
  // until the last one (one that ends between two readings loses what it used since the earlier).
  let total = 0
  let last = new Map<number, number>()
  // The pools open a connection only when all theirs are busy and keep it 30 s idle: the count
  // just after a level is about the most its operations held at once.
  let most = 0
  const read = async (): Promise<ProbeReading> => {
    const { rows } = await admin.query("SELECT pid FROM pg_stat_activity WHERE application_name = $1", [application])
    most = Math.max(most, rows.length)
    const now = new Map<number, number>()
    for (const row of rows) {
      const pid = Number(row["pid"])
      try {
        now.set(pid, cpuMs(pid) * 1000)
      } catch {
        // ended meanwhile
      }
    }
    // A backend first seen now started since the last reading: all its CPU is new.
    for (const [pid, cpu] of now) total += cpu - (last.get(pid) ?? 0)
    last = now
    return { cpu: total, loopP99: 0, loopMax: 0, gcMs: 0, gcMax: 0 }
  }
  return {
    flags: ["--db-dsn", url.href],
    preload: ["--import", statementCounter],
    storage: [{ name: "PostgreSQL backends", node: false, read }],
    procs: [],
    operations: { label: "PostgreSQL statements", take: nodeStatements },
    summary: () => `PostgreSQL connections of both nodes, the most seen before or after a level: ${most} (each node's pool: up to db_pool_size, 10)`,
    cleanup: async () => {
      await admin.end()
      await schema.drop()
    }
  }
}

const sharedStore = (): Promise<SharedStore> =>
  STORE === "postgres" ? postgresStore() : STORE === "dynalite" ? dynaliteStore() : Promise.resolve(sqliteStore())

const STORE_NAMES = { sqlite: "the SQLite database of one host", postgres: "PostgreSQL", dynalite: "one dynalite (LevelDB)" } as const

const startSeparate = async (): Promise<Pipeline> => {
  const [ws, router, endpoint, metrics] = (await freePorts(4)) as [number, number, number, number]
  const store = await sharedStore()
  // The flags of test/e2e/servers.ts, at the default log level (info).
  const shared = [
    "--endpoint-hostname", "127.0.0.1",
    "--endpoint-port", String(endpoint),
    "--bind-host", "127.0.0.1",
    ...store.flags,
    "--crypto-key", generateFernetKey(),
    "--auth-keys", "bench-auth-key"
  ]
  const preload = ["--import", probe, ...store.preload]
  const startConnection = async () => {
    const proc = spawnNode("autoconnect", join(root, "src/bin/autoconnect.ts"), [
      ...shared,
      "--port", String(ws),
      "--router-port", String(router),
      "--router-hostname", "127.0.0.1"
    ], preload, true)
    await waitForHttp(proc, `http://127.0.0.1:${router}/__lbheartbeat__`)
    return proc
  }
  let connection = await startConnection()
  const endpointNode = spawnNode("autoendpoint", join(root, "src/bin/autoendpoint.ts"), [...shared, "--metrics-port", String(metrics)], preload, true)
  await waitForHttp(endpointNode, `http://127.0.0.1:${endpoint}/__lbheartbeat__`)
  // The storage operations of the clients' arrival, across the connection node's restart.
  await store.operations.take([endpointNode, connection])
  const arrival: Array<Counts> = []
  // The resumed clients come back after the connection node restarted (as after a deploy).
  const clients = await startAutopushClients("autopush (b)", `ws://127.0.0.1:${ws}/`, `http://127.0.0.1:${router}`, async () => {
    arrival.push(await store.operations.take([connection]))
    await stopAll([connection])
    connection = await startConnection()
  })
  const servers = [endpointNode, connection]
  arrival.push(await store.operations.take(servers))
  const perClient = Object.entries(sumCounts(arrival)).map(([kind, { n }]) => `${kind} ${f2(n / K)}`).join(", ")
  console.log(`  ${store.operations.label} per client while the ${K} clients arrived (${RESUMED} registered, the connection node restarted, they resumed, ${K - RESUMED} new said hello and registered; the restarted node's start included): ${perClient}`)
  return {
    name: "autopush",
    servers,
    storage: store.storage,
    clients,
    operations: { label: store.operations.label, take: () => store.operations.take(servers) },
    all: [clients, ...servers, ...store.procs],
    ...(store.summary === undefined ? {} : { summary: store.summary }),
    ...(store.cleanup === undefined ? {} : { cleanup: store.cleanup })
  }
}

const startBareTwo = async (): Promise<Pipeline> => {
  const [ws, router, http] = (await freePorts(3)) as [number, number, number]
  const back = spawnNode("bare back", join(here, "delivery-servers.ts"), ["bare-back", String(ws), String(router)], [], true)
  await ready(back)
  const front = spawnNode("bare front", join(here, "delivery-servers.ts"), ["bare-front", String(http), String(router)], [], true)
  await ready(front)
  const clients = await startBareClients("bare (b)", `ws://127.0.0.1:${ws}/`, `http://127.0.0.1:${http}`)
  return { name: "bare", servers: [front, back], storage: [], clients, all: [clients, front, back] }
}

/**
 * One level: server CPU read just before and just after (acks included), figures from the clients;
 * then, when `traced`, how a sample of its messages was delivered, from autopush's trace.
 */
const runLevel = async (pipeline: Pipeline, c: number, count: number, traced = true): Promise<Measured> => {
  // Under valgrind a notification takes some 50× longer.
  const timeoutMs = (60_000 + count * 20) * (INSTRUCTIONS ? 10 : 1)
  await ask(pipeline.clients, { cmd: "warm", c }, (m) => "warmed" in m, 60_000)
  await pipeline.operations?.take()
  const readAll = () => Promise.all([...pipeline.servers.map(readProbe), ...pipeline.storage.map((m) => m.read())])
  const idle = INSTRUCTIONS ? await Promise.all(pipeline.servers.map(idleRate)) : []
  if (INSTRUCTIONS) await Promise.all(pipeline.servers.map(startCounting))
  const start = performance.now()
  const before = await readAll()
  const { level: result } = await ask<{ level: LevelResult }>(pipeline.clients, { cmd: "level", c, count, timeoutMs }, (m) => "level" in m, timeoutMs + 10_000)
  // Let the last acks land before reading the CPU.
  await sleep(100)
  const seconds = (performance.now() - start) / 1000
  const counted = INSTRUCTIONS ? await Promise.all(pipeline.servers.map(stopCounting)) : []
  const after = await readAll()
  // Instructions: a notification's — without V8 compiling (a cost of the first minutes, which a
  // short level holds more or less of from one run to the next), nor what the server does by the
  // clock (`idleRate`), which valgrind's slowness, and the machine's load, make last longer.
  const byClock = idle.map((rate) => rate * seconds)
  const perNotification = after.map((a, i) => {
    const c = counted[i]
    return c !== undefined ? (c.total - c.compiling - (byClock[i] as number)) / 1000 / count : (a.cpu - (before[i] as ProbeReading).cpu) / count
  })
  const counts = await pipeline.operations?.take()
  const operations: Measured["operations"] = counts === undefined ? undefined
    : Object.fromEntries(Object.entries(counts).map(([op, { n, ms }]) => [op, { perNotification: n / count, meanMs: ms / n }]))
  // After the CPU reading: the trace lookups are not part of the level.
  const share = pipeline.name === "autopush" && traced
    ? (await ask<{ share: DirectShare }>(pipeline.clients, { cmd: "share", count: SHARE_SAMPLE }, (m) => "share" in m, 60_000)).share
    : undefined
  if (result.received < count || result.accepted < count) {
    console.log(`  ! ${pipeline.name} c=${c}: ${result.accepted} accepted, ${result.received} received of ${count}; statuses ${JSON.stringify(result.statuses)}`)
  }
  return {
    result,
    serverCpu: perNotification.slice(0, pipeline.servers.length),
    storageCpu: perNotification.slice(pipeline.servers.length),
    health: after.map(({ loopP99, loopMax, gcMs, gcMax }) => ({ loopP99, loopMax, gcMs, gcMax })),
    operations,
    share,
    compiling: counted.map((c) => c.compiling / 1000 / count),
    byClock: byClock.map((n) => n / 1000 / count)
  }
}

interface Profiled {
  readonly proc: Proc
  readonly summary: ProfileSummary
  readonly file: string
  /** CPU µs per notification during the profiled level (profiler overhead included). */
  readonly cpu: number
}

const profileLevel = async (pipeline: Pipeline, label: string): Promise<Array<Profiled>> => {
  await Promise.all(pipeline.servers.map((p) => ask(p, { probe: "profile-start", intervalUs: 200 }, (m) => m["probe"] === "profiling")))
  // Without the trace lookups: they would be in the profile.
  const measured = await runLevel(pipeline, MAX_LEVEL, COUNT, false)
  return Promise.all(pipeline.servers.map(async (proc, i) => {
    const file = join(profileDir, `${label}-${proc.name.replace(/[^a-z0-9]+/gi, "-").replace(/-$/, "")}.cpuprofile`)
    const summary = await ask<ProfileSummary>(proc, { probe: "profile-stop", file, topN: 15 }, (m) => m["probe"] === "profile", 60_000)
    return { proc, summary, file, cpu: measured.serverCpu[i] as number }
  }))
}

// ── statistics and printing ──────────────────────────────────────────────────────────────────────

const median = (values: ReadonlyArray<number>): number => {
  const sorted = [...values].sort((a, b) => a - b)
  const mid = Math.floor(sorted.length / 2)
  return sorted.length % 2 === 1 ? (sorted[mid] as number) : ((sorted[mid - 1] as number) + (sorted[mid] as number)) / 2
}

interface Row {
  readonly rate: number
  readonly rateMin: number
  readonly rateMax: number
  readonly p50Answer: number
  readonly p99Answer: number
  readonly p50Client: number
  readonly p99Client: number
  readonly serverCpu: ReadonlyArray<number>
  readonly storageCpu: ReadonlyArray<number>
  readonly clientCpu: number
  readonly health: ReadonlyArray<Omit<ProbeReading, "cpu">>
  readonly operations?: Record<string, { readonly perNotification: number; readonly meanMs: number }> | undefined
  /** Summed over the reps. */
  readonly share?: DirectShare | undefined
  /** POST→client p50 / p99 of the messages to resumed and to new clients (medians over the reps). */
  readonly groups: { readonly resumed: readonly [number, number]; readonly fresh: readonly [number, number] }
}

const addRoutes = (a: Routes, b: Routes): Routes => ({ direct: a.direct + b.direct, stored: a.stored + b.stored, unknown: a.unknown + b.unknown })

const summarise = (runs: ReadonlyArray<Measured>): Row => {
  const m = (f: (r: Measured) => number) => median(runs.map(f))
  const rates = runs.map((r) => r.result.received / (r.result.wallMs / 1000))
  const first = runs[0] as Measured
  let operations: Row["operations"]
  if (first.operations !== undefined) {
    const ops = new Set(runs.flatMap((r) => Object.keys(r.operations ?? {})))
    operations = Object.fromEntries(Array.from(ops, (op) => [op, {
      perNotification: m((r) => r.operations?.[op]?.perNotification ?? 0),
      meanMs: m((r) => r.operations?.[op]?.meanMs ?? 0)
    }]))
  }
  return {
    rate: median(rates),
    rateMin: Math.min(...rates),
    rateMax: Math.max(...rates),
    p50Answer: m((r) => r.result.p50Answer),
    p99Answer: m((r) => r.result.p99Answer),
    p50Client: m((r) => r.result.p50Client),
    p99Client: m((r) => r.result.p99Client),
    serverCpu: first.serverCpu.map((_, i) => m((r) => r.serverCpu[i] as number)),
    storageCpu: first.storageCpu.map((_, i) => m((r) => r.storageCpu[i] as number)),
    clientCpu: m((r) => r.result.clientCpuUs / r.result.count),
    health: first.health.map((_, i) => ({
      loopP99: m((r) => r.health[i]?.loopP99 ?? 0),
      loopMax: m((r) => r.health[i]?.loopMax ?? 0),
      gcMs: m((r) => r.health[i]?.gcMs ?? 0),
      gcMax: m((r) => r.health[i]?.gcMax ?? 0)
    })),
    operations,
    groups: {
      resumed: [m((r) => r.result.byGroup.resumed.p50Client), m((r) => r.result.byGroup.resumed.p99Client)],
      fresh: [m((r) => r.result.byGroup.fresh.p50Client), m((r) => r.result.byGroup.fresh.p99Client)]
    },
    share: runs.reduce<DirectShare | undefined>((sum, r) =>
      r.share === undefined ? sum
      : sum === undefined ? r.share
      : { resumed: addRoutes(sum.resumed, r.share.resumed), fresh: addRoutes(sum.fresh, r.share.fresh) }, undefined)
  }
}

const f1 = (n: number) => n.toFixed(1)
const f2 = (n: number) => n.toFixed(2)
const pad = (s: string, n: number) => s.padStart(n)

const printTable = (title: string, pipelines: ReadonlyArray<Pipeline>, rows: Map<string, Map<number, Row>>) => {
  console.log(`\n${title}`)
  const cpuHeader = (p: Pipeline) =>
    p.servers.length + p.storage.length > 1
      ? ` (${[...p.servers.map((s) => s.name), ...p.storage.map((s) => `${s.name}*`)].join(" + ")})`
      : ""
  for (const p of pipelines) console.log(`  ${p.name}: server ${SERVER_UNIT}/notification${cpuHeader(p) || ` (${p.servers[0]?.name})`}`)
  console.log(`  ${"pipeline".padEnd(9)}${pad("c", 4)}${pad("notif/s", 9)}${pad("(min–max)", 14)}${pad("201 p50", 9)}${pad("p99", 8)}${pad("client p50", 12)}${pad("p99", 8)}  ${`server ${SERVER_UNIT}/notif`.padEnd(28)}${pad("loadgen CPU", 12)}`)
  for (const c of LEVELS) {
    for (const p of pipelines) {
      const r = rows.get(p.name)?.get(c)
      if (r === undefined) continue
      const total = r.serverCpu.reduce((a, b) => a + b, 0)
      const parts = r.serverCpu.length + r.storageCpu.length > 1
        ? ` (${[...r.serverCpu.map((v) => v.toFixed(0)), ...r.storageCpu.map((v) => `${v.toFixed(0)}*`)].join(" + ")})`
        : ""
      console.log(
        `  ${p.name.padEnd(9)}${pad(String(c), 4)}${pad(r.rate.toFixed(0), 9)}${pad(`(${r.rateMin.toFixed(0)}–${r.rateMax.toFixed(0)})`, 14)}` +
          `${pad(f2(r.p50Answer), 9)}${pad(f2(r.p99Answer), 8)}${pad(f2(r.p50Client), 12)}${pad(f2(r.p99Client), 8)}  ` +
          `${`${total.toFixed(0)}${parts}`.padEnd(28)}${pad(r.clientCpu.toFixed(0), 12)}`
      )
    }
  }
  console.log("  (latencies in ms; * storage process, not counted in the server CPU total)")
}

/** What a pipeline is held to at the top level, as a ratio to bare of the same run. */
interface Targets {
  readonly rate: number
  readonly p99?: number
  readonly cpu?: number
}

const printRatios = (label: string, rows: Map<string, Map<number, Row>>, targets: Targets) => {
  console.log(`  ${label}: autopush / bare`)
  for (const c of LEVELS) {
    const ours = rows.get("autopush")?.get(c)
    const bare = rows.get("bare")?.get(c)
    if (ours === undefined || bare === undefined) continue
    const rate = ours.rate / bare.rate
    const p99 = ours.p99Client / bare.p99Client
    const cpu = ours.serverCpu.reduce((a, b) => a + b, 0) / bare.serverCpu.reduce((a, b) => a + b, 0)
    const verdicts = c !== MAX_LEVEL ? [] : [
      `target ≥ ${(targets.rate * 100).toFixed(0)} %: ${rate >= targets.rate ? "met" : "NOT met"}`,
      ...(targets.p99 === undefined ? [] : [`p99 ≤ ${targets.p99}×: ${p99 <= targets.p99 ? "met" : "NOT met"}`]),
      ...(targets.cpu === undefined ? [] : [`CPU ≤ ${targets.cpu}×: ${cpu <= targets.cpu ? "met" : "NOT met"}`])
    ]
    console.log(`    c=${String(c).padEnd(3)} notifications/s ${(rate * 100).toFixed(0).padStart(3)} %   POST→client p99 ${f2(p99)}×   POST→201 p99 ${f2(ours.p99Answer / bare.p99Answer)}×   server ${SERVER_UNIT} ${f2(cpu)}×${verdicts.length === 0 ? "" : `   ${verdicts.join("; ")}`}`)
  }
  // Servers, storage, clients and load generator share the machine's cores: once they are busy, the
  // rates compare as the inverse of the CPU each notification costs all of them.
  const ours = rows.get("autopush")?.get(MAX_LEVEL)
  const bare = rows.get("bare")?.get(MAX_LEVEL)
  // The clients' CPU is time: it adds to the servers' only when they are time too.
  if (ours !== undefined && bare !== undefined && !INSTRUCTIONS) {
    const machine = (r: Row) => [...r.serverCpu, ...r.storageCpu].reduce((a, b) => a + b, 0) + r.clientCpu
    console.log(
      `    c=${MAX_LEVEL}: CPU of every process on the machine per notification (servers, storage, clients and load generator): ` +
        `bare ${machine(bare).toFixed(0)} µs, autopush ${machine(ours).toFixed(0)} µs — on a busy machine the rate ratio tends to ` +
        `${(machine(bare) / machine(ours) * 100).toFixed(0)} %`
    )
  }
}

const percent = (share: number) => `${f1(share * 100)} %`

/** The share of messages delivered directly to resumed and to new clients, per level. */
const printShare = (rows: Map<string, Map<number, Row>>) => {
  console.log(`  delivered directly (autopush; a traced sample of up to ${SHARE_SAMPLE} messages per group, level and rep; ${RESUMED} of ${K} clients resumed):`)
  for (const c of LEVELS) {
    const row = rows.get("autopush")?.get(c)
    if (row?.share === undefined) continue
    const latency = ([p50, p99]: readonly [number, number]) => `POST→client p50 ${f2(p50)} / p99 ${f2(p99)} ms`
    console.log(`    c=${String(c).padEnd(3)} resumed clients ${directShareText(row.share.resumed)}, ${latency(row.groups.resumed)}`)
    console.log(`          new clients     ${directShareText(row.share.fresh)}, ${latency(row.groups.fresh)}`)
  }
}

const printProfiles = (profiles: ReadonlyArray<Profiled>) => {
  for (const { proc, summary, file, cpu } of profiles) {
    console.log(`  CPU profile of ${proc.name}, an extra c=${MAX_LEVEL} level of ${COUNT} (${cpu.toFixed(0)} µs CPU/notification while profiled, ${summary.samples} samples): ${file}`)
    // Every allocation of the level, also those collected since (V8's estimate from its samples).
    console.log(`    allocated: ${(summary.allocated / COUNT / 1024).toFixed(1)} KiB per notification; most by: ${summary.allocations.slice(0, 8).map((s) => `${s.name} ${percent(s.share)}`).join(", ")}`)
    console.log(`    self time by package: ${summary.byPackage.slice(0, 10).map((s) => `${s.name} ${percent(s.share)}`).join(", ")}`)
    console.log(`    samples with the package on the stack: ${summary.inclusive.slice(0, 10).map((s) => `${s.name} ${percent(s.share)}`).join(", ")}`)
    // The profiler samples wall time: a socket write that wakes the reader on a busy machine is
    // charged the time the reader then runs, so the writes' share here exceeds their CPU.
    console.log("    top self time by function ((native) writev/write*String: socket writes, wall time):")
    for (const s of summary.top.slice(0, 15)) console.log(`      ${pad(percent(s.share), 7)}  ${s.name}`)
  }
}

/** Event-loop delay and GC pauses of each server process during the levels (medians over the reps). */
const printHealth = (pipelines: ReadonlyArray<Pipeline>, rows: Map<string, Map<number, Row>>) => {
  console.log("  server event loop during the levels: delay p99 / max, GC pauses total / longest (ms)")
  for (const p of pipelines) {
    const names = [...p.servers, ...p.storage].map((s) => s.name)
    // Only Node processes have an event loop and GC (not PostgreSQL's backends).
    const node = [...p.servers.map(() => true), ...p.storage.map((m) => m.node)]
    for (const c of LEVELS) {
      const r = rows.get(p.name)?.get(c)
      if (r === undefined) continue
      const parts = r.health.flatMap((h, i) => !node[i] ? [] : [`${names[i]}: loop ${f1(h.loopP99)} / ${f1(h.loopMax)}, GC ${f1(h.gcMs)} / ${f1(h.gcMax)}`])
      console.log(`    ${p.name.padEnd(9)}c=${String(c).padEnd(3)} ${parts.join("; ")}`)
    }
  }
}

/**
 * Warm the two pipelines up, run the levels `REPS` times alternating which goes first: the rows,
 * and the warm-up level of each pipeline (its first pushes to each client).
 */
const runScenario = async (pipelines: ReadonlyArray<Pipeline>) => {
  const warmup = new Map<string, Measured>()
  for (const p of pipelines) {
    warmup.set(p.name, await runLevel(p, 10, WARMUP, false))
    // Instructions: V8 still compiles the hot code after the warm-up (a tenth of a level's count was
    // its optimizing compiler's): a level of each c first, unmeasured.
    if (INSTRUCTIONS) for (const c of LEVELS) await runLevel(p, c, COUNT, false)
  }
  const runs = new Map<string, Map<number, Array<Measured>>>(pipelines.map((p) => [p.name, new Map(LEVELS.map((c) => [c, []]))]))
  for (let rep = 0; rep < REPS; rep++) {
    for (const c of LEVELS) {
      const order = rep % 2 === 0 ? pipelines : [...pipelines].reverse()
      for (const p of order) {
        const measured = await runLevel(p, c, COUNT)
        runs.get(p.name)?.get(c)?.push(measured)
        const r = measured.result
        console.log(`  rep ${rep + 1} ${p.name.padEnd(8)} c=${String(c).padEnd(3)} ${(r.received / (r.wallMs / 1000)).toFixed(0).padStart(6)} notif/s  client p99 ${f2(r.p99Client)} ms  server ${SERVER_UNIT}/notif ${measured.serverCpu.map(f1).join(" + ")}${INSTRUCTIONS ? ` (and compiling ${measured.compiling.map(f1).join(" + ")}, by the clock ${measured.byClock.map(f1).join(" + ")})` : ""}`)
      }
    }
  }
  const rows = new Map(Array.from(runs, ([name, byC]) => [name, new Map(Array.from(byC, ([c, list]) => [c, summarise(list)]))]))
  return { rows, warmup }
}

/** Run at the end, whatever happened: what the pipelines made besides their processes. */
const cleanups: Array<() => Promise<void>> = []

const profileDir = PROFILE ? mkdtempSync(join(tmpdir(), "autopush-bench-profiles-")) : ""

const main = async () => {
  const cpu = cpus()
  const pacing = process.env["BENCH_RATE"] === "0" ? "" : `, POSTs started at ${process.env["BENCH_RATE"]}/s`
  console.log(`bench:delivery — K = ${K} clients, ${COUNT} notifications per level, c = ${LEVELS.join(", ")}${pacing}, median of ${REPS} rep(s)`)
  console.log(`  256-byte aes128gcm bodies, TTL 60, v1 endpoints, no VAPID; node ${process.version}, ${cpu.length} × ${cpu[0]?.model ?? "?"}, load average ${loadavg().map(f2).join(" ")}`)
  console.log("  clients and load generator share one process; each server is its own process; all on this machine")

  if (SCENARIOS.includes("a")) {
    console.log("\n(a) starting: bare single-process pipeline, autopush all-in-one (in-memory storage)")
    const bare = await startBare()
    const ours = await startAllInOne()
    const { rows } = await runScenario([bare, ours])
    const profiles = PROFILE && !INSTRUCTIONS ? [...await profileLevel(bare, "a"), ...await profileLevel(ours, "a")] : []
    await stopAll([...ours.all, ...bare.all])
    printTable(`(a) all-in-one process, in-memory storage — vs bare node:http → Map → ws (one process)`, [bare, ours], rows)
    printRatios("(a) ratios", rows, { rate: 0.75, p99: 1.5, cpu: 2 })
    printShare(rows)
    printHealth([bare, ours], rows)
    printProfiles(profiles)
  }

  if (SCENARIOS.includes("b")) {
    console.log(`\n(b) starting: bare two-process pipeline, autoconnect + autoendpoint (real entrypoints) on ${STORE_NAMES[STORE]}`)
    const bare = await startBareTwo()
    const ours = await startSeparate()
    if (ours.cleanup !== undefined) cleanups.push(ours.cleanup)
    const { rows, warmup } = await runScenario([bare, ours])
    const profiles = PROFILE && !INSTRUCTIONS ? [...await profileLevel(bare, "b"), ...await profileLevel(ours, "b")] : []
    await stopAll([...ours.all, ...bare.all])
    printTable(`(b) autoendpoint + autoconnect on ${STORE_NAMES[STORE]} — vs bare POST → HTTP PUT → ws (two processes, no store)`, [bare, ours], rows)
    printRatios("(b) ratios", rows, { rate: 0.75, cpu: 1.8 })
    printShare(rows)
    printHealth([bare, ours], rows)
    console.log(`  where the time goes (autopush, per notification; ${ours.operations?.label}, with their mean time):`)
    const opsText = (operations: NonNullable<Row["operations"]>) => {
      const ops = Object.entries(operations).filter(([, v]) => v.perNotification > 0.001).sort((a, b) => b[1].perNotification - a[1].perNotification)
      const total = ops.reduce((a, [, v]) => a + v.perNotification, 0)
      return `${f2(total)}${ops.length === 0 ? "" : `: ${ops.map(([op, v]) => `${op} ${f2(v.perNotification)} (${f2(v.meanMs)} ms)`).join(", ")}`}`
    }
    const cpuText = (serverCpu: ReadonlyArray<number>, storageCpu: ReadonlyArray<number>) =>
      `CPU µs: endpoint ${serverCpu[0]?.toFixed(0)}, connection ${serverCpu[1]?.toFixed(0)}` +
      ours.storage.map((m, i) => `, ${m.name} ${storageCpu[i]?.toFixed(0)}`).join("")
    const first = warmup.get("autopush")
    if (first?.operations !== undefined) {
      console.log(`    warm-up, c=10, ${WARMUP} pushes round-robin (the first to each of ${Math.min(WARMUP, K)} clients: the endpoint's router cache cold) ${opsText(first.operations)}; ${cpuText(first.serverCpu, first.storageCpu)}`)
    }
    for (const c of LEVELS) {
      const r = rows.get("autopush")?.get(c)
      if (r?.operations === undefined) continue
      console.log(`    c=${String(c).padEnd(3)} ${opsText(r.operations)}; ${cpuText(r.serverCpu, r.storageCpu)}`)
    }
    if (ours.summary !== undefined) console.log(`  ${ours.summary()}`)
    printProfiles(profiles)
  }
  if (PROFILE) console.log(`\nCPU profiles kept in ${profileDir}`)
}

try {
  await main()
} catch (error) {
  console.error("bench:delivery failed:", error)
  process.exitCode = 1
} finally {
  killAll()
  for (const cleanup of cleanups) await cleanup().catch((error: unknown) => console.error("bench:delivery: cleaning up:", error))
}
