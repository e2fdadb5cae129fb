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
 * worker (throughput), and the main thread's CPU per call (what the event loop pays). Options:
 * --calls=N/BENCH_CALLS (5000).
 */
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { DatabaseSync } from "node:sqlite"
import { MessageChannel, Worker } from "node:worker_threads"

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
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
}

await main()
