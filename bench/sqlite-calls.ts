/**
 * `npm run bench:sqlite`: what a `node:sqlite` call costs where the embedded store runs it —
 * synchronously on the main thread, or on a worker thread owning the database and answering
 * requests over a MessagePort. The same two operations both ways, on a WAL file with
 * `synchronous=NORMAL` (as the store opens it):
 *
 * - insert: one 3 KB message row (INSERT … ON CONFLICT DO NOTHING);
 * - read: 10 message rows of one user by key range.
 *
 * Printed per operation: µs per call one at a time (latency), calls/s with 50 in flight on the
 * worker (throughput), and the main thread's CPU per call (what the event loop pays). Then
 * contention: 1, 2 and 4 processes storing messages into one file at once through the store
 * (`layerSqlite` saveMessage, 3 KB each), as the workers of a node do — the calls/s of all
 * together, each call's time (p50, p99, max) and the longest the event loop of a process was held
 * (a call that finds another process writing is tried again later, the loop free meanwhile).
 * Options: --calls=N/BENCH_CALLS (5000).
 */
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { DatabaseSync } from "node:sqlite"
import { fork } from "node:child_process"
import { monitorEventLoopDelay } from "node:perf_hooks"
import { MessageChannel, Worker } from "node:worker_threads"
import { Context, Effect, Layer } from "effect"
import { layerSqlite } from "../src/storage/sqlite/layer.ts"
import { Storage } from "../src/storage/Storage.ts"

const CALLS = Number(process.argv.find((a) => a.startsWith("--calls="))?.slice(8) ?? process.env["BENCH_CALLS"] ?? "5000")

const SCHEMA = `CREATE TABLE IF NOT EXISTS m (uaid TEXT, k TEXT, data TEXT, expiry INTEGER, PRIMARY KEY (uaid, k))`
const INSERT = "INSERT INTO m (uaid, k, data, expiry) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING"
const READ = "SELECT * FROM m WHERE uaid = ? AND k > ? ORDER BY k LIMIT 10"

/** The database side, the same code on either thread. */
const open = (path: string) => {
  const db = new DatabaseSync(path, { timeout: 5000 })
  db.exec("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL")
  db.exec(SCHEMA)
  const insert = db.prepare(INSERT)
  const read = db.prepare(READ)
  const data = "x".repeat(3000)
  return (op: "insert" | "read", i: number): number =>
    op === "insert"
      ? Number(insert.run(`u${i % 100}`, `02:${String(i).padStart(13, "0")}`, data, i).changes)
      : read.all(`u${i % 100}`, "02:").length
}

const workerSource = `
const { parentPort } = require("node:worker_threads")
const { DatabaseSync } = require("node:sqlite")
parentPort.once("message", ({ path, port }) => {
  const db = new DatabaseSync(path, { timeout: 5000 })
  db.exec("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL")
  db.exec(${JSON.stringify(SCHEMA)})
  const insert = db.prepare(${JSON.stringify(INSERT)})
  const read = db.prepare(${JSON.stringify(READ)})
  const data = "x".repeat(3000)
  port.on("message", ({ id, op, i }) => {
    const result = op === "insert"
      ? Number(insert.run("u" + (i % 100), "02:" + String(i).padStart(13, "0"), data, i).changes)
      : read.all("u" + (i % 100), "02:").length
    port.postMessage({ id, result })
  })
})`

const cpuUs = () => {
  const u = process.cpuUsage()
  return u.user + u.system
}

const fmt = (n: number) => n.toLocaleString("en-US", { maximumFractionDigits: 1 })

/** A contending process: CALLS messages stored into the file at `path`, each timed; its call times (µs) and the event loop's longest delay (µs) to the parent. */
const contend = async (path: string) => {
  const offset = Number(process.env["BENCH_OFFSET"])
  const delay = monitorEventLoopDelay({ resolution: 1 })
  const times: Array<number> = []
  const data = "x".repeat(3000)
  await Effect.runPromise(Effect.scoped(Effect.gen(function*() {
    const context = yield* Layer.build(layerSqlite({ path, routerTable: "router", messageTablePrefix: "message", noTableRotation: true }))
    const storage = Context.get(context, Storage)
    yield* storage.createTables(["message"])
    delay.enable()
    for (let i = 0; i < CALLS; i++) {
      const t0 = performance.now()
      yield* storage.saveMessage(`u${i % 100}`, "message", { channelId: "c", version: `v${offset + i}`, ttl: 60, timestamp: 1, sortkeyTimestamp: offset + i, data })
      times.push((performance.now() - t0) * 1000)
    }
    delay.disable()
  })))
  process.send?.({ times, maxDelayUs: delay.max / 1000 }, () => process.exit(0))
}

const percentile = (sorted: ReadonlyArray<number>, p: number) => sorted[Math.min(sorted.length - 1, Math.floor(sorted.length * p))] ?? 0

/** `n` processes storing into one file at once: [calls/s of all, p50, p99, max µs per call, longest event loop delay µs]. */
const contention = async (path: string, n: number) => {
  const t0 = performance.now()
  const all = await Promise.all(Array.from({ length: n }, (_, k) =>
    new Promise<{ times: Array<number>; maxDelayUs: number }>((resolve, reject) => {
      const child = fork(process.argv[1] as string, [`--calls=${CALLS}`], { env: { ...process.env, BENCH_CONTEND: path, BENCH_OFFSET: String((k + 10) * CALLS) } })
      child.once("message", (result) => resolve(result as { times: Array<number>; maxDelayUs: number }))
      child.once("error", reject)
    })))
  const seconds = (performance.now() - t0) / 1000
  const sorted = all.flatMap((r) => r.times).sort((a, b) => a - b)
  const maxDelay = Math.max(...all.map((r) => r.maxDelayUs))
  return [fmt((n * CALLS) / seconds), fmt(percentile(sorted, 0.5)), fmt(percentile(sorted, 0.99)), fmt(sorted.at(-1) ?? 0), fmt(maxDelay)]
}

const main = async () => {
  const dir = mkdtempSync(join(tmpdir(), "autopush-sqlite-bench-"))
  try {
    const rows: Array<Array<string>> = []
    // main thread, synchronous
    const call = open(join(dir, "main.sqlite"))
    for (const op of ["insert", "read"] as const) {
      const cpu0 = cpuUs()
      const t0 = performance.now()
      for (let i = 0; i < CALLS; i++) call(op, i)
      const us = ((performance.now() - t0) * 1000) / CALLS
      rows.push([`${op}, main thread`, fmt(us), fmt(1e6 / us), fmt((cpuUs() - cpu0) / CALLS)])
    }
    // worker thread over a MessagePort
    const worker = new Worker(workerSource, { eval: true })
    const { port1, port2 } = new MessageChannel()
    worker.postMessage({ path: join(dir, "worker.sqlite"), port: port2 }, [port2])
    const pending = new Map<number, () => void>()
    port1.on("message", ({ id }: { id: number }) => {
      pending.get(id)?.()
      pending.delete(id)
    })
    let next = 0
    const request = (op: string, i: number) =>
      new Promise<void>((resolve) => {
        const id = next++
        pending.set(id, resolve)
        port1.postMessage({ id, op, i })
      })
    for (const op of ["insert", "read"] as const) {
      const offset = op === "insert" ? CALLS : 0
      const cpu0 = cpuUs()
      const t0 = performance.now()
      for (let i = 0; i < CALLS; i++) await request(op, offset + i)
      const serialUs = ((performance.now() - t0) * 1000) / CALLS
      const t1 = performance.now()
      let i = 0
      await Promise.all(Array.from({ length: 50 }, async () => {
        while (i < CALLS) await request(op, offset * 2 + i++)
      }))
      const parallelUs = ((performance.now() - t1) * 1000) / CALLS
      // process CPU includes the worker's: the main thread's share is what the calls cost minus the database work
      rows.push([`${op}, worker (1 in flight)`, fmt(serialUs), fmt(1e6 / serialUs), `${fmt((cpuUs() - cpu0) / (2 * CALLS))} (both threads)`])
      rows.push([`${op}, worker (50 in flight)`, fmt(parallelUs), fmt(1e6 / parallelUs), ""])
    }
    await worker.terminate()
    port1.close()
    console.log(`node:sqlite, ${CALLS} calls each, WAL + synchronous=NORMAL, 3 KB rows`)
    console.log(["operation", "µs/call", "calls/s", "CPU µs/call"].join(" | "))
    for (const row of rows) console.log(row.join(" | "))
    console.log(`\nmessages stored into one file by several processes at once, through the store (${CALLS} each; process start-up included in calls/s)`)
    console.log(["processes", "calls/s, all", "p50 µs", "p99 µs", "max µs", "longest event loop delay µs"].join(" | "))
    for (const n of [1, 2, 4]) console.log([String(n), ...(await contention(join(dir, `contended-${n}.sqlite`), n))].join(" | "))
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
}

const contended = process.env["BENCH_CONTEND"]
if (contended !== undefined) await contend(contended)
else await main()
