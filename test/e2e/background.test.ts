/**
 * A server started in the background (`nohup node src/bin/autopush.ts &`) keeps serving after the
 * shell that started it exits; one started by npm stops when that npm is gone, and says why in one
 * line. The parent here is a shell that starts the server in the background, waits until it serves,
 * and exits.
 */
import { type ChildProcess, spawn } from "node:child_process"
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "vitest"
import { allInOneFlags, freePorts } from "./servers.ts"

const root = new URL("../../", import.meta.url).pathname
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

/** Whether the process is gone (a zombie nobody reaps counts as gone). */
const gone = (pid: number): boolean => {
  try {
    process.kill(pid, 0)
  } catch {
    return true
  }
  try {
    return /^\d+ \(.*\) Z/.test(readFileSync(`/proc/${pid}/stat`, "utf8"))
  } catch {
    return false
  }
}

const serving = (url: string): Promise<boolean> =>
  fetch(url, { signal: AbortSignal.timeout(2_000) }).then((res) => res.ok, () => false)

/** The test process's environment without what npm adds to a script's (the tests may run under `npm test`). */
const withoutNpm = (): NodeJS.ProcessEnv => Object.fromEntries(Object.entries(process.env).filter(([key]) => !key.startsWith("npm_")))

interface Background {
  readonly pid: number
  readonly heartbeat: string
  readonly log: () => string
  /** Lets the parent shell exit, and waits until it has. */
  readonly dropParent: () => Promise<void>
  readonly stop: () => Promise<void>
}

/**
 * `sh -c 'node src/bin/autopush.ts … > server.log 2>&1 & …'`: the shell prints the server's pid,
 * stays until `dropParent` (so that the server starts with the shell as its parent), then exits.
 */
const startInBackground = async (env: NodeJS.ProcessEnv): Promise<Background> => {
  const cwd = mkdtempSync(join(tmpdir(), "autopush-background-"))
  const [ws, router, endpoint] = (await freePorts(3)) as [number, number, number]
  const args = [join(root, "src/bin/autopush.ts"), ...allInOneFlags({ ws, router, endpoint })]
  const script = `"$@" > server.log 2>&1 < /dev/null & echo $!; while [ ! -e go ]; do sleep 0.1; done`
  const shell: ChildProcess = spawn("sh", ["-c", script, "sh", process.execPath, ...args], { cwd, env, stdio: ["ignore", "pipe", "inherit"] })
  const shellExited = new Promise<void>((resolve) => shell.once("exit", () => resolve()))
  const pid = await new Promise<number>((resolve, reject) => {
    let out = ""
    shell.stdout?.on("data", (chunk: Buffer) => {
      out += chunk.toString()
      if (out.includes("\n")) resolve(Number(out.trim()))
    })
    shell.once("exit", () => reject(new Error(`the shell exited before starting the server: ${out}`)))
  })
  const log = () => {
    try {
      return readFileSync(join(cwd, "server.log"), "utf8")
    } catch {
      return ""
    }
  }
  const heartbeat = `http://127.0.0.1:${endpoint}/__lbheartbeat__`
  const dropParent = async () => {
    writeFileSync(join(cwd, "go"), "")
    await shellExited
  }
  const stop = async () => {
    await dropParent()
    if (!gone(pid)) process.kill(pid, "SIGTERM")
    for (const deadline = Date.now() + 10_000; !gone(pid) && Date.now() < deadline;) await sleep(100)
    if (!gone(pid)) process.kill(pid, "SIGKILL")
    rmSync(cwd, { recursive: true, force: true })
  }
  try {
    for (const deadline = Date.now() + 30_000; !(await serving(heartbeat));) {
      if (gone(pid) || Date.now() > deadline) throw new Error(`the server did not come up; its output:\n${log()}`)
      await sleep(100)
    }
  } catch (error) {
    await stop()
    throw error
  }
  return { pid, heartbeat, log, dropParent, stop }
}

describe("a server whose parent process goes away", () => {
  it("started in the background by a shell that exits (not npm): still serving 3 s later", async () => {
    const server = await startInBackground(withoutNpm())
    try {
      await server.dropParent()
      await sleep(3_000)
      assert.isFalse(gone(server.pid), `the server stopped; its output:\n${server.log()}`)
      assert.isTrue(await serving(server.heartbeat), `the server does not answer; its output:\n${server.log()}`)
      assert.notInclude(server.log(), "stopping:")
    } finally {
      await server.stop()
    }
  }, 60_000)

  it("started by npm (npm_lifecycle_event set) whose npm goes away: stops, with one line saying why", async () => {
    const server = await startInBackground({ ...withoutNpm(), npm_lifecycle_event: "start" })
    try {
      await server.dropParent()
      for (const deadline = Date.now() + 15_000; !gone(server.pid) && Date.now() < deadline;) await sleep(100)
      assert.isTrue(gone(server.pid), `the server is still running; its output:\n${server.log()}`)
      const why = server.log().split("\n").filter((line) => line.includes("stopping: the npm process that started this autopush"))
      assert.strictEqual(why.length, 1, server.log())
      assert.include(why[0], "start it without npm: `node bin/autopush.js`")
    } finally {
      await server.stop()
    }
  }, 60_000)
})
