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
 *   behind N dead rows — acked (tombstones), or expired — after the sweep of 11 minutes later, and
 *   before any sweep (the tombstones' 10 minutes, an expired row's minute at most), against a fresh
 *   user with the one message, a user with none, and one with a backlog of 100 live 2 KB messages
 *   (nothing dead, a full page read): median µs of 1,000 reads of each, the cases' stores read in turns
 *   (after 1,000 untimed rounds) so that the machine's ups and downs weigh on every case alike; the
 *   longest hold of the event loop per case; the sweep's time and longest hold;
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

/** A fresh store on a file of its own, with its raw connection and its sweep, open for the caller's scope. */
const openStore = Effect.gen(function*() {
  const path = join(dir, `space-${files++}.sqlite`)
  const options = { path, routerTable: "router", messageTablePrefix: "message", noTableRotation: true }
  const { connection, driver } = yield* scopedSqlite(path, 5000)
  const s = yield* makeSqlStorage(driver, options)
  yield* createActiveTables.pipe(Effect.provideService(Storage, s))
  yield* s.addChannel(uaid(1), "message", chid)
  return { s, connection, sweep: makeSqlMaintenance(driver, options).sweepExpired, path }
})

/** A fresh store for `body`, closed after it. */
const withStore = <A>(body: (s: Store, connection: Connection, sweep: (nowMs: number) => Effect.Effect<number, unknown>, path: string) => Effect.Effect<A, unknown>) =>
  Effect.scoped(Effect.flatMap(openStore, ({ s, connection, sweep, path }) => body(s, connection, sweep, path)))

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

/** Live messages of the user with a backlog: more than a page, nothing dead. */
const BACKLOG = 100

/** Reads timed per case for a median (after as many untimed ones). */
const READS = 1000

/** The first page read at hello, as a returning client's session makes it (10 messages): `expected` of them. */
const helloRead = (s: Store, expected: number) =>
  Effect.flatMap(s.fetchMessages(uaid(1), "message", 10), (page) =>
    page.messages.length === expected ? Effect.void : Effect.die(new Error(`${expected} messages expected, ${page.messages.length} read`)))

/** A turn of the event loop, as a node's other clients have between two reads. */
const turn = Effect.promise(() => new Promise((resolve) => setImmediate(resolve)))

/**
 * The median read (µs) of each store, the stores read in turns (one read of each, then a turn of
 * the event loop), so that what the machine does meanwhile weighs on every case alike.
 */
const mediansInTurns = (stores: ReadonlyArray<{ readonly s: Store; readonly expected: number }>) =>
  Effect.gen(function*() {
    // Untimed rounds first: the compiler's warm-up is paid by no case.
    for (let i = 0; i < READS; i++) yield* Effect.forEach(stores, ({ expected, s }) => helloRead(s, expected))
    const times = stores.map((): Array<number> => [])
    for (let i = 0; i < READS; i++) {
      for (const [k, { expected, s }] of stores.entries()) {
        const start = process.hrtime.bigint()
        yield* helloRead(s, expected)
        times[k]!.push(Number(process.hrtime.bigint() - start) / 1000)
      }
      yield* turn
    }
    return times.map((t) => t.sort((a, b) => a - b)[READS / 2]!)
  })

/** The longest the event loop was held (ms) over 200 reads of one store, a turn between two: the delay monitor samples only there. */
const heldMs = ({ expected, s }: { readonly s: Store; readonly expected: number }) =>
  Effect.gen(function*() {
    const delay = monitorEventLoopDelay({ resolution: 1 })
    delay.enable()
    for (let i = 0; i < 200; i++) yield* Effect.andThen(helloRead(s, expected), turn)
    delay.disable()
    return delay.max / 1e6
  })

/**
 * A store for the hello read behind `DEAD` rows of the kind given (none: a fresh user), after the
 * sweep of 11 minutes later unless `swept` is false, open for the caller's scope.
 */
const helloStore = (kind: "empty" | "fresh" | "acked" | "expired" | "backlog", swept = true) =>
  Effect.gen(function*() {
    const { s, sweep } = yield* openStore
    if (kind === "backlog") yield* s.saveMessages(uaid(1), "message", Array.from({ length: BACKLOG }, (_, i) => message(i, "x".repeat(2048))))
    const batch = 500
    for (let done = 0; (kind === "acked" || kind === "expired") && done < DEAD; done += batch) {
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
    if (kind !== "empty" && kind !== "backlog") yield* s.saveMessage(uaid(1), "message", message(DEAD + 1, "live"))
    return { s, expected: kind === "empty" ? 0 : kind === "backlog" ? 10 : 1, sweep: `${deleted} rows in ${sweepMs.toFixed(0)} ms, the event loop held ${(delay.max / 1e6).toFixed(1)} ms at most` }
  })

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
  const cases = yield* Effect.forEach(
    [["fresh user", "fresh", true], ["a user with no message", "empty", true], [`a backlog of ${BACKLOG} 2 KB messages, nothing dead (a page of 10)`, "backlog", true], ["acked, swept", "acked", true], ["expired, swept", "expired", true], ["acked, not swept yet (tombstones)", "acked", false], ["expired, not swept yet", "expired", false]] as const,
    ([name, kind, swept]) => Effect.map(helloStore(kind, swept), (store) => ({ name, ...store }))
  )
  const medians = yield* mediansInTurns(cases)
  const holds = yield* Effect.forEach(cases, heldMs)
  const figures = cases.map((c, k) =>
    `${c.name} ${medians[k]!.toFixed(0)} µs (${(medians[k]! / medians[0]!).toFixed(1)}×, event loop held ${holds[k]!.toFixed(1)} ms at most)`
  )
  console.log(`hello: first page read, median of ${READS} read in turns; behind ${DEAD} rows but for the first three: ${figures.join("; ")}`)
  console.log(`sweep of the acked rows: ${cases[3]!.sweep}; of the expired rows: ${cases[4]!.sweep}`)
  const log = yield* logBytes
  console.log(`log: per stored 2 KB push ${log.frames.toFixed(2)} frames, ${(log.bytes / 1024).toFixed(1)} KiB`)
})

await Effect.runPromise(Effect.scoped(program)).finally(() => rmSync(dir, { recursive: true, force: true }))
