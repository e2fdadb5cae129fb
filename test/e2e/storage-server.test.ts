/**
 * `npm run storage`: the embedded storage as a server of its own. Nodes and tools reach it by its
 * endpoint; the maintenance tools find it from the data directory too; its data outlives a stop,
 * which is exit 0; a second server on the same data, a port in use and a bad port are refused in
 * one line. (Separate nodes on it: every end-to-end test of `startSeparate`.)
 */
import { type ChildProcess, spawn } from "node:child_process"
import { mkdtempSync, rmSync } from "node:fs"
import { createServer } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import { freePorts } from "./servers.ts"

const root = new URL("../../", import.meta.url).pathname
const cwd = mkdtempSync(join(tmpdir(), "autopush-storage-server-"))
const dataDir = join(cwd, "data")
afterAll(() => rmSync(cwd, { recursive: true, force: true }))

interface Ran {
  readonly code: number | null
  readonly stdout: string
  readonly stderr: string
}

const collect = (child: ChildProcess) => {
  const out = { stdout: "", stderr: "" }
  child.stdout?.on("data", (c: Buffer) => (out.stdout += c.toString()))
  child.stderr?.on("data", (c: Buffer) => (out.stderr += c.toString()))
  const exited = new Promise<Ran>((resolve) => child.once("exit", (code) => resolve({ code, ...out })))
  return { out, exited }
}

const spawnScript = (script: string, args: ReadonlyArray<string>) =>
  spawn(process.execPath, [join(root, "src/bin", script), ...args], { cwd, stdio: ["ignore", "pipe", "pipe"] })

const runScript = (script: string, args: ReadonlyArray<string>): Promise<Ran> => {
  const child = spawnScript(script, args)
  const timer = setTimeout(() => child.kill("SIGKILL"), 30_000)
  return collect(child).exited.finally(() => clearTimeout(timer))
}

/** A storage server, once it says it serves. */
const serve = async (port: number) => {
  const child = spawnScript("storage.ts", ["--port", String(port), "--data-dir", dataDir])
  const { out, exited } = collect(child)
  const deadline = Date.now() + 30_000
  while (!out.stdout.includes("storage: the DynamoDB API on")) {
    if (child.exitCode !== null || Date.now() > deadline) throw new Error(`storage did not start: ${out.stdout}${out.stderr}`)
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
  return {
    out,
    stop: async (): Promise<Ran> => {
      child.kill("SIGTERM")
      return exited
    }
  }
}

describe("npm run storage", () => {
  it("serves the embedded data to nodes and tools; the data outlives a stop (exit 0); refusals in one line", async () => {
    const [port, other] = (await freePorts(2)) as [number, number]
    const first = await serve(port)
    expect(first.out.stdout).toContain(`storage: the DynamoDB API on 127.0.0.1:${port} (data under ${join(dataDir, "dynalite")}); nodes use it with storage_endpoint=http://<this host>:${port}`)

    // A tool by the endpoint; another by the data directory (it finds the running server).
    const created = await runScript("maintenance.ts", ["create-tables", "--storage-endpoint", `http://127.0.0.1:${port}`])
    expect(created.code, created.stderr).toBe(0)
    const listed = await runScript("maintenance.ts", ["list-tables", "--data-dir", dataDir])
    expect(listed.code, listed.stderr).toBe(0)
    expect(listed.stdout).toMatch(/message_\d{4}_\d{2}/)

    // A second server on the same data: refused, the first one untouched.
    const second = await runScript("storage.ts", ["--port", String(other), "--data-dir", dataDir])
    expect(second.code).toBe(1)
    expect(second.stderr.trim()).toMatch(/^storage: the embedded data under .*dynalite is in use by another process: stop it first/)

    const stopped = await first.stop()
    expect(stopped.code, stopped.stderr).toBe(0)

    // Started again on the same data: the tables are there.
    const again = await serve(port)
    const relisted = await runScript("maintenance.ts", ["list-tables", "--storage-endpoint", `http://127.0.0.1:${port}`])
    expect(relisted.stdout).toBe(listed.stdout.replace(`embedded data under ${join(dataDir, "dynalite")}`, `DynamoDB at http://127.0.0.1:${port}`))
    expect((await again.stop()).code).toBe(0)

    // A port in use; a port that is not one.
    const holder = createServer()
    await new Promise<void>((resolve) => holder.listen(other, "127.0.0.1", resolve))
    try {
      const inUse = await runScript("storage.ts", ["--port", String(other), "--data-dir", dataDir])
      expect(inUse.code).toBe(1)
      expect(inUse.stderr.trim()).toBe(`storage: cannot serve ${join(dataDir, "dynalite")} on 127.0.0.1:${other}: port ${other} is in use (option --port): stop what listens on 127.0.0.1:${other}, or choose another port`)
    } finally {
      holder.close()
    }
    const bad = await runScript("storage.ts", ["--port", "70000"])
    expect(bad.code).toBe(2)
    expect(bad.stderr.trim()).toBe("storage: --port 70000 is not a port (1-65535) (see storage --help)")
  }, 120_000)
})
