/**
 * The push client as a user runs it, for the tests of test/client/: `push args…` as a child process
 * to completion, `push listen` in the background, read line by line, and tests against a server.
 */
import { it } from "@effect/vitest"
import { Effect } from "effect"
import { type ChildProcess, spawn } from "node:child_process"
import { join } from "node:path"
import type { Deployment } from "../e2e/servers.ts"

const root = new URL("../../", import.meta.url).pathname

export interface Run {
  readonly code: number | null
  readonly stdout: string
  readonly stderr: string
}

/** `push args…` to completion in `cwd`, with `input` on stdin; killed (code null) if still running after `timeoutMs`. */
export const runPush = (cwd: string, args: ReadonlyArray<string>, input = "", timeoutMs?: number): Promise<Run> =>
  new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [join(root, "src/bin/push.ts"), ...args], { cwd, stdio: ["pipe", "pipe", "pipe"] })
    let stdout = ""
    let stderr = ""
    const timer = timeoutMs === undefined ? undefined : setTimeout(() => child.kill("SIGKILL"), timeoutMs)
    child.stdout.on("data", (chunk: Buffer) => (stdout += chunk.toString()))
    child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()))
    child.on("error", reject)
    child.on("exit", (code) => {
      clearTimeout(timer)
      resolve({ code, stdout, stderr })
    })
    child.stdin.end(input)
  })

export interface Listener {
  readonly subscription: { readonly endpoint: string; readonly keys: { readonly p256dh: string; readonly auth: string } }
  readonly subscriptionText: string
  /** The next line printed after those already taken. */
  readonly nextLine: (timeoutMs?: number) => Promise<string>
  readonly lines: () => ReadonlyArray<string>
  readonly stderr: () => string
  readonly stop: () => Promise<void>
}

/** `push listen args…` in `cwd`, in the background, once it has printed its subscription. */
export const startListen = (cwd: string, args: ReadonlyArray<string>): Promise<Listener> => {
  const child: ChildProcess = spawn(process.execPath, [join(root, "src/bin/push.ts"), "listen", ...args], { cwd, stdio: ["ignore", "pipe", "pipe"] })
  const lines: Array<string> = []
  let partial = ""
  let stderr = ""
  let taken = 0
  const wakers = new Set<() => void>()
  child.stdout?.on("data", (chunk: Buffer) => {
    const parts = (partial + chunk.toString()).split("\n")
    partial = parts.pop() ?? ""
    lines.push(...parts)
    for (const wake of wakers) wake()
  })
  child.stderr?.on("data", (chunk: Buffer) => (stderr += chunk.toString()))
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()))
  const nextLine = (timeoutMs = 10_000) =>
    new Promise<string>((resolve, reject) => {
      const check = () => {
        if (taken < lines.length) {
          wakers.delete(check)
          clearTimeout(timer)
          resolve(lines[taken++]!)
        }
      }
      const timer = setTimeout(() => {
        wakers.delete(check)
        reject(new Error(`listen printed no line within ${timeoutMs} ms; stdout ${JSON.stringify(lines)}, stderr ${stderr}`))
      }, timeoutMs)
      wakers.add(check)
      check()
    })
  const stop = async () => {
    if (child.exitCode === null) child.kill("SIGINT")
    await exited
  }
  // Its message for people (stderr) is written before the subscription, but through another pipe.
  const withStderr = async (first: string) => {
    for (let i = 0; i < 100 && !stderr.includes("waiting for pushes"); i++) await new Promise((r) => setTimeout(r, 20))
    return first
  }
  return nextLine(20_000).then(withStderr).then(
    (first) => ({
      subscription: JSON.parse(first) as Listener["subscription"],
      subscriptionText: first,
      nextLine,
      lines: () => lines,
      stderr: () => stderr,
      stop
    }),
    async (error: unknown) => {
      await stop()
      throw error
    }
  )
}

/** A test against a running server: when it fails, the server's last lines are in the error. */
export const liveAgainst = (deployment: () => Deployment) => (title: string, body: () => Promise<void>) =>
  it.live(title, () =>
    Effect.tryPromise({
      try: body,
      catch: (e) => new Error(`${String(e)}\n--- server output (last 30 lines) ---\n${deployment().output.slice(-30).join("\n")}`)
    }), 60_000)
