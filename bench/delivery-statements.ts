/**
 * Counts the SQL statements a node of `bench:delivery` scenario (b) runs, preloaded beside
 * `delivery-probe.ts` (`node --import bench/delivery-statements.ts`) into the real entrypoints when
 * they store on SQLite or PostgreSQL, so that they need no change: every statement run through
 * `node:sqlite` (`StatementSync` run/get/all/iterate, `DatabaseSync.exec`) and every query through
 * `pg` (`Client.query`) is counted by its first word (SELECT, INSERT, BEGIN, …) with the time the
 * call took (SQLite: the synchronous call; PostgreSQL: until its answer, waiting in the
 * connection's queue included). Statements on other threads (SQLite's checkpoints) are not seen.
 * Over the IPC channel `{ probe: "statements" }` answers `{ probe: "statements", counts: { kind:
 * { n, ms } } }` and resets them.
 */
import { DatabaseSync, StatementSync } from "node:sqlite"
import pg from "pg"

let counts = new Map<string, { n: number; ms: number }>()

const count = (sql: unknown, ms: number) => {
  const kind = typeof sql === "string" ? (/^\s*(\w+)/.exec(sql)?.[1]?.toUpperCase() ?? "(other)") : "(other)"
  const entry = counts.get(kind) ?? { n: 0, ms: 0 }
  entry.n++
  entry.ms += ms
  counts.set(kind, entry)
}

type Method = (this: unknown, ...args: Array<unknown>) => unknown

/** Wraps `name` on `proto` so that each call is counted by the SQL `sqlOf` finds for it. */
const wrap = (proto: object, name: string, sqlOf: (self: unknown, args: ReadonlyArray<unknown>) => unknown) => {
  const original = (proto as Record<string, Method>)[name] as Method
  ;(proto as Record<string, Method>)[name] = function(this: unknown, ...args: Array<unknown>) {
    const started = performance.now()
    const result = original.apply(this, args)
    const sql = sqlOf(this, args)
    if (typeof (result as { then?: unknown } | undefined)?.then === "function") {
      ;(result as Promise<unknown>).then(() => count(sql, performance.now() - started), () => count(sql, performance.now() - started))
    } else count(sql, performance.now() - started)
    return result
  }
}

for (const method of ["run", "get", "all", "iterate"]) wrap(StatementSync.prototype, method, (self) => (self as StatementSync).sourceSQL)
wrap(DatabaseSync.prototype, "exec", (_self, args) => args[0])
wrap(pg.Client.prototype, "query", (_self, args) => {
  const config = args[0]
  return typeof config === "string" ? config : (config as { readonly text?: unknown } | undefined)?.text
})

if (process.send !== undefined) {
  process.on("message", (message) => {
    if (typeof message !== "object" || message === null || (message as { probe?: unknown }).probe !== "statements") return
    process.send?.({ probe: "statements", counts: Object.fromEntries(counts) })
    counts = new Map()
  })
}
