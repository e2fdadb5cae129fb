/**
 * `npm run bench:scaling`: the scaling curve. For each number of processes N (workers = 1, 2, … up
 * to the cores available), in one run, ours against a bare pipeline with the same number of
 * processes:
 *
 * - connected delivery as `bench:delivery` has it (`scaling-connected.ts`): its clients and load
 *   generator (`delivery-clients.ts`), a share of the clients resumed (registered, then said hello
 *   again with their uaid after a restart of ours), the rest new;
 * - stored delivery as `bench:stored` has it (`scaling-stored.ts`), spread over several offline
 *   clients so that several workers drain at once: messages stored through the API, then drained
 *   and acked;
 *
 * ours being the real all-in-one entrypoint `bin/autopush.js --workers N` on its embedded storage,
 * bare N plain processes sharing the public ports (SO_REUSEPORT) with private router ports
 * between them, on a dynalite server process for stored delivery (`scaling-pipelines.ts`).
 * Printed as one markdown table: notifications/s, server CPU µs per notification (user + system
 * from /proc, summed over every server process: supervisor and workers, bare's processes and its
 * dynalite), p99, ours / bare, and each pipeline's notifications/s against N = 1. Medians over the
 * reps; for connected delivery ours and bare alternate within each rep, for stored delivery bare
 * runs its reps, then ours.
 *
 * The clients and the load generator run on the same cores as the servers (on a 2-core machine,
 * N = 2 leaves the servers no core of their own): said at the top, figures given anyway.
 *
 * Options (flag or environment): --workers/BENCH_WORKERS (1,2,… up to os.availableParallelism()),
 * --clients/BENCH_CLIENTS (connected clients, 1000), --resumed/BENCH_RESUMED (their share that
 * resumes, 0.5), --count/BENCH_COUNT (notifications per level, 10000), --levels/BENCH_LEVELS (POSTs
 * in flight, 50), --reps/BENCH_REPS (3), --offline/BENCH_OFFLINE (stored: offline clients, 20),
 * --messages/BENCH_MESSAGES (stored: messages per offline client, 500), --bytes/BENCH_BYTES (body
 * size, 256), --tests/BENCH_TESTS (connected,stored), --timeout/BENCH_TIMEOUT_S (whole run, 1800 s).
 */
import { mkdirSync, mkdtempSync, rmSync } from "node:fs"
import { availableParallelism, cpus, loadavg, tmpdir } from "node:os"
import { join } from "node:path"
import { option } from "./harness.ts"
import { bareClients, type ConnectedRun, measureLevel, ourClients } from "./scaling-connected.ts"
import { startBareConnected, startBareStored, startOurs, type Servers } from "./scaling-pipelines.ts"
import { killAll, type Proc, stopAll } from "./scaling-procs.ts"
import { bareUser, measureStored, ourUser, type Phase, type StoredRun } from "./scaling-stored.ts"

// ── options ──────────────────────────────────────────────────────────────────────────────────────

const CORES = availableParallelism()
const list = (text: string) => text.split(",").map(Number)
const WORKERS = list(option("workers", "BENCH_WORKERS", Array.from({ length: CORES }, (_, i) => i + 1).join(",")))
const K = Number(option("clients", "BENCH_CLIENTS", "1000"))
const RESUMED = Math.round(K * Number(option("resumed", "BENCH_RESUMED", "0.5")))
// 10,000: the CPU is read from /proc in 10 ms ticks per process, so a level must last long enough.
const COUNT = Number(option("count", "BENCH_COUNT", "10000"))
const LEVELS = list(option("levels", "BENCH_LEVELS", "50"))
const REPS = Number(option("reps", "BENCH_REPS", "3"))
const OFFLINE = Number(option("offline", "BENCH_OFFLINE", "20"))
const MESSAGES = Number(option("messages", "BENCH_MESSAGES", "500"))
const BYTES = Number(option("bytes", "BENCH_BYTES", "256"))
const TESTS = option("tests", "BENCH_TESTS", "connected,stored").split(",")
const TIMEOUT_S = Number(option("timeout", "BENCH_TIMEOUT_S", "1800"))
const WARMUP = Math.min(COUNT, 1000)
/** What "against 1 worker" compares with: the smallest N run. */
const BASE_N = Math.min(...WORKERS)
// The client process (`delivery-clients.ts`) reads it from its environment.
process.env["BENCH_BYTES"] = String(BYTES)

// ── the run's processes and files ────────────────────────────────────────────────────────────────

const work = mkdtempSync(join(tmpdir(), "autopush-bench-scaling-"))
const cleanUp = () => {
  killAll()
  rmSync(work, { recursive: true, force: true })
}
process.on("exit", cleanUp)
for (const signal of ["SIGINT", "SIGTERM"] as const) process.on(signal, () => process.exit(130))
setTimeout(() => {
  console.error(`bench:scaling: not done after ${TIMEOUT_S} s, giving up`)
  process.exit(1)
}, TIMEOUT_S * 1000).unref()

let dirs = 0
/** A directory of its own for each server started: ours gets a fresh data_dir in it. */
const freshDir = (): string => {
  const dir = join(work, String(++dirs))
  mkdirSync(dir)
  return dir
}

// ── results ──────────────────────────────────────────────────────────────────────────────────────

type Name = Servers["name"]
/** A test's figures for one pipeline (medians over the reps). */
type Figures = Phase

/** test ("connected c=50", "stored: store", "stored: drain") → N → pipeline → figures. */
const results = new Map<string, Map<number, Partial<Record<Name, Figures>>>>()
/** Connected delivery's details, by N and c: the medians of every run's fields, per pipeline. */
const details = new Map<string, Partial<Record<Name, ConnectedRun>>>()
const problems: Array<string> = []

const median = (values: ReadonlyArray<number>): number => {
  const sorted = values.filter((v) => !Number.isNaN(v)).sort((a, b) => a - b)
  if (sorted.length === 0) return Number.NaN
  const mid = Math.floor(sorted.length / 2)
  return sorted.length % 2 === 1 ? (sorted[mid] as number) : ((sorted[mid - 1] as number) + (sorted[mid] as number)) / 2
}

/** The median of each field over the runs. */
const medians = <T extends object>(runs: ReadonlyArray<T>): T => {
  const first = runs[0] as Record<string, unknown>
  return Object.fromEntries(Object.keys(first).map((key) => [key, median(runs.map((r) => (r as Record<string, number>)[key] as number))])) as T
}

const record = (test: string, n: number, name: Name, figures: Figures) => {
  const byN = results.get(test) ?? new Map<number, Partial<Record<Name, Figures>>>()
  results.set(test, byN)
  byN.set(n, { ...byN.get(n), [name]: figures })
}

const f0 = (n: number) => (Number.isNaN(n) ? "–" : n.toFixed(0))
const f2 = (n: number) => (Number.isNaN(n) ? "–" : n.toFixed(2))

// ── connected delivery ───────────────────────────────────────────────────────────────────────────

interface Connected {
  readonly servers: Servers
  readonly clients: Proc
}

/** Both pipelines with N processes, their clients subscribed; the levels REPS times, alternating which goes first. */
const connectedAt = async (n: number): Promise<void> => {
  const servers: Array<Servers> = []
  const clients: Array<Proc> = []
  try {
    const bare = await startBareConnected(n, freshDir())
    servers.push(bare)
    clients.push(await bareClients(bare, K, work))
    const ours = await startOurs(n, freshDir())
    servers.push(ours)
    clients.push(await ourClients(ours, K, RESUMED, work))
    console.log(`\nN=${n}, connected delivery: ours ${ours.describe()}, bare ${bare.describe()}; ${K} clients each (ours: ${RESUMED} resumed after a restart)`)
    const pipelines: ReadonlyArray<Connected> = servers.map((s, i) => ({ servers: s, clients: clients[i] as Proc }))
    for (const p of pipelines) await measureLevel(p.servers, p.clients, 10, WARMUP)
    const runs = new Map<string, Array<ConnectedRun>>()
    for (let rep = 0; rep < REPS; rep++) {
      for (const c of LEVELS) {
        for (const p of rep % 2 === 0 ? pipelines : [...pipelines].reverse()) {
          const run = await measureLevel(p.servers, p.clients, c, COUNT)
          const key = `${p.servers.name} ${c}`
          runs.set(key, [...(runs.get(key) ?? []), run])
          if (run.missing > 0) problems.push(`N=${n} ${p.servers.name} c=${c} rep ${rep + 1}: ${run.missing} of ${COUNT} notifications not accepted or not received`)
          console.log(`  rep ${rep + 1} ${p.servers.name} c=${String(c).padEnd(3)} ${f0(run.rate).padStart(6)} notif/s  ${f0(run.cpuUs).padStart(4)} µs CPU/notif  POST→client p99 ${f2(run.p99)} ms`)
        }
      }
    }
    for (const c of LEVELS) {
      for (const name of ["ours", "bare"] as const) {
        const m = medians(runs.get(`${name} ${c}`) ?? [])
        record(`connected c=${c}`, n, name, m)
        details.set(`${n} ${c}`, { ...details.get(`${n} ${c}`), [name]: m })
      }
    }
  } finally {
    await stopAll(clients)
    await Promise.all(servers.map((s) => s.stop()))
  }
}

// ── stored delivery ──────────────────────────────────────────────────────────────────────────────

/** One pipeline with N processes: REPS times OFFLINE new users, MESSAGES stored for each, drained. */
const storedOf = async (n: number, servers: Servers, subscribe: Parameters<typeof measureStored>[1]): Promise<void> => {
  const runs: Array<StoredRun> = []
  try {
    for (let rep = 0; rep < REPS; rep++) {
      const run = await measureStored(servers, subscribe, OFFLINE, MESSAGES, BYTES)
      runs.push(run)
      problems.push(...run.problems.map((p) => `N=${n} ${servers.name} stored rep ${rep + 1}: ${p}`))
      console.log(
        `  rep ${rep + 1} ${servers.name} store ${f0(run.store.rate).padStart(6)} msg/s ${f0(run.store.cpuUs).padStart(4)} µs CPU/msg; ` +
          `drain ${f0(run.drain.rate).padStart(6)} msg/s ${f0(run.drain.cpuUs).padStart(4)} µs CPU/msg`
      )
    }
  } finally {
    await servers.stop()
  }
  record("stored: store", n, servers.name, medians(runs.map((r) => r.store)))
  record("stored: drain", n, servers.name, medians(runs.map((r) => r.drain)))
}

const storedAt = async (n: number): Promise<void> => {
  const bare = await startBareStored(n, freshDir())
  console.log(`\nN=${n}, stored delivery (${OFFLINE} offline clients × ${MESSAGES} messages): bare ${bare.describe()}`)
  await storedOf(n, bare, bareUser(bare.dynamoUrl, bare.httpBase))
  // A user's stored messages above msg_limit would drop it, and a subscription's above
  // max_stored_per_subscription would be refused: room for all of them.
  const ours = await startOurs(n, freshDir(), ["--msg-limit", String(MESSAGES * 2), "--max-stored-per-subscription", String(MESSAGES * 2)])
  console.log(`  ours ${ours.describe()}`)
  await storedOf(n, ours, ourUser(ours.wsUrl))
}

// ── printing ─────────────────────────────────────────────────────────────────────────────────────

/** "142 (31)": CPU µs, and in parentheses the storage's part of it when it has one. */
const cpuCell = (f: Figures | undefined) =>
  f === undefined ? "–" : f.storageUs >= 0.5 ? `${f0(f.cpuUs)} (${f0(f.storageUs)})` : f0(f.cpuUs)
const ratio = (a: number | undefined, b: number | undefined, percent = false) =>
  a === undefined || b === undefined || Number.isNaN(a / b) || b === 0 ? "–" : percent ? `${f0((a / b) * 100)} %` : `${f2(a / b)}×`

const printTable = () => {
  console.log(`\n### bench:scaling — ours (bin/autopush.js --workers N) against bare with N processes (medians of ${REPS} reps)\n`)
  console.log(
    `| test | N | ours notif/s | bare notif/s | ours / bare | ours CPU µs/notif | bare CPU µs/notif | CPU ours / bare | ours p99 ms | bare p99 ms | p99 ours / bare | ours notif/s vs N=${BASE_N} | bare notif/s vs N=${BASE_N} |`
  )
  console.log("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
  for (const [test, byN] of results) {
    const base = byN.get(BASE_N)
    for (const [n, { ours, bare }] of byN) {
      console.log(
        `| ${test} | ${n} | ${f0(ours?.rate ?? Number.NaN)} | ${f0(bare?.rate ?? Number.NaN)} | ${ratio(ours?.rate, bare?.rate, true)} | ` +
          `${cpuCell(ours)} | ${cpuCell(bare)} | ${ratio(ours?.cpuUs, bare?.cpuUs)} | ` +
          `${f2(ours?.p99 ?? Number.NaN)} | ${f2(bare?.p99 ?? Number.NaN)} | ${ratio(ours?.p99, bare?.p99)} | ` +
          `${ratio(ours?.rate, base?.ours?.rate)} | ${ratio(bare?.rate, base?.bare?.rate)} |`
      )
    }
  }
  console.log(
    "\n- notif/s: connected, POST to client (the level's wall time); stored: store, POSTs answered 201; drain, messages from the first hello to the last one delivered." +
      "\n- CPU: user + system from /proc per notification, summed over every server process — ours: the process started (the supervisor, with the embedded dynalite's thread) and its workers; " +
      "bare: its processes (stored: and its dynalite process). In parentheses, the storage's part of it (ours: the dynalite thread; bare: the dynalite process)." +
      `\n- p99: connected, POST→client; stored: store, POST→201; drain, from the hellos to a client's last message (p99 over the ${OFFLINE} clients).`
  )
  if (details.size > 0) printDetails()
  if (problems.length > 0) {
    console.log("\n**Problems:**")
    for (const p of problems) console.log(`- ${p}`)
  }
}

/** Connected delivery by client group (ours), and the load generator's share. */
const printDetails = () => {
  console.log(`\n| connected: N | c | ours p99 resumed / new ms | ours delivered directly, resumed / new | load generator CPU µs/notif ours / bare | load generator busy (of one core) ours / bare |`)
  console.log("| ---: | ---: | ---: | ---: | ---: | ---: |")
  let saturated = false
  for (const [key, { ours, bare }] of details) {
    const [n, c] = key.split(" ")
    const busy = (r: ConnectedRun | undefined) => (r === undefined ? "–" : `${f0(r.loadgenBusy * 100)} %`)
    saturated ||= (ours?.loadgenBusy ?? 0) > 0.9 || (bare?.loadgenBusy ?? 0) > 0.9
    const direct = (share: number | undefined) => (share === undefined || Number.isNaN(share) ? "–" : `${f0(share * 100)} %`)
    console.log(
      `| ${n} | ${c} | ${f2(ours?.p99Resumed ?? Number.NaN)} / ${f2(ours?.p99New ?? Number.NaN)} | ${direct(ours?.directResumed)} / ${direct(ours?.directNew)} | ` +
        `${f0(ours?.loadgenUs ?? Number.NaN)} / ${f0(bare?.loadgenUs ?? Number.NaN)} | ${busy(ours)} / ${busy(bare)} |`
    )
  }
  console.log(`\n- Delivered directly: of a sample of up to 200 messages per group, level and rep, those the workers' traces show delivered through the router port of the worker holding the client rather than stored and drained (median over the reps).`)
  if (saturated) {
    console.log("\n- The load generator (one process) was near a full core in some level: there the rate is bounded by it, not only by the servers.")
  }
}

const printHeader = () => {
  const model = cpus()[0]?.model ?? "unknown CPU"
  console.log(`bench:scaling — N = ${WORKERS.join(", ")} processes; ${TESTS.join(" and ")} delivery; median of ${REPS} rep(s)`)
  console.log(`  CPU: ${model}; ${CORES} core(s) available (os.availableParallelism()); node ${process.version}; load average ${loadavg().map(f2).join(" ")}`)
  console.log(
    `  connected: ${K} clients (ours: ${RESUMED} resumed after a restart, the rest new), ${COUNT} notifications per level, c = ${LEVELS.join(", ")}; ` +
      `stored: ${OFFLINE} offline clients × ${MESSAGES} messages; ${BYTES}-byte bodies`
  )
  console.log(
    `  The load generator and the clients run on these same ${CORES} core(s) as the servers (connected: one process of their own; stored: this process): ` +
      `the servers never have the machine to themselves${CORES <= 2 ? `, and at N = ${CORES} they have no core of their own — the figures are given anyway` : ""}.`
  )
  const over = WORKERS.filter((n) => n > CORES)
  if (over.length > 0) console.log(`  N = ${over.join(", ")} is more than the ${CORES} core(s): the processes take turns on them.`)
}

const main = async () => {
  printHeader()
  for (const n of WORKERS) {
    if (TESTS.includes("connected")) await connectedAt(n)
    if (TESTS.includes("stored")) await storedAt(n)
  }
  printTable()
}

try {
  await main()
} catch (error) {
  console.error("bench:scaling failed:", error)
  process.exitCode = 1
}
