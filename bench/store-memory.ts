/**
 * `npm run bench:store-memory`: what the embedded store (SQLite) costs the node's process in
 * resident memory per user, at 10,000 and 100,000 users (or --users a,b,…).
 *
 * One process (this script, run again with --expose-gc) opens the store as `npm start` does
 * (`layerSqlite` on `data_dir/autopush.sqlite` with its tables kept, its checkpoint thread) and
 * reads its RSS; then users are added through the real Storage layer as resumed clients have them:
 * each a router record, two channels and one stored message (256 bytes of data). At each step the
 * users are read back as a reconnect reads them (record, channels, first page of messages), then a
 * full GC, a settle, and a reading: RSS (and of it the V8 heap and its external memory), and the
 * database's files on disk (the file, its -wal and -shm).
 *
 * Printed per step: users, RSS growth since the store was open (before any user), per user, against
 * the target (≤ 2 KiB per user at 100,000 users); the V8 heap's growth; the files' bytes per user.
 * Then the writes of the step: how long they took, how long one user's writes took (99th
 * percentile, longest, how many over 10 ms: a write that finds the database locked, by a
 * checkpoint that restarts the log, waits and runs again), and the largest the write-ahead log
 * file was (read after each batch of 1,000 users).
 * SQLite's own memory: `node:sqlite` does not expose `sqlite3_memory_used`; its page cache is
 * bounded by `PRAGMA cache_size` (printed), whatever the number of users.
 *
 * Options (flag or environment): --users/BENCH_USERS (10000,100000), BENCH_SETTLE_MS (2000).
 */
import { spawnSync } from "node:child_process"
import { mkdtempSync, readFileSync, rmSync, statSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { DatabaseSync } from "node:sqlite"
import { Context, Effect, Layer } from "effect"
import { layerSqlite } from "../src/storage/sqlite/layer.ts"
import { Storage } from "../src/storage/Storage.ts"
import { layerTableKeeper } from "../src/storage/tableKeeper.ts"
import { option, quantile } from "./harness.ts"
import { rssBytes } from "./storm-node.ts"

const STEPS = option("users", "BENCH_USERS", "10000,100000").split(",").map(Number)
const SETTLE_MS = Number(process.env["BENCH_SETTLE_MS"] ?? 2_000)
const TARGET_BYTES = 2 * 1024
const BATCH = 1_000
const DATA = "x".repeat(256)

const gc = globalThis.gc
if (gc === undefined) {
  // A full GC before each reading: the same script again, with --expose-gc.
  const run = spawnSync(process.execPath, ["--expose-gc", ...process.argv.slice(1)], { stdio: "inherit" })
  process.exit(run.status ?? 1)
}

const uaidOf = (i: number) => i.toString(16).padStart(32, "0")
const channelOf = (i: number, c: number) => `${i.toString(16).padStart(8, "0")}-0000-4000-8000-${c.toString(16).padStart(12, "0")}`
/** The database's files: the file, its write-ahead log, its shared index. */
const filesBytes = (path: string) =>
  ["", "-wal", "-shm"].map((suffix) => {
    try {
      return statSync(path + suffix).size
    } catch {
      return 0
    }
  })
/** RSS split as the kernel counts it: anonymous memory, file pages mapped, shared memory (SQLite's -shm index is mapped shared). */
const rssParts = () => {
  const status = readFileSync("/proc/self/status", "utf8")
  const kB = (field: string) => Number(new RegExp(`${field}:\\s+(\\d+) kB`).exec(status)?.[1] ?? 0) * 1024
  return { anon: kB("RssAnon"), file: kB("RssFile"), shmem: kB("RssShmem") }
}
const kib = (bytes: number) => (bytes / 1024).toFixed(2)
const mib = (bytes: number) => (bytes / 1024 / 1024).toFixed(1)

const dir = mkdtempSync(join(tmpdir(), "autopush-store-memory-"))
const path = join(dir, "data", "autopush.sqlite")
const options = { path, routerTable: "router", messageTablePrefix: "message", noTableRotation: false }

const settled = async () => {
  for (let i = 0; i < 3; i++) gc!()
  await new Promise((r) => setTimeout(r, SETTLE_MS))
  gc!()
  const { heapUsed, external } = process.memoryUsage()
  return { rss: rssBytes(process.pid), heap: heapUsed + external, ...rssParts() }
}

try {
  await Effect.runPromise(Effect.scoped(Effect.gen(function*() {
    const context = yield* Layer.build(layerTableKeeper.pipe(Layer.provideMerge(layerSqlite(options))))
    const storage = Context.get(context, Storage)
    const table = yield* storage.currentMessageTable
    const before = yield* Effect.promise(settled)
    const cache = new DatabaseSync(path, { readOnly: true })
    const cacheSize = (cache.prepare("PRAGMA cache_size").get() as { cache_size: number }).cache_size
    cache.close()
    console.log(`bench:store-memory: the embedded SQLite store in this process (pid ${process.pid}), RSS ${mib(before.rss)} MiB once open, before any user`)
    console.log(`  SQLite's own memory: not exposed by node:sqlite; its page cache per connection is bounded by cache_size = ${cacheSize} (${cacheSize < 0 ? `${-cacheSize} KiB` : `${cacheSize} pages`})`)
    console.log("")
    console.log("| users | RSS growth MiB | RSS per user | of it anonymous / file / shared per user | V8 heap + external per user | database / log / index MiB | files per user | target ≤ 2 KiB per user at 100,000 |")
    console.log("|---:|---:|---:|---|---:|---|---:|---|")
    let users = 0
    const now = Date.now()
    const writes: Array<{ readonly step: number; readonly seconds: number; readonly userMs: Array<number>; readonly walMax: number }> = []
    for (const step of STEPS) {
      const started = performance.now()
      const userMs: Array<number> = []
      let walMax = 0
      for (; users < step; users += BATCH) {
        const batch = Array.from({ length: Math.min(BATCH, step - users) }, (_, k) => users + k)
        yield* Effect.forEach(batch, (i) =>
          Effect.gen(function*() {
            const userStarted = performance.now()
            const uaid = uaidOf(i)
            yield* storage.registerUser({ uaid, routerType: "webpush", routerData: {}, connectedAt: now, currentMonth: table, nodeId: "http://127.0.0.1:8081" })
            yield* storage.addChannels(uaid, table, [channelOf(i, 0), channelOf(i, 1)])
            yield* storage.saveMessage(uaid, table, {
              channelId: channelOf(i, 0),
              version: `v${i}`,
              ttl: 86_400,
              timestamp: Math.floor(now / 1000),
              sortkeyTimestamp: now + i,
              data: DATA,
              headers: { encoding: "aes128gcm" }
            })
            userMs.push(performance.now() - userStarted)
          }), { discard: true })
        walMax = Math.max(walMax, filesBytes(path)[1]!)
      }
      writes.push({ step, seconds: (performance.now() - started) / 1000, userMs, walMax })
      // As a reconnect reads them.
      yield* Effect.forEach(Array.from({ length: step }, (_, i) => i), (i) =>
        Effect.gen(function*() {
          const uaid = uaidOf(i)
          yield* storage.getUser(uaid)
          yield* storage.getChannels(uaid, table)
          yield* storage.fetchTimestampMessages(uaid, table, undefined, 10)
        }), { discard: true })
      const now_ = yield* Effect.promise(settled)
      const growth = now_.rss - before.rss
      const files = filesBytes(path)
      const total = files.reduce((a, b) => a + b, 0)
      const parts = [now_.anon - before.anon, now_.file - before.file, now_.shmem - before.shmem].map((b) => kib(b / step)).join(" / ")
      const verdict = step === 100_000 ? (growth / step <= TARGET_BYTES ? "met" : "NOT met") : ""
      console.log(
        `| ${step} | ${mib(growth)} | ${kib(growth / step)} KiB | ${parts} KiB | ${kib((now_.heap - before.heap) / step)} KiB | ${files.map(mib).join(" / ")} | ${kib(total / step)} KiB | ${verdict} |`
      )
    }
    console.log("")
    console.log("| users written (since the previous step) | time to write | per 1,000 users | one user's writes: p99 / longest | over 10 ms | largest write-ahead log during the writes |")
    console.log("|---:|---:|---:|---|---:|---:|")
    let from = 0
    for (const { step, seconds, userMs, walMax } of writes) {
      console.log(
        `| ${from}–${step} | ${seconds.toFixed(1)} s | ${(seconds * 1000 * 1000 / (step - from)).toFixed(0)} ms | ${quantile(userMs, 0.99).toFixed(2)} / ${userMs.reduce((a, b) => Math.max(a, b), 0).toFixed(1)} ms | ${userMs.filter((ms) => ms > 10).length} | ${mib(walMax)} MiB |`
      )
      from = step
    }
  })))
} finally {
  rmSync(dir, { recursive: true, force: true })
}
