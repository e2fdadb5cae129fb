/**
 * `npm run bench:sqlite-space`: what the embedded SQLite store keeps of dead messages and what they
 * cost, through the real store (`makeSqlStorage` on `scopedSqlite`) in this process, one fresh file
 * per measure:
 *
 * - space: N pushes to an offline client stored one at a time, then drained as Firefox does (a
 *   page of 10 read, then acked), then the sweep run as it would have run 11 minutes later; twice.
 *   Printed: the database's size (its pages, log included) and its free pages after each round, and
 *   the log bytes the stores and the drain with the sweep appended per message;
 * - hello: the first page read at hello (`fetchMessages`, 10) of a user with one live message
 *   behind N dead rows — acked (tombstones), or expired — after the sweep of 11 minutes later,
 *   against a fresh user with the one message (median µs of 1,000 reads after 1,000 untimed ones), and behind N acked or
 *   expired rows before any sweep (the tombstones' 10 minutes, an expired row's minute at most);
 *   the sweep's time and longest hold of the event loop;
 * - log: the write-ahead log bytes one stored push appends (frames counted in the WAL index as
 *   each save commits, restarts of the log included), for 2 KB messages.
 *
 * `--root DIR` (or BENCH_ROOT) runs it on the sources of another checkout (its `src/`), e.g. an
 * earlier commit extracted with `git archive`, so that before and after run on one machine in one
 * go. Options: --messages/BENCH_MESSAGES (20000), --dead/BENCH_DEAD (100000).
 */
import { Effect } from "effect"
import { closeSync, mkdtempSync, openSync, readSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join, resolve } from "node:path"
import { monitorEventLoopDelay } from "node:perf_hooks"
import { DatabaseSync } from "node:sqlite"
import { option } from "./harness.ts"

const ROOT = resolve(option("root", "BENCH_ROOT", join(import.meta.dirname, "..")))
const MESSAGES = Number(option("messages", "BENCH_MESSAGES", "20000"))
const DEAD = Number(option("dead", "BENCH_DEAD", "100000"))

const { scopedSqlite } = await import(join(ROOT, "src/storage/sqlite/driver.ts")) as typeof import("../src/storage/sqlite/driver.ts")
const { makeSqlStorage } = await import(join(ROOT, "src/storage/sql/storage.ts")) as typeof import("../src/storage/sql/storage.ts")
const { makeSqlMaintenance } = await import(join(ROOT, "src/storage/sql/maintenance.ts")) as typeof import("../src/storage/sql/maintenance.ts")
const { createActiveTables, Storage } = await import(join(ROOT, "src/storage/Storage.ts")) as typeof import("../src/storage/Storage.ts")

const dir = mkdtempSync(join(tmpdir(), "autopush-space-"))
const chid = "00000000-0000-4000-8000-000000000001"
const uaid = (n: number) => n.toString(16).padStart(32, "0")
const LATER_MS = 11 * 60_000
let files = 0

type Store = import("../src/storage/Storage.ts").StorageService
type Connection = import("../src/storage/sqlite/connection.ts").SqliteConnection

/** A fresh store on a file of its own, with its raw connection and its sweep, for `body`. */
const withStore = <A>(body: (s: Store, connection: Connection, sweep: (nowMs: number) => Effect.Effect<number, unknown>, path: string) => Effect.Effect<A, unknown>) =>
  Effect.gen(function*() {
    const path = join(dir, `space-${files++}.sqlite`)
    const options = { path, routerTable: "router", messageTablePrefix: "message", noTableRotation: true }
    const { connection, driver } = yield* scopedSqlite(path, 5000)
    const s = yield* makeSqlStorage(driver, options)
    yield* createActiveTables.pipe(Effect.provideService(Storage, s))
    yield* s.addChannel(uaid(1), "message", chid)
    return yield* body(s, connection, makeSqlMaintenance(driver, options).sweepExpired, path)
  }).pipe(Effect.scoped)

const BASE_MS = Date.now()
let sequence = 0
/** A timestamp message of its own sort key (one ms after the previous one's). */
const message = (i: number, data: string, ttl = 86_400, ageS = 0) => {
  const ms = BASE_MS + sequence++
  return { channelId: chid, version: `v${ms}-${i}`, ttl, timestamp: Math.floor(Date.now() / 1000) - ageS, sortkeyTimestamp: ms, data }
}

/** Everything stored for the user, read a page of 10 at a time and acked page by page; `acked` after each ack. */
const drain = (s: Store, acked: () => void) =>
  Effect.gen(function*() {
    let page = yield* s.fetchMessages(uaid(1), "message", 10)
    for (;;) {
      yield* s.ackMessages(uaid(1), "message", page.messages.map((m) => ({ key: { kind: "timestamp" as const, channelId: chid, sortkeyTimestamp: m.sortkeyTimestamp! }, version: m.version })))
      acked()
      if (!page.more) return
      page = yield* s.fetchTimestampMessages(uaid(1), "message", page.lastSortKey, 10)
    }
  })

const pragma = (connection: Connection, name: string) => Number(connection.db.prepare(`PRAGMA ${name}`).get()?.[name])

/** Frames appended to the log since the last call, restarts of the log included (call it after each commit: a restart between two calls hides what came before it). */
const logMeter = (path: string) => {
  let last = walFrames(path)
  return () => {
    const now = walFrames(path)
    const appended = now >= last ? now - last : now
    last = now
    return appended
  }
}

const space = withStore((s, connection, sweep, path) =>
  Effect.gen(function*() {
    const data = "x".repeat(2048)
    const pageBytes = pragma(connection, "page_size") + 24
    const rounds: Array<{ readonly mib: number; readonly free: number; readonly storeKiB: number; readonly drainKiB: number }> = []
    for (let round = 0; round < 2; round++) {
      const appended = logMeter(path)
      let storeFrames = 0
      for (let i = 0; i < MESSAGES; i++) {
        yield* s.saveMessage(uaid(1), "message", message(i, data))
        storeFrames += appended()
      }
      const storeKiB = (storeFrames * pageBytes) / 1024 / MESSAGES
      let drainFrames = 0
      yield* drain(s, () => drainFrames += appended())
      // A reader holds its snapshot through the sweep: no checkpoint completes, so the log is not restarted meanwhile.
      const reader = new DatabaseSync(path)
      reader.exec("BEGIN")
      reader.prepare("SELECT count(*) FROM router").get()
      yield* sweep(Date.now() + LATER_MS)
      drainFrames += appended()
      reader.exec("COMMIT")
      reader.close()
      const drainKiB = (drainFrames * pageBytes) / 1024 / MESSAGES
      // The database's size in pages (what the file is once the log is checkpointed into it).
      rounds.push({ mib: (pragma(connection, "page_count") * pragma(connection, "page_size")) / 1048576, free: pragma(connection, "freelist_count"), storeKiB, drainKiB })
    }
    return rounds
  }))

/** Reads timed for a median (after as many untimed ones). */
const READS = 1000

/** The reads' median (µs) and the longest the event loop was held meanwhile (ms). */
const medianReadUs = (s: Store) =>
  Effect.gen(function*() {
    // Untimed reads first: the first case measured would otherwise pay the compiler's warm-up.
    for (let i = 0; i < READS; i++) yield* s.fetchMessages(uaid(1), "message", 10)
    const times: Array<number> = []
    const delay = monitorEventLoopDelay({ resolution: 1 })
    delay.enable()
    for (let i = 0; i < READS; i++) {
      const start = process.hrtime.bigint()
      const page = yield* s.fetchMessages(uaid(1), "message", 10)
      times.push(Number(process.hrtime.bigint() - start) / 1000)
      if (page.messages.length !== 1) throw new Error(`one live message expected, ${page.messages.length} read`)
      // A turn of the event loop between reads, as a node's other clients have: the delay monitor
      // samples only there, so a read that held the loop shows as the delay of that turn.
      yield* Effect.promise(() => new Promise((resolve) => setImmediate(resolve)))
    }
    delay.disable()
    return { us: times.sort((a, b) => a - b)[READS / 2]!, heldMs: delay.max / 1e6 }
  })

/** The hello read behind `dead` rows of the kind given (none: a fresh user), after the sweep of 11 minutes later unless `swept` is false. */
const hello = (kind: "fresh" | "acked" | "expired", swept = true) =>
  withStore((s, _connection, sweep) =>
    Effect.gen(function*() {
      const batch = 500
      for (let done = 0; kind !== "fresh" && done < DEAD; done += batch) {
        const messages = Array.from({ length: batch }, (_, i) => kind === "expired" ? message(done + i, "", 60, 120) : message(done + i, ""))
        yield* s.saveMessages(uaid(1), "message", messages)
        if (kind === "acked") {
          yield* s.ackMessages(uaid(1), "message", messages.map((m) => ({ key: { kind: "timestamp" as const, channelId: chid, sortkeyTimestamp: m.sortkeyTimestamp }, version: m.version })))
        }
      }
      const delay = monitorEventLoopDelay({ resolution: 1 })
      delay.enable()
      const sweepStart = performance.now()
      const deleted = swept ? yield* sweep(Date.now() + LATER_MS) : 0
      const sweepMs = performance.now() - sweepStart
      delay.disable()
      yield* s.saveMessage(uaid(1), "message", message(DEAD + 1, "live"))
      return { ...yield* medianReadUs(s), sweep: `${deleted} rows in ${sweepMs.toFixed(0)} ms, the event loop held ${(delay.max / 1e6).toFixed(1)} ms at most` }
    }))

/** The WAL index's count of frames in the log (its header in the -shm file: `mxFrame` at byte 16). */
const walFrames = (path: string): number => {
  const fd = openSync(`${path}-shm`, "r")
  const header = Buffer.alloc(20)
  readSync(fd, header, 0, 20, 0)
  closeSync(fd)
  return header.readUInt32LE(16)
}

const logBytes = withStore((s, connection, _sweep, path) =>
  Effect.gen(function*() {
    const data = "x".repeat(2048)
    const pageBytes = pragma(connection, "page_size") + 24
    const n = Math.min(MESSAGES, 5000)
    const appended = logMeter(path)
    let frames = 0
    for (let i = 0; i < n; i++) {
      yield* s.saveMessage(uaid(1), "message", message(i, data))
      frames += appended()
    }
    return { frames: frames / n, bytes: (frames * pageBytes) / n }
  }))

const program = Effect.gen(function*() {
  console.log(`sources: ${ROOT}`)
  const rounds = yield* space
  rounds.forEach((r, i) => console.log(`space: after round ${i + 1} of ${MESSAGES} drained 2 KB messages: ${r.mib.toFixed(1)} MiB, ${r.free} free pages; log per message of the stores ${r.storeKiB.toFixed(1)} KiB, of the drain and sweep ${r.drainKiB.toFixed(1)} KiB`))
  const fresh = yield* hello("fresh")
  const acked = yield* hello("acked")
  const expired = yield* hello("expired")
  const unswept = yield* hello("acked", false)
  const unsweptExpired = yield* hello("expired", false)
  // The fresh user again, last: the figure the others are compared with is the better of the two
  // (the first store the process reads from may pay for what the space measure left behind).
  const freshAgain = yield* hello("fresh")
  const baseline = freshAgain.us < fresh.us ? freshAgain : fresh
  const ratio = (read: { readonly us: number; readonly heldMs: number }) =>
    `${read.us.toFixed(0)} µs (${(read.us / baseline.us).toFixed(1)}×, event loop held ${read.heldMs.toFixed(1)} ms at most)`
  console.log(
    `hello: first page read, median of ${READS}: fresh user ${ratio(baseline)} (first ${fresh.us.toFixed(0)}, last ${freshAgain.us.toFixed(0)} µs); behind ${DEAD} rows, swept 11 minutes later: acked ${ratio(acked)}, ` +
      `expired ${ratio(expired)}; not swept yet: acked (tombstones) ${ratio(unswept)}, expired ${ratio(unsweptExpired)}`
  )
  console.log(`sweep of the acked rows: ${acked.sweep}; of the expired rows: ${expired.sweep}`)
  const log = yield* logBytes
  console.log(`log: per stored 2 KB push ${log.frames.toFixed(2)} frames, ${(log.bytes / 1024).toFixed(1)} KiB`)
})

await Effect.runPromise(program).finally(() => rmSync(dir, { recursive: true, force: true }))
