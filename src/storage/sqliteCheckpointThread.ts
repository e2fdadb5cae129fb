/**
 * The SQLite store's checkpoints, on a thread of their own: every second, a passive checkpoint
 * copies the commits in the write-ahead log into the database file and syncs it — the one step of
 * a write that waits for the disk (`synchronous=NORMAL` syncs nothing at a commit). Done by the
 * committing statement, as SQLite does by default, it would hold the event loop for as long as
 * the disk takes (milliseconds; more on a busy disk). A checkpoint never waits for another
 * connection: one that finds the database busy (another process's checkpoint, a writer) is tried
 * at the next tick. The database is the `workerData` path; a `"close"` message ends the thread
 * after a last checkpoint.
 */
import { DatabaseSync } from "node:sqlite"
import { parentPort, workerData } from "node:worker_threads"

const CHECKPOINT_INTERVAL_MS = 1_000

const db = new DatabaseSync(workerData as string, { timeout: 0 })
const checkpoint = () => {
  try {
    db.exec("PRAGMA wal_checkpoint(PASSIVE)")
  } catch {
    // Busy, or the file went away meanwhile: the next tick tries again.
  }
}
const timer = setInterval(checkpoint, CHECKPOINT_INTERVAL_MS)
parentPort?.on("message", (message) => {
  if (message !== "close") return
  clearInterval(timer)
  checkpoint()
  db.close()
  parentPort?.close()
})
