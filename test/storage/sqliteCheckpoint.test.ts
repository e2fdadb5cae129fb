/**
 * The SQLite store's checkpoint thread under writes that never pause: the write-ahead log stays
 * within its bound (a checkpoint that restarts it once it is past the bound), and nothing written
 * is lost to the restarts.
 */
import { once } from "node:events"
import { mkdtempSync, rmSync, statSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Worker } from "node:worker_threads"
import { assert, describe, it } from "@effect/vitest"
import { Context, Effect, Layer } from "effect"
import { afterAll } from "vitest"
import { layerSqlite } from "../../src/storage/sqlite.ts"
import { createActiveTables, Storage } from "../../src/storage/Storage.ts"

const dir = mkdtempSync(join(tmpdir(), "autopush-sqlite-checkpoint-"))
afterAll(() => rmSync(dir, { recursive: true, force: true }))

const MiB = 1024 * 1024
const uaid = (n: number) => n.toString(16).padStart(32, "0")
const chid = "00000000-0000-4000-8000-000000000001"

describe("SQLite checkpoint thread", () => {
  it.live("under continuous writes the log stays within its bound, restarted many times over, and every row written reads back", () =>
    Effect.gen(function*() {
      const path = join(dir, "continuous.sqlite")
      const options = { path, routerTable: "router", messageTablePrefix: "message", noTableRotation: true }
      // The store as the node opens it (its own checkpoint thread, bound 64 MiB, never reached
      // here), and a second thread on the same file with a bound small enough to pass many times
      // in a few seconds.
      const s = Context.get(yield* Layer.build(layerSqlite(options)), Storage)
      yield* createActiveTables.pipe(Effect.provideService(Storage, s))
      const walBoundBytes = 1 * MiB
      const thread = yield* Effect.acquireRelease(
        Effect.sync(() =>
          new Worker(new URL("../../src/storage/sqliteCheckpointThread.ts", import.meta.url), {
            workerData: { path, walBoundBytes, pollMs: 10, intervalMs: 1_000 }
          })
        ),
        (worker) => Effect.promise(() => (worker.postMessage("close"), once(worker, "exit")))
      )
      let threadError: unknown
      thread.on("error", (error) => (threadError = error))

      const data = "x".repeat(3_000)
      const perUser = 10
      const walBytes = () => statSync(`${path}-wal`).size
      // Written without a pause until 160 times the bound in message data alone has gone through
      // the log; a reader reads an earlier user back between writes, as clients do.
      let users = 0
      let largestWal = 0
      while (users * perUser * data.length < 160 * walBoundBytes) {
        yield* s.saveMessages(
          uaid(users),
          options.messageTablePrefix,
          Array.from({ length: perUser }, (_, m) => ({ channelId: chid, version: `v${users}-${m}`, ttl: 86_400, timestamp: Math.floor(Date.now() / 1000), sortkeyTimestamp: m + 1, data }))
        )
        users++
        largestWal = Math.max(largestWal, walBytes())
        const earlier = Math.floor(users / 2)
        const page = yield* s.fetchTimestampMessages(uaid(earlier), options.messageTablePrefix, undefined, perUser)
        assert.strictEqual(page.messages.length, perUser, `user ${earlier} read back while the writes go on`)
      }
      assert.isUndefined(threadError)
      const written = users * perUser * data.length
      // The log's file is never cut below the writers' journal_size_limit (64 MiB), so its size is
      // the most the log ever held: the bound, plus what was written while a checkpoint ran and
      // waited for the write lock (tens of MiB at this pace, on a loaded machine), below the 64 MiB
      // where the store's own thread restarts it. Several times that went through it.
      assert.isBelow(largestWal, 64 * MiB, `the log's file reached ${(largestWal / MiB).toFixed(1)} MiB while ${(written / MiB).toFixed(0)} MiB of messages were written`)

      for (let i = 0; i < users; i++) {
        const page = yield* s.fetchTimestampMessages(uaid(i), options.messageTablePrefix, undefined, perUser + 1)
        assert.deepStrictEqual(page.messages.map((m) => m.version), Array.from({ length: perUser }, (_, m) => `v${i}-${m}`), `user ${i}`)
      }
    }).pipe(Effect.scoped), 60_000)
})
