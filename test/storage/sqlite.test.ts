/**
 * The SQLite store: the storage contract (every layer of it on one database file, each its own
 * connection), then what is its own — several processes on one file, a lock held by another
 * process, writes from concurrent fibers (alone, and waiting together for a lock), the sweep of expired rows, space given back, checkpoints off the event loop, a file
 * that is not a database.
 */
import { spawn } from "node:child_process"
import { mkdtempSync, rmSync, statSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { DatabaseSync } from "node:sqlite"
import { assert, describe, it } from "@effect/vitest"
import { Context, Effect, Fiber, Layer, Logger } from "effect"
import { TestClock } from "effect/testing"
import { afterAll } from "vitest"
import { layerSqlite } from "../../src/storage/sqlite/layer.ts"
import { scopedSqlite } from "../../src/storage/sqlite/driver.ts"
import { TOMBSTONE_SECONDS } from "../../src/storage/model.ts"
import { makeSqlMaintenance } from "../../src/storage/sql/maintenance.ts"
import { SWEEP_BATCH } from "../../src/storage/sql/sweep.ts"
import { createActiveTables, Storage, StorageError, type StorageService, storageUnavailable } from "../../src/storage/Storage.ts"
import { DiskFull, Unknown } from "../../src/storage/failures.ts"
import { makeSqlStorage } from "../../src/storage/sql/storage.ts"
import { storageContract } from "./contract.ts"

const dir = mkdtempSync(join(tmpdir(), "autopush-sqlite-"))
afterAll(() => rmSync(dir, { recursive: true, force: true }))

storageContract("sqlite", (options) => layerSqlite({ ...options, path: join(dir, "autopush.sqlite") }))

const uaid = (n: number) => n.toString(16).padStart(32, "0")
const chid = "00000000-0000-4000-8000-000000000001"
const T0 = Date.UTC(2034, 4, 15, 12)
let tables = 0
const fresh = (path: string, timeoutMs?: number) => {
  const name = `s${tables++}`
  return { path, routerTable: `${name}_router`, messageTablePrefix: `${name}_message`, noTableRotation: true, timeoutMs }
}

/** A store on that file for the rest of the scope. */
const openStore = (options: ReturnType<typeof fresh>) => Effect.map(Layer.build(layerSqlite(options)), (context) => Context.get(context, Storage))

/**
 * 200 writes on 7 users (each gets every kind of write), many of them conditional and refused (an older connectedAt, a version
 * already taken, cancelled or not there, a full channel set, a node id no longer the user's) and
 * some failing (a missing table; a save whose second message cannot be stored, after its first
 * was), each to its outcome as text.
 */
const contendedWrites = (s: StorageService, table: string) =>
  Array.from({ length: 200 }, (_, i) => {
    // User by user, round by round, each user's writes in the same order.
    const user = uaid(i % 7)
    const kind = Math.floor(i / 7) % 8
    const round = Math.floor(i / 56)
    const key = { kind: "timestamp", channelId: chid, sortkeyTimestamp: T0 } as const
    const message = (version: string, ttl: number | bigint = 600) => ({ channelId: chid, version, ttl: ttl as number, timestamp: T0 / 1000, sortkeyTimestamp: T0 })
    const saved = ["v0", "v0", "v1", "v1"][round]!
    const cancelled = ["v0", "v1", "v1", "v0"][round]!
    const write: Effect.Effect<unknown, StorageError> = [
      () => s.registerUser({ uaid: user, routerType: "webpush", routerData: { i }, connectedAt: T0 + ((i * 7) % 13), nodeId: `node-${i % 3}` }),
      () => s.saveMessage(user, table, message(saved)),
      () => s.cancelMessage(user, table, key, cancelled),
      () => s.addChannel(user, table, `0000000${i % 5}-0000-4000-8000-000000000001`, 2),
      () => s.clearNodeId(user, `node-${i % 3}`, T0 + ((i * 5) % 13)),
      () => s.saveMessages(user, table, round % 2 === 1 ? [message(`w${i}`), message("too big", 1n << 70n)] : [message(`w${round}`)]),
      () => s.deleteMessage(user, table, { ...key, sortkeyTimestamp: T0 + 1 }, `w${round === 3 ? 0 : round + 1}`),
      () => round % 2 === 0 ? s.saveMessage(user, `${table}_missing`, message("nowhere")) : s.ackMessages(user, table, [{ key, version: "w0" }])
    ][kind]!()
    return write.pipe(Effect.match({ onFailure: (e) => `failed: ${e.operation}`, onSuccess: (value) => JSON.stringify(value) ?? "done" }))
  })

/** The outcomes hold refusals and failures as well as successes (the writes are contended). */
const assertMixed = (outcomes: ReadonlyArray<string>) => {
  for (const outcome of ["true", "false", "\"stored\"", "\"taken\"", "\"cancelled\"", "failed: saveMessage", "failed: saveMessages"]) {
    assert.include(outcomes, outcome)
  }
}

/** The rows written together are those written one at a time; of a save that failed, nothing. */
const assertSameRows = (rows: ReturnType<typeof rowsOf>, alone: ReturnType<typeof rowsOf>) => {
  assert.deepStrictEqual(rows, alone, "the same rows")
  assert.isTrue(rows[1]!.some((row) => row["updateid"] === "w2"), "the saves that succeeded are there")
  assert.isFalse(rows[1]!.some((row) => /^w\d\d/.test(String(row["updateid"]))), "a save that failed on its second message left nothing of its first")
}

/** Every row of the store's router and message tables in that file. */
const rowsOf = (path: string, options: ReturnType<typeof fresh>) => {
  const db = new DatabaseSync(path, { readOnly: true })
  try {
    return [options.routerTable, options.messageTablePrefix].map((table) => db.prepare(`SELECT * FROM "${table}" ORDER BY 1, 2`).all())
  } finally {
    db.close()
  }
}

interface WriterResults {
  readonly startedAt: number
  readonly finishedAt: number
  readonly registered: Array<boolean>
  readonly saved: Array<string>
  readonly added: Array<boolean>
}

/** Start the writer fixture; once it is loaded, `go` starts its writes and resolves with what it printed. */
const startWriter = (args: ReadonlyArray<string>) =>
  new Promise<{ readonly go: () => Promise<WriterResults> }>((ready, reject) => {
    const proc = spawn(process.execPath, [join(import.meta.dirname, "fixtures", "sqlite-writer.ts"), ...args], { stdio: ["pipe", "pipe", "pipe"] })
    let out = ""
    let err = ""
    const done = new Promise<WriterResults>((resolve, fail) =>
      proc.on("exit", (code) => (code === 0 ? resolve(JSON.parse(out.slice(out.indexOf("\n") + 1))) : fail(new Error(`writer exited ${code}: ${err}`)))))
    proc.stdout.on("data", (chunk: Buffer) => {
      out += chunk.toString()
      if (out === "ready\n") ready({ go: () => (proc.stdin.write("go\n"), done) })
    })
    proc.stderr.on("data", (chunk: Buffer) => (err += chunk.toString()))
    proc.on("error", reject)
    done.catch(reject)
  })

describe("SQLite store", () => {
  it.live("two processes writing one file: each conditional write is won by exactly one", () =>
    Effect.gen(function*() {
      const options = fresh(join(dir, "shared.sqlite"))
      yield* createActiveTables.pipe(Effect.provide(layerSqlite(options)))
      const count = 300
      const args = (writer: string) => [options.path, options.routerTable, options.messageTablePrefix, writer, String(count)]
      const writers = yield* Effect.promise(() => Promise.all([startWriter(args("1")), startWriter(args("2"))]))
      const [a, b] = (yield* Effect.promise(() => Promise.all(writers.map((w) => w.go())))) as [WriterResults, WriterResults]
      assert.isTrue(a.startedAt < b.finishedAt && b.startedAt < a.finishedAt, "the two writers ran at the same time")
      for (let i = 0; i < count; i++) {
        assert.strictEqual(Number(a.registered[i]) + Number(b.registered[i]), 1, `register of user ${i}`)
        assert.deepStrictEqual([a.saved[i], b.saved[i]].sort(), ["stored", "taken"], `message of user ${i}`)
        assert.strictEqual(Number(a.added[i]) + Number(b.added[i]), 1, `channel of user ${i}`)
      }
      const s = yield* openStore(options)
      // What is stored is what the winners were told.
      for (const i of [0, count - 1]) {
        const user = yield* s.getUser(uaid(i))
        assert.strictEqual(user?.routerData["writer"], a.registered[i] ? "1" : "2")
        const page = yield* s.fetchTimestampMessages(uaid(i), options.messageTablePrefix, undefined, 10)
        assert.deepStrictEqual(page.messages.map((m) => m.version), [`${a.saved[i] === "stored" ? "1" : "2"}-${i}`])
        assert.strictEqual((yield* s.getChannels(uaid(i), options.messageTablePrefix)).size, 1)
      }
    }).pipe(Effect.scoped), 60_000)

  it.live("a write waits for another process's lock at most storage_timeout, the event loop free, then fails with reason Timeout; reads go on", () =>
    Effect.gen(function*() {
      const options = fresh(join(dir, "locked.sqlite"), 300)
      const s = yield* openStore(options)
      yield* createActiveTables.pipe(Effect.provideService(Storage, s))
      yield* s.registerUser({ uaid: uaid(1), routerType: "webpush", routerData: {}, connectedAt: T0 })
      const other = new DatabaseSync(options.path)
      other.exec("BEGIN IMMEDIATE") // another process's write lock, held
      try {
        const started = Date.now()
        let ticks = 0
        const ticking = setInterval(() => ticks++, 10)
        const error = yield* Effect.flip(s.registerUser({ uaid: uaid(2), routerType: "webpush", routerData: {}, connectedAt: T0 }))
        clearInterval(ticking)
        const waited = Date.now() - started
        assert.strictEqual(error.operation, "registerUser")
        assert.strictEqual(error.reason._tag, "Timeout")
        assert.isAtLeast(waited, 250)
        assert.isBelow(waited, 5_000)
        assert.isAtLeast(ticks, 5, "timers ran while the write waited: it did not hold the thread")
        assert.strictEqual((yield* s.getUser(uaid(1)))?.connectedAt, T0, "readers do not wait for the writer (WAL)")
      } finally {
        other.exec("ROLLBACK")
        other.close()
      }
      assert.isTrue(yield* s.registerUser({ uaid: uaid(2), routerType: "webpush", routerData: {}, connectedAt: T0 }))
    }).pipe(Effect.scoped), 30_000)

  it.live("writes from concurrent fibers each get the outcome they get one at a time; a failed one undoes only its own statements", () =>
    Effect.gen(function*() {
      const one = fresh(join(dir, "one-at-a-time.sqlite"))
      const alone = yield* openStore(one)
      const together = yield* openStore({ ...one, path: join(dir, "together.sqlite") })
      for (const s of [alone, together]) yield* createActiveTables.pipe(Effect.provideService(Storage, s))
      const sequential = yield* Effect.forEach(contendedWrites(alone, one.messageTablePrefix), (write) => write)
      const concurrent = yield* Effect.forEach(contendedWrites(together, one.messageTablePrefix), (write) => write, { concurrency: "unbounded" })
      assert.deepStrictEqual(concurrent, sequential)
      assertMixed(sequential)
      assertSameRows(rowsOf(join(dir, "together.sqlite"), one), rowsOf(one.path, one))
    }).pipe(Effect.scoped), 30_000)

  it.live("writes that find another process's lock wait in one batch, the event loop free, and commit together with the outcomes they get one at a time", () =>
    Effect.gen(function*() {
      const one = fresh(join(dir, "batch-alone.sqlite"), 10_000)
      const alone = yield* openStore(one)
      const locked = { ...one, path: join(dir, "batch-locked.sqlite") }
      const s = yield* openStore(locked)
      for (const store of [alone, s]) yield* createActiveTables.pipe(Effect.provideService(Storage, store))
      const sequential = yield* Effect.forEach(contendedWrites(alone, one.messageTablePrefix), (write) => write)
      const other = new DatabaseSync(locked.path)
      other.exec("BEGIN IMMEDIATE") // another process's write lock, held
      let released = false
      const fiber = yield* Effect.forkChild(
        Effect.forEach(contendedWrites(s, one.messageTablePrefix), (write) => write, { concurrency: "unbounded" }).pipe(
          Effect.tap(() => Effect.sync(() => assert.isTrue(released, "no write answered while the lock was held")))
        )
      )
      let ticks = 0
      const ticking = setInterval(() => ticks++, 10)
      yield* Effect.sleep("300 millis")
      clearInterval(ticking)
      assert.isAtLeast(ticks, 10, "timers ran while the batch waited")
      assert.strictEqual(yield* s.getUser(uaid(0)), undefined, "reads go on, and nothing is written yet")
      released = true
      other.exec("ROLLBACK")
      other.close()
      const concurrent = yield* Fiber.join(fiber)
      assert.deepStrictEqual(concurrent, sequential)
      assertMixed(concurrent)
      assertSameRows(rowsOf(locked.path, one), rowsOf(one.path, one))
    }).pipe(Effect.scoped), 30_000)

  it.effect("the sweep deletes message rows once expired, tombstones 10 minutes after their cancel or ack, receipt rows a day past their expiry; reads never showed them", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const options = fresh(join(dir, "sweep.sqlite"))
      const s = yield* openStore(options)
      yield* createActiveTables.pipe(Effect.provideService(Storage, s))
      const table = options.messageTablePrefix
      const t0 = T0 / 1000
      yield* s.addChannel(uaid(1), table, chid)
      yield* s.saveMessages(uaid(1), table, [
        { channelId: chid, version: "short", ttl: 60, timestamp: t0, sortkeyTimestamp: T0 },
        { channelId: chid, version: "long", ttl: 3 * 86_400, timestamp: t0, sortkeyTimestamp: T0 + 1 },
        { channelId: chid, version: "cancelled", ttl: 3 * 86_400, timestamp: t0, sortkeyTimestamp: T0 + 2 },
          { channelId: chid, version: "acked", ttl: 3 * 86_400, timestamp: t0, sortkeyTimestamp: T0 + 3 }
      ])
      // A tombstone outlives its cancel or ack by TOMBSTONE_SECONDS, whatever the message's expiry.
      assert.isTrue(yield* s.cancelMessage(uaid(1), table, { kind: "timestamp", channelId: chid, sortkeyTimestamp: T0 + 2 }, "cancelled"))
      yield* s.ackMessages(uaid(1), table, [{ key: { kind: "timestamp", channelId: chid, sortkeyTimestamp: T0 + 3 }, version: "acked" }])
      yield* s.createReceiptSubscription("rs", t0 + 60)
      const { connection, driver } = yield* scopedSqlite(options.path, 1000)
      const { sweepExpired } = makeSqlMaintenance(driver, options)
      const rows = () => Number(connection.db.prepare(`SELECT COUNT(*) AS n FROM "${table}"`).get()?.["n"])
      assert.strictEqual(yield* sweepExpired(T0 + 59_000), 0, "nothing expired yet")
      assert.strictEqual(rows(), 5)
      assert.strictEqual(yield* sweepExpired(T0 + 60_000), 1, "the short message, at its expiry")
      assert.strictEqual(yield* sweepExpired(T0 + (TOMBSTONE_SECONDS - 1) * 1000), 0, "the tombstones, still needed by a retried save")
        assert.deepStrictEqual(yield* s.saveMessages(uaid(1), table, [{ channelId: chid, version: "acked", ttl: 3 * 86_400, timestamp: t0, sortkeyTimestamp: T0 + 3 }]), [], "a retried save finds the tombstone")
      assert.strictEqual(yield* sweepExpired(T0 + TOMBSTONE_SECONDS * 1000), 2, "the two tombstones, their marker over")
      assert.strictEqual(yield* sweepExpired(T0 + 60_000 + 86_399_000), 0, "the receipt subscription, within its day")
      assert.strictEqual(yield* sweepExpired(T0 + 60_000 + 86_400_000), 1, "the receipt subscription, a day past its expiry")
      assert.strictEqual(rows(), 2, "the channel row (no expiry) and the long message stay")
      yield* TestClock.setTime(T0 + 60_000 + 86_400_000)
      assert.deepStrictEqual((yield* s.fetchTimestampMessages(uaid(1), table, undefined, 10)).messages.map((m) => m.version), ["long"])
      assert.deepStrictEqual([...(yield* s.getChannels(uaid(1), table))], [chid])
    }).pipe(Effect.scoped))

  it.effect("a message table made before tombstones existed gets their column when the tables are made, its rows kept", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const options = fresh(join(dir, "tombstone-column.sqlite"))
      const table = options.messageTablePrefix
      const t0 = T0 / 1000
      const { connection } = yield* scopedSqlite(options.path, 1000)
      connection.db.exec(`CREATE TABLE "${table}" (uaid TEXT NOT NULL, chidmessageid TEXT NOT NULL, updateid TEXT, ttl INTEGER, timestamp INTEGER, expiry INTEGER, sortkey_timestamp INTEGER, urgency TEXT, receipt TEXT, data TEXT, headers TEXT, PRIMARY KEY (uaid, chidmessageid))`)
      connection.db.prepare(`INSERT INTO "${table}" (uaid, chidmessageid, updateid, ttl, timestamp, expiry) VALUES (?, ?, ?, ?, ?, ?)`)
        .run(uaid(1), `02:${T0}:${chid}`, "old", 3600, t0, t0 + 3600)
      const s = yield* openStore(options)
      yield* createActiveTables.pipe(Effect.provideService(Storage, s))
      yield* createActiveTables.pipe(Effect.provideService(Storage, s))
      const old = { channelId: chid, version: "old", ttl: 3600, timestamp: t0, sortkeyTimestamp: T0 }
      assert.deepStrictEqual((yield* s.fetchTimestampMessages(uaid(1), table, undefined, 10)).messages, [old])
      assert.isTrue(yield* s.cancelMessage(uaid(1), table, { kind: "timestamp", channelId: chid, sortkeyTimestamp: T0 }, "old"))
      assert.deepStrictEqual(yield* s.saveMessages(uaid(1), table, [old]), [])
      assert.deepStrictEqual((yield* s.fetchTimestampMessages(uaid(1), table, undefined, 10)).messages, [])
    }).pipe(Effect.scoped))

  it.effect("the sweep deletes a batch at a time, the event loop turning between two", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const options = fresh(join(dir, "sweep-turns.sqlite"))
      const s = yield* openStore(options)
      yield* createActiveTables.pipe(Effect.provideService(Storage, s))
      const table = options.messageTablePrefix
      yield* s.saveMessages(uaid(1), table, Array.from({ length: 4 * SWEEP_BATCH }, (_, i) => ({ channelId: chid, version: `v${i}`, ttl: 60, timestamp: T0 / 1000, sortkeyTimestamp: T0 + i })))
      const { driver } = yield* scopedSqlite(options.path, 1000)
      const { sweepExpired } = makeSqlMaintenance(driver, options)
      let turns = 0
      let turning = true
      const turn = () => {
        turns++
        if (turning) setImmediate(turn)
      }
      setImmediate(turn)
      const deleted = yield* sweepExpired(T0 + 60_000)
      turning = false
      assert.strictEqual(deleted, 4 * SWEEP_BATCH)
      assert.isAtLeast(turns, 4, "a turn of the event loop after each full batch")
    }).pipe(Effect.scoped))

  it.effect("a tombstone an earlier version left (its message's expiry kept) still refuses its save, and is swept at that expiry", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const options = fresh(join(dir, "old-tombstone.sqlite"))
      const s = yield* openStore(options)
      yield* createActiveTables.pipe(Effect.provideService(Storage, s))
      const table = options.messageTablePrefix
      const t0 = T0 / 1000
      const { connection, driver } = yield* scopedSqlite(options.path, 1000)
      connection.db.prepare(`INSERT INTO "${table}" (uaid, chidmessageid, updateid, ttl, timestamp, expiry, cancelled) VALUES (?, ?, ?, ?, ?, ?, 1)`)
        .run(uaid(1), `02:${T0}:${chid}`, "old", 3600, t0, t0 + 3600)
      const old = { channelId: chid, version: "old", ttl: 3600, timestamp: t0, sortkeyTimestamp: T0 }
      assert.strictEqual(yield* s.saveMessage(uaid(1), table, old), "cancelled")
      assert.deepStrictEqual((yield* s.fetchTimestampMessages(uaid(1), table, undefined, 10)).messages, [])
      const { sweepExpired } = makeSqlMaintenance(driver, options)
      assert.strictEqual(yield* sweepExpired(T0 + TOMBSTONE_SECONDS * 1000), 0, "kept until its message's expiry")
      assert.strictEqual(yield* sweepExpired(T0 + 3_600_000), 1)
    }).pipe(Effect.scoped))

  it.effect("the pages of acked messages are reused once their tombstones are swept: a second round does not grow the file", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const options = fresh(join(dir, "reuse.sqlite"))
      const s = yield* openStore(options)
      yield* createActiveTables.pipe(Effect.provideService(Storage, s))
      const table = options.messageTablePrefix
      const { connection, driver } = yield* scopedSqlite(options.path, 1000)
      const { sweepExpired } = makeSqlMaintenance(driver, options)
      const pages = () => Number(connection.db.prepare("PRAGMA page_count").get()?.["page_count"])
      const data = "x".repeat(3000)
      const round = (at: number) =>
        Effect.gen(function*() {
          yield* TestClock.setTime(at)
          const messages = Array.from({ length: 500 }, (_, i) => ({ channelId: chid, version: `v${at}-${i}`, ttl: 86_400, timestamp: at / 1000, sortkeyTimestamp: at + i, data }))
          yield* s.saveMessages(uaid(1), table, messages)
          yield* s.ackMessages(uaid(1), table, messages.map((m) => ({ key: { kind: "timestamp", channelId: chid, sortkeyTimestamp: m.sortkeyTimestamp }, version: m.version })))
          yield* sweepExpired(at + TOMBSTONE_SECONDS * 1000)
        })
      const before = pages()
      yield* round(T0)
      const first = pages()
      yield* round(T0 + 3_600_000)
      assert.isAbove(first - before, 500, "a round's messages took pages")
      assert.isBelow(pages() - first, (first - before) / 10, `pages: ${before} at first, ${first} after one round, ${pages()} after two`)
      assert.strictEqual(Number(connection.db.prepare(`SELECT COUNT(*) AS n FROM "${table}"`).get()?.["n"]), 0, "no row left behind")
    }).pipe(Effect.scoped))

  it.effect("dropping a month's table gives its space back to the file system", () =>
    Effect.gen(function*() {
      const options = { ...fresh(join(dir, "shrink.sqlite")), noTableRotation: false }
      const s = yield* openStore(options)
      const old = `${options.messageTablePrefix}_2020_01`
      yield* s.createTables([old])
      const data = "x".repeat(3000)
      yield* s.saveMessages(uaid(1), old, Array.from({ length: 1000 }, (_, i) => ({ channelId: chid, version: `v${i}`, ttl: 60, timestamp: 1, sortkeyTimestamp: i, data })))
      const { connection } = yield* scopedSqlite(options.path, 1000)
      const pages = () => Number(connection.db.prepare("PRAGMA page_count").get()?.["page_count"])
      const before = pages()
      yield* s.dropMessageTable(old)
      assert.isBelow(pages(), before - 500, `pages: ${before} before the drop, ${pages()} after`)
    }).pipe(Effect.scoped))

  it.live("commits reach the database file through the checkpoint thread, not the committing statement", () =>
    Effect.gen(function*() {
      const options = fresh(join(dir, "checkpoint.sqlite"))
      const s = yield* openStore(options)
      yield* createActiveTables.pipe(Effect.provideService(Storage, s))
      const data = "x".repeat(3000)
      const size = () => statSync(options.path).size
      const before = size()
      for (let i = 0; i < 20; i++) {
        yield* s.saveMessages(uaid(i), options.messageTablePrefix, Array.from({ length: 50 }, (_, m) => ({ channelId: chid, version: `v${m}`, ttl: 60, timestamp: 1, sortkeyTimestamp: m, data })))
      }
      assert.isBelow(size(), before + 1_000_000, "no checkpoint in the committing statements: the commits are in the log")
      let waited = 0
      while (size() < before + 2_000_000 && waited < 10_000) {
        yield* Effect.sleep("100 millis")
        waited += 100
      }
      assert.isAtLeast(size(), before + 2_000_000, `the database file grew within ${waited} ms: ${before} → ${size()} bytes`)
    }).pipe(Effect.scoped), 30_000)

  it.effect("a full disk: every write refused is DiskFull; the log says so in one line a minute, a message with the count since the line before", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const logged: Array<{ readonly message: unknown; readonly annotations: Record<string, unknown> }> = []
      const options = fresh(join(dir, "full.sqlite"))
      const { connection, driver } = yield* scopedSqlite(options.path, 1000)
      const s = yield* makeSqlStorage(driver, options)
      yield* createActiveTables.pipe(Effect.provideService(Storage, s))
      // The database may not grow past the pages it has: SQLite refuses as it does on a full disk.
      connection.db.exec(`PRAGMA max_page_count = ${Number(connection.db.prepare("PRAGMA page_count").get()?.["page_count"])}`)
      const data = "x".repeat(3000)
      const write = (i: number) =>
        Effect.flip(s.saveMessages(uaid(i), options.messageTablePrefix, Array.from({ length: 20 }, (_, m) => ({ channelId: chid, version: `v${m}`, ttl: 60, timestamp: 1, sortkeyTimestamp: m, data }))))
      const capture = Logger.layer([Logger.map(Logger.formatStructured, (entry) => void logged.push(entry))])
      const refusals = yield* Effect.forEach([1, 2, 3, 4, 5], write).pipe(Effect.provide(capture))
      for (const error of refusals) {
        assert.deepStrictEqual(error.reason, new DiskFull({ database: options.path }))
      }
      assert.deepStrictEqual(logged.map((entry) => entry.message), [
        `the disk holding ${options.path} is full: 1 storage operation refused since the last line (one a minute at most), answered 503 to their senders; free space on that disk (option data_dir)`
      ])
      yield* TestClock.adjust("59 seconds")
      yield* write(6).pipe(Effect.provide(capture))
      assert.strictEqual(logged.length, 1, "within the minute: counted, not said")
      yield* TestClock.adjust("1 second")
      yield* Effect.forEach([7, 8], write).pipe(Effect.provide(capture))
      assert.strictEqual(logged.length, 2)
      assert.match(String(logged[1]!.message), /is full: 6 storage operations refused since the last line/)
      assert.deepStrictEqual(logged[1]!.annotations, { database: options.path, refused: 6 })
      // The API answers it 503 without a line of its own per request; other failures have one, a message with fields.
      const answered: Array<unknown> = []
      const edge = Logger.layer([Logger.map(Logger.formatStructured, (entry) => void answered.push([entry.message, entry.annotations]))])
      yield* Effect.flip(storageUnavailable(refusals[0]!)).pipe(Effect.provide(edge))
      assert.deepStrictEqual(answered, [])
      yield* Effect.flip(storageUnavailable(new StorageError({ operation: "getUser", reason: new Unknown(), cause: new Error("boom") }))).pipe(Effect.provide(edge))
      assert.deepStrictEqual(answered, [["storage failed", { operation: "getUser", reason: "Unknown", cause: "boom" }]])
    }).pipe(Effect.scoped))

  it.effect("a file that is not a database is a clear StorageError at start", () =>
    Effect.gen(function*() {
      const path = join(dir, "not-a-database.sqlite")
      writeFileSync(path, "this is not SQLite ".repeat(100))
      const error = yield* Effect.flip(Effect.scoped(Layer.build(layerSqlite(fresh(path)))))
      assert.strictEqual(error.operation, "open")
      assert.match(String((error.cause as Error).message), /not a database/)
    }))
})
