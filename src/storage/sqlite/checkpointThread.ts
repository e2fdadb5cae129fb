/**
 * The SQLite store's checkpoints, on a thread of their own: every second, a passive checkpoint
 * copies the commits in the write-ahead log into the database file and syncs it — the one step of
 * a write that waits for the disk (`synchronous=NORMAL` syncs nothing at a commit). Done by the
 * committing statement, as SQLite does by default, it would hold the event loop for as long as
 * the disk takes (milliseconds; more on a busy disk). A passive checkpoint never waits for another
 * connection: one that finds the database busy (another process's checkpoint, a writer) is tried
 * at the next tick.
 *
 * Copying the log does not shorten it: a writer starts the log over only when it finds every frame
 * copied and no reader on the log, which under continuous writes never happens (each checkpoint
 * ends behind the writes made while it ran), so the log would grow for as long as the writes go on
 * (gigabytes within a minute). Once the log is past a bound, the passive checkpoint is followed by
 * a restarting one (`wal_checkpoint(RESTART)`): it takes the write lock, copies what is left, and
 * waits until no reader is on the log, so that the next writer starts the log over (and its
 * `journal_size_limit` cuts the file back). Meanwhile writers find the database locked and run
 * again after a pause; the wait for the lock and the readers is bounded (`RESTART_BUSY_MS`), after
 * which the checkpoint gives up, lets the lock go, and is tried again at the next tick. The log
 * file's size is read every `pollMs` (`logBytes`), so a log that grows past the bound between two ticks
 * is checkpointed then, not up to a second later (a busy store writes hundreds of MiB of log a
 * second).
 *
 * `workerData` is `{ path, walBoundBytes, intervalMs?, pollMs? }`: the database, the log's bound
 * (the writers' `journal_size_limit`, which cuts the file back to it; given by whoever opens the
 * database, so that the two agree), the tick (1 s) and how often the log file's size is read
 * (100 ms). A `"close"` message ends the thread after a last checkpoint.
 */
import { statSync } from "node:fs"
import { DatabaseSync } from "node:sqlite"
import { parentPort, workerData } from "node:worker_threads"

interface Settings {
  readonly path: string
  readonly intervalMs?: number
  readonly walBoundBytes: number
  readonly pollMs?: number
}
const settings = workerData as Settings
const INTERVAL_MS = settings.intervalMs ?? 1_000
const WAL_BOUND_BYTES = settings.walBoundBytes
const POLL_MS = Math.min(settings.pollMs ?? 100, INTERVAL_MS)
/**
 * How long a restarting checkpoint waits for the write lock and then for readers to leave the
 * log: writers are held for about this at most, plus the copy of what is left and the disk's sync,
 * and retry meanwhile.
 */
const RESTART_BUSY_MS = 50

/** The header of the log's file, then per frame a header and a page. */
const WAL_HEADER_BYTES = 32
const FRAME_HEADER_BYTES = 24

// The busy timeout serves only the restarting checkpoint: a passive one never waits.
const db = new DatabaseSync(settings.path, { timeout: RESTART_BUSY_MS })
const passive = db.prepare("PRAGMA wal_checkpoint(PASSIVE)")
const restart = db.prepare("PRAGMA wal_checkpoint(RESTART)")
const pageSize = Number(db.prepare("PRAGMA page_size").get()?.["page_size"] ?? 4096)

/** `busy` 1 when the checkpoint could not do all it was asked; `log` the frames in the log (-1 when not reached). */
interface CheckpointRow {
  readonly busy: number
  readonly log: number
  readonly checkpointed: number
}

/** The frames past which the log is restarted. */
const boundFrames = Math.floor((WAL_BOUND_BYTES - WAL_HEADER_BYTES) / (pageSize + FRAME_HEADER_BYTES))

/**
 * The size of the log's file, -1 when it cannot be read: a hint of when to checkpoint, the
 * checkpoint's own row deciding what to do. The log passes the bound only by growing its file past
 * it (after a restart the writers write it again from its start, and `journal_size_limit` has cut
 * the file back to the bound). Read with `stat`, never by opening the database's files: closing a
 * descriptor of a file drops every POSIX lock this process holds on it, SQLite's among them, and
 * another process would then take this one's shared memory for unused and truncate it under it
 * (SIGBUS).
 */
const logBytes = (): number => {
  try {
    return statSync(`${settings.path}-wal`).size
  } catch {
    return -1
  }
}

/** The log's frames at the last restarting checkpoint that succeeded: until a writer starts the log over, restarting again does nothing. */
let restartedLog = -1
/** The log file's size just after that checkpoint: unchanged, the log has not grown since. */
let restartedBytes = -1
/**
 * Whether the last restarting checkpoint gave up (a reader, maybe another process's, stayed on the
 * log): the next try waits for the tick, as it may hold the writers up to `RESTART_BUSY_MS` again.
 */
let restartGaveUp = false
let checkpointedAt = 0

const checkpoint = () => {
  checkpointedAt = Date.now()
  restartGaveUp = false
  try {
    const copied = passive.get() as unknown as CheckpointRow
    // Not after a passive checkpoint that found another one running (another process's): the
    // restart would copy the whole log, and sync the file, holding the writers for as long (seconds
    // on a busy disk, with several processes' threads racing at each tick).
    if (copied.busy === 0 && copied.log > boundFrames && copied.log !== restartedLog) {
      const restarted = restart.get() as unknown as CheckpointRow
      restartGaveUp = restarted.busy !== 0
      if (!restartGaveUp) {
        restartedLog = restarted.log
        restartedBytes = logBytes()
      }
    }
  } catch {
    // The file went away meanwhile, or an I/O error: the next tick tries again.
  }
}

const poll = () => {
  if (Date.now() - checkpointedAt >= INTERVAL_MS) return checkpoint()
  const bytes = restartGaveUp ? -1 : logBytes()
  if (bytes > WAL_BOUND_BYTES && bytes !== restartedBytes) checkpoint()
}

const timer = setInterval(poll, POLL_MS)
parentPort?.on("message", (message) => {
  if (message !== "close") return
  clearInterval(timer)
  checkpoint()
  db.close()
  parentPort?.close()
})
