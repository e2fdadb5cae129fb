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
  /**
   * The text of the next push reported (on stderr) after those already taken: what follows
   * "acked 100: ", "" for a push without payload, the whole report for another (not decrypted).
   */
  readonly nextPush: (timeoutMs?: number) => Promise<string>
  /** The lines printed on stdout so far. */
  readonly lines: () => ReadonlyArray<string>
  readonly stderr: () => string
  readonly stop: () => Promise<void>
}

/** A push report's text (see `Listener.nextPush`). */
const pushText = (report: string): string => {
  const acked = report.match(/, acked 100(?:: (.*))?$/)
  return acked === null ? report : acked[1] ?? ""
}

/** `push listen args…` in `cwd`, in the background, once it has printed its subscription. */
export const startListen = (cwd: string, args: ReadonlyArray<string>): Promise<Listener> => {
  const child: ChildProcess = spawn(process.execPath, [join(root, "src/bin/push.ts"), "listen", ...args], { cwd, stdio: ["ignore", "pipe", "pipe"] })
  const lines: Array<string> = []
  const reports: Array<string> = []
  const partial = { stdout: "", stderr: "" }
  let stderr = ""
  let taken = 0
  const wakers = new Set<() => void>()
  /** The complete lines of a stream's next chunk, the rest kept for the next. */
  const linesOf = (stream: "stdout" | "stderr", chunk: Buffer): Array<string> => {
    const parts = (partial[stream] + chunk.toString()).split("\n")
    partial[stream] = parts.pop() ?? ""
    return parts
  }
  child.stdout?.on("data", (chunk: Buffer) => {
    lines.push(...linesOf("stdout", chunk))
    for (const wake of wakers) wake()
  })
  child.stderr?.on("data", (chunk: Buffer) => {
    stderr += chunk.toString()
    reports.push(...linesOf("stderr", chunk).filter((line) => line.startsWith("push received (")))
    for (const wake of wakers) wake()
  })
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()))
  const waitFor = <A>(what: string, ready: () => A | undefined, timeoutMs: number) =>
    new Promise<A>((resolve, reject) => {
      const check = () => {
        const value = ready()
        if (value !== undefined) {
          wakers.delete(check)
          clearTimeout(timer)
          resolve(value)
        }
      }
      const timer = setTimeout(() => {
        wakers.delete(check)
        reject(new Error(`listen printed no ${what} within ${timeoutMs} ms; stdout ${JSON.stringify(lines)}, stderr ${stderr}`))
      }, timeoutMs)
      wakers.add(check)
      check()
    })
  const nextPush = (timeoutMs = 10_000) => waitFor("push report", () => (taken < reports.length ? pushText(reports[taken++]!) : undefined), timeoutMs)
  const stop = async () => {
    if (child.exitCode === null) child.kill("SIGINT")
    await exited
  }
  // Its message for people (stderr) is written before the subscription, but through another pipe.
  const withStderr = async (first: string) => {
    for (let i = 0; i < 100 && !stderr.includes("waiting for pushes"); i++) await new Promise((r) => setTimeout(r, 20))
    return first
  }
  return waitFor("subscription", () => lines[0], 20_000).then(withStderr).then(
    (first) => ({
      subscription: JSON.parse(first) as Listener["subscription"],
      subscriptionText: first,
      nextPush,
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
