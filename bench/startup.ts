/**
 * `npm run bench:startup`: time from spawning a node to it answering, for each entrypoint as the
 * npm scripts start it (`bin/*.js`: the compile cache is on before the first TypeScript module
 * loads), against the bare pipeline (`node:http` + `ws`, `delivery-servers.ts bare`) started the
 * same way.
 *
 * - all-in-one on embedded storage: a fresh data directory (tables created) and an existing one;
 * - autoconnect alone and autoendpoint alone, on a dynalite server started once beforehand;
 * - a deploy on one machine: autoconnect and autoendpoint started at the same moment.
 *
 * A node is ready when its `__lbheartbeat__` answers 200 (the all-in-one: on both ports); the bare
 * pipeline when its HTTP port accepts a request. Each figure is the median of --reps/BENCH_REPS (5)
 * starts, with the server CPU it used until ready (user + system, from /proc).
 */
import { type ChildProcess, spawn } from "node:child_process"
import { mkdtempSync, readFileSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { setTimeout as sleep } from "node:timers/promises"
import { generateFernetKey } from "../src/crypto/fernet.ts"
import { freePort } from "../test/e2e/servers.ts"

const option = (flag: string, env: string, fallback: string): string => {
  const i = process.argv.indexOf(`--${flag}`)
  return (i >= 0 ? process.argv[i + 1] : undefined) ?? process.env[env] ?? fallback
}
const REPS = Number(option("reps", "BENCH_REPS", "5"))
const root = new URL("../", import.meta.url).pathname
const work = mkdtempSync(join(tmpdir(), "autopush-bench-startup-"))

const cpuMs = (pid: number): number => {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8")
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ")
    return (Number(fields[11]) + Number(fields[12])) * 10
  } catch {
    return Number.NaN
  }
}

const answers = async (url: string): Promise<boolean> => {
  try {
    const res = await fetch(url)
    await res.arrayBuffer()
    return url.endsWith("__lbheartbeat__") ? res.ok : true
  } catch {
    return false
  }
}

const spawnNode = (script: string, args: ReadonlyArray<string>, cwd: string): ChildProcess =>
  spawn(process.execPath, [join(root, script), ...args], { cwd, stdio: ["ignore", "ignore", "inherit"] })

const stop = (child: ChildProcess): Promise<void> =>
  new Promise((resolve) => {
    if (child.exitCode !== null) return resolve()
    child.once("exit", () => resolve())
    child.kill("SIGTERM")
    setTimeout(() => child.kill("SIGKILL"), 5_000).unref()
  })

interface Start {
  readonly ms: number
  readonly cpu: number
}

/** Spawn the processes, wait until every URL answers; ms since spawn and CPU of the processes. */
const timeStart = async (spawnAll: () => Array<ChildProcess>, urls: ReadonlyArray<string>): Promise<Start> => {
  const began = performance.now()
  const children = spawnAll()
  const pending = new Set(urls)
  while (pending.size > 0) {
    if (children.some((c) => c.exitCode !== null)) throw new Error("a node exited while starting (its error is above)")
    if (performance.now() - began > 30_000) throw new Error(`not ready after 30 s: ${[...pending].join(", ")}`)
    for (const url of [...pending]) if (await answers(url)) pending.delete(url)
    if (pending.size > 0) await sleep(5)
  }
  const ms = performance.now() - began
  const cpu = children.reduce((sum, c) => sum + cpuMs(c.pid as number), 0)
  await Promise.all(children.map(stop))
  return { ms, cpu }
}

const median = (xs: ReadonlyArray<number>): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] as number

const measure = async (name: string, once: (rep: number) => Promise<Start>): Promise<{ name: string; ms: number; cpu: number }> => {
  const runs: Array<Start> = []
  for (let rep = 0; rep < REPS; rep++) runs.push(await once(rep))
  return { name, ms: median(runs.map((r) => r.ms)), cpu: median(runs.map((r) => r.cpu)) }
}

const quiet = ["--log-level", "warn", "--bind-host", "127.0.0.1"]

const rows: Array<{ name: string; ms: number; cpu: number }> = []
try {
  rows.push(await measure("bare node:http + ws", async () => {
    const [ws, http] = [await freePort(), await freePort()]
    return timeStart(() => [spawnNode("bench/delivery-servers.ts", ["bare", String(ws), String(http)], work)], [`http://127.0.0.1:${http}/`])
  }))

  const allInOne = async (dataDir: string) => {
    const [ws, router, endpoint] = [await freePort(), await freePort(), await freePort()]
    const args = [...quiet, "--data-dir", dataDir, "--port", String(ws), "--router-port", String(router), "--endpoint-port", String(endpoint)]
    return timeStart(() => [spawnNode("bin/autopush.js", args, work)], [
      `http://127.0.0.1:${endpoint}/__lbheartbeat__`,
      `http://127.0.0.1:${router}/__lbheartbeat__`
    ])
  }
  rows.push(await measure("all-in-one, embedded storage, new data dir", (rep) => allInOne(join(work, `fresh-${rep}`))))
  rows.push(await measure("all-in-one, embedded storage, existing data dir", () => allInOne(join(work, "fresh-0"))))

  // The split nodes on one dynalite server, started once.
  const dynamoPort = await freePort()
  const dynalite = spawn(process.execPath, [join(root, "node_modules/dynalite/cli.js"), "--port", String(dynamoPort), "--path", join(work, "db")], {
    stdio: "ignore"
  })
  try {
    while (!(await answers(`http://127.0.0.1:${dynamoPort}/`))) await sleep(20)
    const shared = [...quiet, "--storage-endpoint", `http://127.0.0.1:${dynamoPort}`, "--crypto-key", generateFernetKey(), "--auth-keys", "bench-auth-key"]
    const connection = async () => {
      const [ws, router] = [await freePort(), await freePort()]
      return {
        spawn: () => spawnNode("bin/autoconnect.js", [...shared, "--port", String(ws), "--router-port", String(router), "--endpoint-url", "http://127.0.0.1:8082"], work),
        url: `http://127.0.0.1:${router}/__lbheartbeat__`
      }
    }
    const endpoint = async () => {
      const [port, metrics] = [await freePort(), await freePort()]
      return {
        spawn: () => spawnNode("bin/autoendpoint.js", [...shared, "--endpoint-port", String(port), "--metrics-port", String(metrics)], work),
        url: `http://127.0.0.1:${port}/__lbheartbeat__`
      }
    }
    // The first start creates the tables; the figures are of nodes joining existing storage.
    const first = await connection()
    await timeStart(() => [first.spawn()], [first.url])
    rows.push(await measure("autoconnect alone (dynalite)", async () => {
      const node = await connection()
      return timeStart(() => [node.spawn()], [node.url])
    }))
    rows.push(await measure("autoendpoint alone (dynalite)", async () => {
      const node = await endpoint()
      return timeStart(() => [node.spawn()], [node.url])
    }))
    rows.push(await measure("autoconnect + autoendpoint at once", async () => {
      const [c, e] = [await connection(), await endpoint()]
      return timeStart(() => [c.spawn(), e.spawn()], [c.url, e.url])
    }))
  } finally {
    await stop(dynalite)
  }
} finally {
  rmSync(work, { recursive: true, force: true })
}

const bare = rows[0] as { ms: number; cpu: number }
console.log(`\nstart to ready, median of ${REPS} (CPU = user + system of the started processes until ready)`)
console.log(`${"".padEnd(50)} ${"ms".padStart(7)} ${"× bare".padStart(7)} ${"CPU ms".padStart(7)}`)
for (const row of rows) {
  console.log(`${row.name.padEnd(50)} ${row.ms.toFixed(0).padStart(7)} ${(row.ms / bare.ms).toFixed(1).padStart(7)} ${row.cpu.toFixed(0).padStart(7)}`)
}
