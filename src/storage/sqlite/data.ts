/**
 * The embedded SQLite database's directory and files (`data_dir`), looked at by the process that
 * starts a node, before the database is opened: made private to the user the nodes run as, and
 * refused when it lost its contents.
 *
 * **Private.** The database holds every client's uaid, which is all a client needs to say hello as
 * that client and take its messages: the directory is made 0700, the database and its -wal, -shm and
 * -journal files (and the keys kept beside them) 0600, also when they exist with looser modes (the
 * caller says so in the log).
 *
 * **A lost database.** Once a node has run on the database, a marker beside it (`{database}.started`)
 * says so. A start that then finds the database missing, or with no table (a file truncated to 0
 * bytes by a failed copy or restore), is refused: started anew, it would give every old client a new
 * uaid and tell every sender to an old endpoint that the subscription is gone (410), and application
 * servers delete those. Removing the marker starts anew on purpose (`rm data/autopush.sqlite*`
 * removes it with the database). Nothing is refused on a first start (no marker yet), nor beside a
 * live process: the marker is written only once the database has its tables, and a database with
 * tables is never refused.
 */
import { existsSync, readFileSync, statSync } from "node:fs"
import { DatabaseSync } from "node:sqlite"
import * as Effect from "effect/Effect"
import { privateDirectory, privateExistingFile, writePrivateFile } from "../../platform/privateFile.ts"
import { StartupError } from "../../platform/startup.ts"

/** The files SQLite keeps for the database at `path`: the database, its write-ahead log and shared memory, its rollback journal. */
export const databaseFiles = (path: string): ReadonlyArray<string> => [path, `${path}-wal`, `${path}-shm`, `${path}-journal`]

/** Where a data directory records that a node ran on its database. */
export const startedMarkerOf = (databasePath: string): string => `${databasePath}.started`

const failed = (what: string, cause: unknown) =>
  new StartupError({ message: `${what} (option data_dir): ${cause instanceof Error ? cause.message : String(cause)}` })

/**
 * `dataDir` (created if missing) and those of `files` that exist made private; the paths that were
 * open to the group or to others before.
 */
export const makeDataPrivate = (dataDir: string, files: ReadonlyArray<string>): Effect.Effect<ReadonlyArray<string>, StartupError> =>
  Effect.try({
    try: () => [...(privateDirectory(dataDir) ? [dataDir] : []), ...files.filter(privateExistingFile)],
    catch: (cause) => failed(`cannot make ${dataDir} private`, cause)
  })

/**
 * What the file at `path` holds: nothing (no file), no table (0 bytes, or a database nobody made a
 * table in), or something else — tables, or what is no database at all, which opening it reports.
 */
const databaseStateOf = (path: string): "missing" | "empty" | "present" => {
  if (!existsSync(path)) return "missing"
  let db: DatabaseSync | undefined
  try {
    db = new DatabaseSync(path)
    const row = db.prepare("SELECT count(*) AS n FROM sqlite_master WHERE type = 'table'").get()
    return Number(row?.["n"] ?? 0) === 0 ? "empty" : "present"
  } catch {
    return "present"
  } finally {
    db?.close()
  }
}

/** ` since {when}`, when the marker says when a node first ran on the database. */
const sinceText = (marker: string): string => {
  try {
    const since = (JSON.parse(readFileSync(marker, "utf8")) as { readonly since?: unknown }).since
    return typeof since === "string" ? ` since ${since}` : ""
  } catch {
    return ""
  }
}

/**
 * Refuse a database that lost its contents: a marker says a node ran on it, and it is missing or
 * has no table. The message says what was found and how to start anew on purpose.
 */
export const refuseLostDatabase = (databasePath: string): Effect.Effect<void, StartupError> =>
  Effect.try({
    try: () => {
      const marker = startedMarkerOf(databasePath)
      if (!existsSync(marker)) return undefined
      const state = databaseStateOf(databasePath)
      if (state === "present") return undefined
      const found = state === "missing"
        ? `${databasePath} is missing`
        : statSync(databasePath).size === 0
        ? `${databasePath} is empty (0 bytes: a failed copy or restore?)`
        : `${databasePath} has no tables`
      return `${found}, but ${marker} says nodes ran on a database there${sinceText(marker)}: its users and stored messages are gone. ` +
        "Stop every node using this data_dir and restore the database from a backup; or, to start anew with an empty database on purpose " +
        `(every client then gets a new uaid, and every sender to an old endpoint is told 410), remove ${marker} (option data_dir)`
    },
    catch: (cause) => failed(`cannot read ${databasePath}`, cause)
  }).pipe(Effect.flatMap((refusal) => refusal === undefined ? Effect.void : Effect.fail(new StartupError({ message: refusal }))))

/**
 * Record that a node runs on the database at `databasePath`, once it has its tables; nothing when
 * the marker is there already. `now`: the time it says the database was first used since.
 */
export const markDatabaseStarted = (databasePath: string, now: Date): Effect.Effect<void, StartupError> =>
  Effect.suspend(() => {
    const marker = startedMarkerOf(databasePath)
    if (existsSync(marker)) return Effect.void
    return Effect.tryPromise({
      try: () => writePrivateFile(marker, `${JSON.stringify({ since: now.toISOString() })}\n`),
      catch: (cause) => failed(`cannot write ${marker}`, cause)
    })
  })
