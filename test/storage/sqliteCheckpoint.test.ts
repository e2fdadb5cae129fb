/**
 * The SQLite store's checkpoint thread under writes that never pause: the write-ahead log stays
 * within its bound (a checkpoint that restarts it once it is past the bound), a reader staying on
 * the log holds the restart off but not the writes, and nothing written is lost to the restarts.
 */
import { once } from "node:events"
import { mkdtempSync, rmSync, statSync } from "node:fs"
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
    let users = 0
    /** Write until `bytes` more of message data have gone through the log; the log's file at its largest meanwhile. */
    const writeFor = (bytes: number) =>
      Effect.gen(function*() {
        let largest = 0
        for (const until = users + Math.ceil(bytes / (PER_USER * DATA.length)); users < until;) {
          const user = users
          yield* s.saveMessages(
            uaid(user),
            options.messageTablePrefix,
            Array.from({ length: PER_USER }, (_, m) => ({ channelId: chid, version: `v${user}-${m}`, ttl: 86_400, timestamp: Math.floor(Date.now() / 1000), sortkeyTimestamp: m + 1, data: DATA }))
          )
          users++
          largest = Math.max(largest, walBytes())
          const earlier = Math.floor(users / 2)
          const page = yield* s.fetchTimestampMessages(uaid(earlier), options.messageTablePrefix, undefined, PER_USER)
          assert.strictEqual(page.messages.length, PER_USER, `user ${earlier} read back while the writes go on`)
        }
        return largest
      })
    /** Every user written, read back in full. */
    const readBack = Effect.gen(function*() {
      assert.deepStrictEqual(threadErrors, [])
      for (let i = 0; i < users; i++) {
        const page = yield* s.fetchTimestampMessages(uaid(i), options.messageTablePrefix, undefined, PER_USER + 1)
        assert.deepStrictEqual(page.messages.map((m) => m.version), Array.from({ length: PER_USER }, (_, m) => `v${i}-${m}`), `user ${i}`)
      }
    })
    return { path, writeFor, readBack, walBytes }
  })

describe("SQLite checkpoint thread", () => {
  it.live("under continuous writes the log stays within its bound, restarted many times over, and every row written reads back", () =>
    Effect.gen(function*() {
      const { readBack, writeFor } = yield* openWriting("continuous.sqlite")
      const written = 192 * WAL_BOUND_BYTES
      const largestWal = yield* writeFor(written)
      // The log's file is never cut below the writers' journal_size_limit (64 MiB), so its size is
      // the most the log ever held: the bound, plus what was written while a checkpoint ran and
      // waited for the write lock and the disk (tens of MiB at this pace on a loaded machine; up to
      // 85 MiB seen with two test files on two busy cores): at most half of what went through it,
      // which it could hold only if it was started over.
      assert.isBelow(largestWal, written / 2, `the log's file reached ${(largestWal / MiB).toFixed(1)} MiB while ${(written / MiB).toFixed(0)} MiB of messages were written`)
      yield* readBack
    }).pipe(Effect.scoped), 60_000)

  it.live("a reader staying on the log holds its restart off, not the writes; once the reader leaves, the log is started over", () =>
    Effect.gen(function*() {
      const { path, readBack, walBytes, writeFor } = yield* openWriting("reader.sqlite")
      yield* writeFor(2 * MiB)
      // Another process's long read: a transaction on the snapshot of that moment.
      const reader = new DatabaseSync(path)
      reader.exec("BEGIN")
      const count = () => Number(reader.prepare("SELECT count(*) AS n FROM message").get()?.["n"])
      const seen = count()
      yield* writeFor(16 * MiB)
      assert.strictEqual(count(), seen, "the reader's snapshot stayed")
      const pinned = walBytes()
      assert.isAtLeast(pinned, 16 * MiB, "the log could not be started over under the reader")
      reader.exec("COMMIT")
      reader.close()
      // Had the log not been started over, it would hold all of this on top.
      const after = 96 * MiB
      yield* writeFor(after)
      assert.isBelow(walBytes(), pinned + after - 32 * MiB, `the log's file: ${(pinned / MiB).toFixed(1)} MiB when the reader left, ${(walBytes() / MiB).toFixed(1)} MiB after ${after / MiB} MiB more`)
      yield* readBack
    }).pipe(Effect.scoped), 60_000)
})
