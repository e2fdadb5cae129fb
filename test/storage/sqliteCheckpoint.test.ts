/**
 * The SQLite store's checkpoint thread under writes that never pause: the write-ahead log is
 * started over again and again (a checkpoint that restarts it once it is past the bound), so its
 * file stays far below what went through it; a reader staying on the log holds the restart off but
 * not the writes; nothing written is lost to the restarts. How far past the bound the log grows
 * between two restarts depends on how fast the checkpoint copies it, so on the machine's load: the
 * restarts are counted instead (the log's header), not timed.
 */
import { once } from "node:events"
import { closeSync, mkdtempSync, openSync, readSync, rmSync, statSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { DatabaseSync } from "node:sqlite"
import { Worker } from "node:worker_threads"
import { assert, describe, it } from "@effect/vitest"
import { Context, Effect, Layer } from "effect"
import { afterAll } from "vitest"
import { layerSqlite } from "../../src/storage/sqlite/layer.ts"
import { createActiveTables, Storage } from "../../src/storage/Storage.ts"

const dir = mkdtempSync(join(tmpdir(), "autopush-sqlite-checkpoint-"))
afterAll(() => rmSync(dir, { recursive: true, force: true }))

const MiB = 1024 * 1024
const WAL_BOUND_BYTES = 1 * MiB
const uaid = (n: number) => n.toString(16).padStart(32, "0")
const chid = "00000000-0000-4000-8000-000000000001"
const DATA = "x".repeat(3_000)
const PER_USER = 10

/**
 * The store as the node opens it (its own checkpoint thread, bound 64 MiB, never reached here), a
 * second checkpoint thread on the same file with a bound small enough to pass many times in a few
 * seconds, and writes without a pause: each user's messages, then an earlier user read back, as
 * clients do.
 */
const openWriting = (name: string) =>
  Effect.gen(function*() {
    const path = join(dir, name)
    const options = { path, routerTable: "router", messageTablePrefix: "message", noTableRotation: true }
    const s = Context.get(yield* Layer.build(layerSqlite(options)), Storage)
    yield* createActiveTables.pipe(Effect.provideService(Storage, s))
    const thread = yield* Effect.acquireRelease(
      Effect.sync(() =>
        new Worker(new URL("../../src/storage/sqlite/checkpointThread.ts", import.meta.url), {
          workerData: { path, walBoundBytes: WAL_BOUND_BYTES, pollMs: 10, intervalMs: 200 }
        })
      ),
      (worker) => Effect.promise(() => (worker.postMessage("close"), once(worker, "exit")))
    )
    const threadErrors: Array<unknown> = []
    thread.on("error", (error) => threadErrors.push(error))
    const walBytes = () => statSync(`${path}-wal`).size
    /**
     * The log's salt-1 (bytes 16–19 of its header), which SQLite adds one to each time a writer
     * starts the log over. Read with plain file calls on the log's file, on which SQLite holds no
     * lock (its locks are on the database and shared-memory files), so closing it drops none.
     */
    const walSalt = () => {
      const fd = openSync(`${path}-wal`, "r")
      try {
        const header = Buffer.alloc(32)
        readSync(fd, header, 0, 32, 0)
        return header.readUInt32BE(16)
      } finally {
        closeSync(fd)
      }
    }
    let users = 0
    let restarts = 0
    let lastSalt = -1
    /**
     * Write until `bytes` more of message data have gone through the log and, when `restartsAtLeast`
     * is given, until the log has been started over that many times in all (never past
     * `maxBytes`); the log's file at its largest meanwhile, and what was written.
     */
    const writeFor = (bytes: number, restartsAtLeast = 0, maxBytes = bytes) =>
      Effect.gen(function*() {
        let largest = 0
        const first = users
        const perUser = PER_USER * DATA.length
        for (const until = users + Math.ceil(bytes / perUser), most = users + Math.ceil(maxBytes / perUser); users < until || (restarts < restartsAtLeast && users < most);) {
          const user = users
          yield* s.saveMessages(
            uaid(user),
            options.messageTablePrefix,
            Array.from({ length: PER_USER }, (_, m) => ({ channelId: chid, version: `v${user}-${m}`, ttl: 86_400, timestamp: Math.floor(Date.now() / 1000), sortkeyTimestamp: m + 1, data: DATA }))
          )
          users++
          largest = Math.max(largest, walBytes())
          const salt = walSalt()
          if (lastSalt !== -1 && salt !== lastSalt) restarts += (salt - lastSalt) >>> 0
          lastSalt = salt
          const earlier = Math.floor(users / 2)
          const page = yield* s.fetchTimestampMessages(uaid(earlier), options.messageTablePrefix, undefined, PER_USER)
          assert.strictEqual(page.messages.length, PER_USER, `user ${earlier} read back while the writes go on`)
        }
        return { largest, written: (users - first) * perUser }
      })
    /** Every user written, read back in full. */
    const readBack = Effect.gen(function*() {
      assert.deepStrictEqual(threadErrors, [])
      for (let i = 0; i < users; i++) {
        const page = yield* s.fetchTimestampMessages(uaid(i), options.messageTablePrefix, undefined, PER_USER + 1)
        assert.deepStrictEqual(page.messages.map((m) => m.version), Array.from({ length: PER_USER }, (_, m) => `v${i}-${m}`), `user ${i}`)
      }
    })
    return { path, writeFor, readBack, walBytes, restarts: () => restarts }
  })

describe("SQLite checkpoint thread", () => {
  it.live("under continuous writes the log is started over many times, its file far below what went through it, and every row written reads back", () =>
    Effect.gen(function*() {
      const { readBack, restarts, walBytes, writeFor } = yield* openWriting("continuous.sqlite")
      // Until the thread's first restart: what the log takes while the thread starts (a worker
      // loading its module, 35 MiB of writes seen on two busy cores) is not what is measured.
      yield* writeFor(0, 1, 512 * MiB)
      const fileBefore = walBytes()
      const restartsBefore = restarts()
      // At least 64 bounds' worth (over a hundred restarts on an idle machine), and on until the log
      // has been started over 16 more times (at most 512 MiB: without restarts the log would hold it all).
      const { largest, written } = yield* writeFor(64 * WAL_BOUND_BYTES, restartsBefore + 16, 512 * MiB)
      assert.isAtLeast(restarts() - restartsBefore, 4, `restarts of the log while ${(written / MiB).toFixed(0)} MiB of messages were written`)
      // The log's file is never cut below the writers' journal_size_limit (64 MiB), so it grows only
      // where a run of the log holds more than every run before: the bound, plus what was written
      // while a checkpoint ran (tens of MiB on a loaded machine: one starved checkpoint let a run
      // hold 47 of 65 MiB when only five runs were asked for). With seventeen or more runs of the
      // log, one would have to hold more than all the others together to grow it by half of what
      // went through it; without restarts it would grow by all of it.
      assert.isBelow(
        largest - fileBefore,
        written / 2,
        `the log's file grew by ${((largest - fileBefore) / MiB).toFixed(1)} MiB while ${(written / MiB).toFixed(0)} MiB of messages were written`
      )
      yield* readBack
    }).pipe(Effect.scoped), 60_000)

  it.live("a reader staying on the log holds its restart off, not the writes; once the reader leaves, the log is started over", () =>
    Effect.gen(function*() {
      const { path, readBack, restarts, walBytes, writeFor } = yield* openWriting("reader.sqlite")
      yield* writeFor(2 * MiB)
      // Another process's long read: a transaction on the snapshot of that moment.
      const reader = new DatabaseSync(path)
      reader.exec("BEGIN")
      const count = () => Number(reader.prepare("SELECT count(*) AS n FROM message").get()?.["n"])
      const seen = count()
      // A restart the checkpoint made just before the reader came is taken up by the first write.
      yield* writeFor(1)
      const restartsBefore = restarts()
      yield* writeFor(16 * MiB)
      assert.strictEqual(count(), seen, "the reader's snapshot stayed")
      assert.strictEqual(restarts(), restartsBefore, "the log was not started over under the reader")
      assert.isAtLeast(walBytes(), 16 * MiB, "the writes went on into the log")
      reader.exec("COMMIT")
      reader.close()
      // Written until the log is started over (at most 512 MiB: it would hold all of it otherwise).
      const { written } = yield* writeFor(0, restartsBefore + 1, 512 * MiB)
      assert.isAbove(restarts(), restartsBefore, `the log was not started over in ${(written / MiB).toFixed(0)} MiB after the reader left`)
      yield* readBack
    }).pipe(Effect.scoped), 60_000)
})
