/**
 * The processes of `bench:scaling`, seen from outside: started (our entrypoint without an IPC
 * channel, as an operator starts it; the bench's own servers and clients with one), waited for,
 * asked over IPC, stopped, and their CPU read from /proc over a whole process tree (a supervisor
 * and the workers it forked). Also free ports in a row, for the workers' router ports.
 */
import { type ChildProcess, fork, spawn } from "node:child_process"
import { readdirSync, readFileSync } from "node:fs"
import { createServer, type Server } from "node:net"
import { setTimeout as sleep } from "node:timers/promises"
import { cpuMs } from "./harness.ts"

export interface Proc {
  readonly name: string
  readonly child: ChildProcess
  readonly pid: number
  /** Its last lines, for failure reports (and the ready line). */
  readonly output: Array<string>
}

/** Every process started and not yet stopped, with the descendants seen of each: none outlives the bench. */
const running = new Map<Proc, Set<number>>()

/** Whole lines into `output` (a chunk may end mid-line), its tail only: the servers log as they go. */
const collectInto = (output: Array<string>) => {
  let partial = ""
  return (chunk: Buffer) => {
    const lines = (partial + chunk.toString()).split("\n")
    partial = lines.pop() ?? ""
    output.push(...lines.filter((l) => l.length > 0))
    if (output.length > 400) output.splice(0, output.length - 200)
  }
}

const track = (name: string, child: ChildProcess): Proc => {
  const output: Array<string> = []
  child.stdout?.on("data", collectInto(output))
  child.stderr?.on("data", collectInto(output))
  const proc = { name, child, pid: child.pid as number, output }
  running.set(proc, new Set())
  return proc
}

/** One of the bench's own scripts, with an IPC channel (it says `{ ready }` over it). */
export const forkNode = (name: string, script: string, args: ReadonlyArray<string>, cwd: string): Proc =>
  track(name, fork(script, args, { cwd, stdio: ["ignore", "pipe", "pipe", "ipc"] }))

/**
 * An entrypoint as an operator runs it: no IPC channel (a supervisor may tell its workers by theirs),
 * output read from its pipes.
 */
export const spawnNode = (name: string, script: string, args: ReadonlyArray<string>, cwd: string): Proc =>
  track(name, spawn(process.execPath, [script, ...args], { cwd, stdio: ["ignore", "pipe", "pipe"] }))

/** What `next` and `ask` need of a process: its name, its IPC channel, its last lines. */
type Messaging = Pick<Proc, "name" | "child" | "output">

const tail = (proc: Messaging) => `${proc.name}, last output:\n${proc.output.slice(-15).join("\n")}`
const exited = (proc: Proc) => proc.child.exitCode !== null || proc.child.signalCode !== null

/** The next IPC message of `proc` that `predicate` accepts; fails if it exits or takes too long. */
export const next = <T>(proc: Messaging, predicate: (m: Record<string, unknown>) => boolean, timeoutMs: number): Promise<T> =>
  new Promise((resolve, reject) => {
    const cleanup = () => {
      clearTimeout(timer)
      proc.child.off("message", onMessage)
      proc.child.off("exit", onExit)
    }
    const onMessage = (m: unknown) => {
      if (typeof m !== "object" || m === null || !predicate(m as Record<string, unknown>)) return
      cleanup()
      resolve(m as T)
    }
    const onExit = (code: number | null) => {
      cleanup()
      reject(new Error(`exited (${code}): ${tail(proc)}`))
    }
    const timer = setTimeout(() => {
      cleanup()
      reject(new Error(`no answer in ${timeoutMs} ms: ${tail(proc)}`))
    }, timeoutMs)
    proc.child.on("message", onMessage)
    proc.child.once("exit", onExit)
  })

export const ask = <T>(proc: Messaging, message: object, predicate: (m: Record<string, unknown>) => boolean, timeoutMs = 30_000): Promise<T> => {
  const answer = next<T>(proc, predicate, timeoutMs)
  proc.child.send(message)
  return answer
}

/** Until `check` holds; fails at once if `proc` exits meanwhile. */
export const waitUntil = async (proc: Proc, what: string, check: () => Promise<boolean> | boolean, timeoutMs = 60_000): Promise<void> => {
  const deadline = Date.now() + timeoutMs
  while (Date.now() < deadline && !exited(proc)) {
    if (await check()) return
    await sleep(100)
  }
  throw new Error(`${what}: ${exited(proc) ? "exited" : `not in ${timeoutMs} ms`}; ${tail(proc)}`)
}

export const answers = async (url: string): Promise<boolean> => {
  try {
    return (await fetch(url)).ok
  } catch {
    return false
  }
}

// ── process trees and their CPU ──────────────────────────────────────────────────────────────────

/** The children of every thread of `pid` (a process forks from any of its threads). */
const childrenOf = (pid: number): Array<number> => {
  try {
    return readdirSync(`/proc/${pid}/task`).flatMap((tid) =>
      readFileSync(`/proc/${pid}/task/${tid}/children`, "utf8").split(" ").filter((s) => s.trim() !== "").map(Number))
  } catch {
    return [] // gone
  }
}

/** `pid` and all its descendants. */
export const processTree = (pid: number): Array<number> => [pid, ...childrenOf(pid).flatMap(processTree)]

/** User + system CPU of the processes, in ms; one gone meanwhile counts 0. */
export const cpuOfMs = (pids: ReadonlyArray<number>): number =>
  pids.reduce((sum, pid) => {
    try {
      return sum + cpuMs(pid)
    } catch {
      return sum
    }
  }, 0)

// ── stopping ─────────────────────────────────────────────────────────────────────────────────────

const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}

/**
 * SIGTERM (SIGKILL after 10 s), then the same for any descendant still there: a supervisor is to
 * stop its workers, but the next measurement must not share the cores with a leftover.
 */
export const stop = async (proc: Proc): Promise<void> => {
  const descendants = new Set([...(running.get(proc) ?? []), ...processTree(proc.pid).slice(1)])
  if (!exited(proc)) {
    const kill = setTimeout(() => proc.child.kill("SIGKILL"), 10_000)
    const gone = new Promise((resolve) => proc.child.once("exit", resolve))
    proc.child.kill("SIGTERM")
    await gone
    clearTimeout(kill)
  }
  for (let waited = 0; waited < 50 && [...descendants].some(alive); waited++) await sleep(100)
  for (const pid of descendants) if (alive(pid)) process.kill(pid, "SIGKILL")
  running.delete(proc)
}

export const stopAll = (procs: ReadonlyArray<Proc>): Promise<unknown> => Promise.all(procs.map(stop))

/** Remembers `proc`'s descendants now, so that `killAll` finds them even after `proc` is gone. */
export const rememberTree = (proc: Proc): void => {
  for (const pid of processTree(proc.pid).slice(1)) running.get(proc)?.add(pid)
}

/** On the way out, whatever happened. */
export const killAll = (): void => {
  for (const [proc, descendants] of running) {
    for (const pid of [proc.pid, ...processTree(proc.pid).slice(1), ...descendants]) if (alive(pid)) process.kill(pid, "SIGKILL")
  }
  running.clear()
}

// ── ports ────────────────────────────────────────────────────────────────────────────────────────

const bind = (port: number): Promise<Server | undefined> =>
  new Promise((resolve) => {
    const server = createServer()
    server.once("error", () => resolve(undefined))
    server.listen(port, "127.0.0.1", () => resolve(server))
  })

/** The first of `n` free ports in a row (`router_port + i` of the workers), all held while checked. */
export const freePortRange = async (n: number): Promise<number> => {
  for (let attempt = 0; attempt < 100; attempt++) {
    // Below the ephemeral range (32768–60999 on Linux), where the clients' own ports come from.
    const first = 10_000 + Math.floor(Math.random() * 20_000)
    const held = await Promise.all(Array.from({ length: n }, (_, i) => bind(first + i)))
    await Promise.all(held.map((s) => (s === undefined ? undefined : new Promise((resolve) => s.close(resolve)))))
    if (held.every((s) => s !== undefined)) return first
  }
  throw new Error(`no ${n} free ports in a row`)
}
