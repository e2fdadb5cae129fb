/**
 * The embedded data directory of the all-in-one: private to the user it runs as (0700, the database
 * files 0600, said once when it was not), and a database that lost its contents refused in one line
 * rather than started anew — while a second process beside a live first one, and a first start,
 * run as usual.
 */
import { spawn } from "node:child_process"
import { chmodSync, existsSync, readFileSync, rmSync, statSync, truncateSync } from "node:fs"
import { dirname, join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { allInOneFlags, type Deployment, freePorts, startAllInOne } from "./servers.ts"

const root = new URL("../../", import.meta.url).pathname

const modeOf = (path: string): number => statSync(path).mode & 0o777

/** The all-in-one in `cwd` on new ports (and `extra` flags), until `until` is in its output (then SIGTERM) or it exits. */
const runAllInOne = async (cwd: string, until?: string, extra: ReadonlyArray<string> = []) => {
  // A free port is only free until someone takes it (and a second worker's router port, the one
  // after the first's, is not held while ports are picked): on "in use", again on new ports.
  for (let attempt = 1; ; attempt++) {
    const run = await runAllInOneOnce(cwd, until, extra)
    if (attempt >= 3 || !/EADDRINUSE|is in use/.test(run.stderr)) return run
  }
}

const runAllInOneOnce = async (cwd: string, until: string | undefined, extra: ReadonlyArray<string>) => {
  const [ws, router, endpoint] = (await freePorts(3)) as [number, number, number]
  return new Promise<{ readonly code: number | null; readonly stdout: string; readonly stderr: string }>((resolve) => {
    const child = spawn(process.execPath, [join(root, "src/bin/autopush.ts"), ...allInOneFlags({ ws, router, endpoint }), ...extra], {
      cwd,
      stdio: ["ignore", "pipe", "pipe"]
    })
    let stdout = ""
    let stderr = ""
    child.stdout.on("data", (chunk: Buffer) => {
      stdout += chunk.toString()
      if (until !== undefined && stdout.includes(until)) child.kill("SIGTERM")
    })
    child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()))
    const timer = setTimeout(() => child.kill("SIGKILL"), 30_000)
    child.on("exit", (code) => {
      clearTimeout(timer)
      resolve({ code, stdout, stderr })
    })
  })
}

/** Until the deployment's output has a line with `text` after line `from`. */
const outputHas = async (deployment: Deployment, text: string, from = 0) => {
  const deadline = Date.now() + 20_000
  while (!deployment.output.slice(from).some((line) => line.includes(text))) {
    if (Date.now() > deadline) throw new Error(`no "${text}" in the output:\n${deployment.output.slice(-20).join("\n")}`)
    await new Promise((r) => setTimeout(r, 50))
  }
}

describe("the embedded data directory", () => {
  let deployment: Deployment
  let database: string
  let dataDir: string
  let marker: string

  beforeAll(async () => {
    deployment = await startAllInOne()
    database = deployment.storageFile!
    dataDir = dirname(database)
    marker = `${database}.started`
    await outputHas(deployment, "ready:")
  }, 60_000)
  afterAll(() => deployment?.stop())

  it("a first start makes it 0700, the database and its -wal and -shm files 0600, and records the database as used", () => {
    expect(modeOf(dataDir)).toBe(0o700)
    for (const file of [database, `${database}-wal`, `${database}-shm`, join(dataDir, "secrets.json")]) expect(modeOf(file), file).toBe(0o600)
    expect(JSON.parse(readFileSync(marker, "utf8")).since).toMatch(/^\d{4}-\d\d-\d\dT/)
    expect(modeOf(marker)).toBe(0o600)
    expect(deployment.output.join("\n")).not.toMatch(/made private/)
  })

  it("a directory and files left open to others are made private at the next start, said in one line", async () => {
    const from = deployment.output.length
    await deployment.restartConnection(async () => {
      chmodSync(dataDir, 0o755)
      chmodSync(database, 0o644)
      chmodSync(join(dataDir, "secrets.json"), 0o640)
    })
    await outputHas(deployment, "ready:", from)
    expect(modeOf(dataDir)).toBe(0o700)
    expect(modeOf(database)).toBe(0o600)
    expect(modeOf(join(dataDir, "secrets.json"))).toBe(0o600)
    const said = deployment.output.slice(from).filter((line) => line.includes("made private"))
    expect(said).toHaveLength(1)
    expect(JSON.parse(said[0]!).Fields.paths).toEqual([dataDir, database, join(dataDir, "secrets.json")])
  }, 60_000)

  it("a second node beside the live first one, as two workers, starts on the same database", async () => {
    const second = await runAllInOne(dirname(dataDir), "ready:", ["--workers", "2"])
    expect(second.stdout, second.stderr).toContain("2 workers")
    expect(second.stdout, second.stderr).toContain("ready:")
    expect(second.stderr).not.toMatch(/cannot start/)
  }, 60_000)

  it("a database truncated to 0 bytes, or missing, beside its marker is refused in one line and left as found; without the marker it starts anew", async () => {
    const from = deployment.output.length
    await deployment.restartConnection(async () => {
      truncateSync(database, 0)
      for (const file of [`${database}-wal`, `${database}-shm`]) rmSync(file, { force: true })
      const empty = await runAllInOne(dirname(dataDir))
      expect(empty.code).toBe(1)
      const lines = empty.stderr.trim().split("\n")
      expect(lines, empty.stderr).toHaveLength(1)
      expect(lines[0]).toMatch(
        new RegExp(
          `^autopush: cannot start: ${database} is empty \\(0 bytes: a failed copy or restore\\?\\), but ${marker} says nodes ran on a database there since \\d{4}-.*: ` +
            `its users and stored messages are gone\\. .*restore the database from a backup; or, to start anew .* remove ${marker} \\(option data_dir\\)$`
        )
      )
      expect(statSync(database).size).toBe(0)

      rmSync(database)
      const missing = await runAllInOne(dirname(dataDir))
      expect(missing.code).toBe(1)
      expect(missing.stderr.trim()).toMatch(new RegExp(`^autopush: cannot start: ${database} is missing, but ${marker} says`))
      expect(existsSync(database)).toBe(false)

      // Starting anew on purpose: the marker removed (secrets.json stays: the same keys).
      rmSync(marker)
    })
    await outputHas(deployment, "ready:", from)
    expect(existsSync(marker)).toBe(true)
  }, 120_000)
})
