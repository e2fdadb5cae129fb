/**
 * `npm run bench:stop-saves`: what saving the unacked messages of a stopping node costs the embedded
 * store, apart from the connections: the part of `bench:stop` no change to the sessions can take away.
 *
 * A database file with 100,000 users' messages already in it (one process, batches of 500), then
 * 100,000 more saved as a node's workers save them when it stops: `Storage.saveManyMessages`, one
 * message per user, users in random order, batches of `--batch` (20: about what one turn of a
 * stopping worker's event loop gathers) and of ten times that, by 1 process and by `--processes`
 * (7, as `bench:stop -- --clients 100000 --workers 7`) at once on the same file, each round on a
 * copy of the filled file. Each process opens the store first; the saves start together.
 *
 * Printed: the CPU a message costs (all threads of all processes: the statements, the log's
 * writes, the checkpoint threads) and how much of it is the kernel's, the wall time for the
 * 100,000, and the messages saved a second.
 *
 * Options (flag or environment): --processes/BENCH_PROCESSES (7), --batch/BENCH_BATCH (20).
 */
import { type ChildProcess, fork } from "node:child_process"
import { copyFileSync, existsSync, mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Context, Effect, Layer } from "effect"
import { layerSqlite } from "../src/storage/sqlite/layer.ts"
import type { MessageSave } from "../src/storage/manySaves.ts"
import { Storage } from "../src/storage/Storage.ts"
import { option } from "./harness.ts"

const PROCESSES = Number(option("processes", "BENCH_PROCESSES", "7"))
const BATCH = Number(option("batch", "BENCH_BATCH", "20"))
const USERS = 100_000
/** About the body `bench:stop` pushes (128 bytes, base64url) as a stored row holds it. */
const DATA = "x".repeat(200)

/** The `index`th user's save: spread over the key space as random uaids are. */
const saveOf = (table: string, index: number, now: number): MessageSave => ({
  uaid: `${((index * 2654435761) % 4294967296).toString(16).padStart(8, "0")}${String(index).padStart(24, "0")}`,
  table,
  messages: [{ channelId: "6f1e0a2c-3b4d-4e5f-8a9b-0c1d2e3f4a5b", version: `v${index}`, ttl: 3600, timestamp: Math.floor(now / 1000), sortkeyTimestamp: now, data: DATA }]
})

/** A saving process: opens the store, says so, saves users `first` … `first + count - 1` in batches of `batch` when told, reports its CPU. */
const saver = (path: string) =>
  Effect.runPromise(Effect.scoped(Effect.gen(function*() {
    const storage = Context.get(yield* Layer.build(layerSqlite({ path, routerTable: "router", messageTablePrefix: "message", noTableRotation: true })), Storage)
    const table = yield* storage.currentMessageTable
    yield* storage.createTables([table])
    const { first, count, batch } = yield* Effect.callback<{ first: number; count: number; batch: number }>((resume) => {
      process.once("message", (m) => resume(Effect.succeed(m as { first: number; count: number; batch: number })))
      process.send?.("ready")
    })
    const cpu = process.cpuUsage()
    for (let i = first; i < first + count; i += batch) {
      const now = Date.now()
      yield* storage.saveManyMessages(Array.from({ length: Math.min(batch, first + count - i) }, (_, k) => saveOf(table, i + k, now)))
    }
    return process.cpuUsage(cpu)
  }))).then((cpu) => process.send?.(cpu, () => process.exit(0)))

/** `processes` savers on the file at `path`, users `first` … `first + USERS - 1` shared among them: [CPU µs a message, of it the kernel's, wall s]. */
const round = async (path: string, processes: number, first: number, batch: number) => {
  const children: Array<ChildProcess> = Array.from({ length: processes }, () => fork(process.argv[1] as string, [], { env: { ...process.env, BENCH_SAVER: path } }))
  await Promise.all(children.map((child) => new Promise((resolve) => child.once("message", resolve))))
  const began = performance.now()
  const used = await Promise.all(children.map((child, k) =>
    new Promise<NodeJS.CpuUsage>((resolve, reject) => {
      child.once("message", (cpu) => resolve(cpu as NodeJS.CpuUsage))
      child.once("exit", (code) => code !== 0 && reject(new Error(`a saving process exited with code ${code}`)))
      const from = Math.floor((USERS * k) / processes)
      child.send({ first: first + from, count: Math.floor((USERS * (k + 1)) / processes) - from, batch })
    })))
  const wall = (performance.now() - began) / 1000
  const [user, system] = [used.reduce((sum, u) => sum + u.user, 0), used.reduce((sum, u) => sum + u.system, 0)]
  return [(user + system) / USERS, system / USERS, wall] as const
}

if (process.env["BENCH_SAVER"] !== undefined) {
  await saver(process.env["BENCH_SAVER"])
} else {
  const dir = mkdtempSync(join(tmpdir(), "autopush-stop-saves-"))
  try {
    const filled = join(dir, "filled.sqlite")
    const [fillUs, , fillS] = await round(filled, 1, 0, 500)
    console.log(`bench:stop-saves: ${USERS} users' messages in the file first (1 process, batches of 500: ${fillUs.toFixed(0)} µs CPU a message, ${fillS.toFixed(1)} s)`)
    console.log("")
    console.log("| processes | batch | CPU µs a message | of it the kernel's | wall s for 100,000 | messages/s |")
    console.log("|---:|---:|---:|---:|---:|---:|")
    for (const processes of [1, PROCESSES]) {
      for (const batch of [BATCH, BATCH * 10]) {
        const path = join(mkdtempSync(join(dir, "round-")), "autopush.sqlite")
        for (const suffix of ["", "-wal"]) if (existsSync(filled + suffix)) copyFileSync(filled + suffix, path + suffix)
        const [cpuUs, systemUs, wall] = await round(path, processes, USERS, batch)
        console.log(`| ${processes} | ${batch} | ${cpuUs.toFixed(0)} | ${systemUs.toFixed(0)} | ${wall.toFixed(2)} | ${(USERS / wall).toFixed(0)} |`)
      }
    }
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
}
