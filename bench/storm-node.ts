/**
 * Servers of several processes for `bench:connections` and `bench:storm` with `--workers`: our
 * all-in-one entrypoint started with `--workers W` (a supervisor and its W workers), and what both
 * benches read of such a group from outside — its processes (`/proc/…/children`), their RSS, the
 * workers' `/metrics`, and the machine's kernel memory for sockets.
 */
import { randomUUID } from "node:crypto"
import { type ChildProcess, spawn } from "node:child_process"
import { once } from "node:events"
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs"
import { Agent, request } from "node:http"
import { createServer as createNetServer } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import WebSocket from "ws"

/** The processes under `pid` (its children, theirs, …), from `/proc/…/task/…/children`. */
export const descendants = (pid: number): Array<number> => {
  const found: Array<number> = []
  let tasks: Array<string> = []
  try {
    tasks = readdirSync(`/proc/${pid}/task`)
  } catch {
    return found
  }
  for (const tid of tasks) {
    let children = ""
    try {
      children = readFileSync(`/proc/${pid}/task/${tid}/children`, "utf8")
    } catch {
      continue
    }
    for (const child of children.split(" ").filter((c) => c.trim() !== "").map(Number)) found.push(child, ...descendants(child))
  }
  return found
}

/** A Prometheus text page's samples, `name{labels}` → value (empty when it does not answer). */
export const scrape = async (url: string): Promise<Map<string, number>> => {
  const samples = new Map<string, number>()
  try {
    const res = await fetch(url)
    if (!res.ok) return samples
    for (const line of (await res.text()).split("\n")) {
      if (line === "" || line.startsWith("#")) continue
      const space = line.lastIndexOf(" ")
      samples.set(line.slice(0, space), Number(line.slice(space + 1)))
    }
  } catch {
    // not answering
  }
  return samples
}

/** The sum of a family's samples (`name` or `name{…}`) whose labels include `labels` (e.g. `port="websocket"`). */
export const sampleSum = (samples: ReadonlyMap<string, number>, name: string, labels = ""): number => {
  let sum = 0
  for (const [key, value] of samples) {
    if ((key === name || key.startsWith(`${name}{`)) && key.includes(labels)) sum += value
  }
  return sum
}

/**
 * `n` consecutive free ports on 127.0.0.1 below the ephemeral range (32768), so that no client
 * socket of the bench takes one of them meanwhile.
 */
export const freePortRange = async (n: number): Promise<number> => {
  for (let attempt = 0; attempt < 50; attempt++) {
    const base = 20_000 + Math.floor(Math.random() * (12_000 - n))
    const servers = Array.from({ length: n }, () => createNetServer())
    const bound = await Promise.all(servers.map((server, i) =>
      new Promise<boolean>((resolve) => {
        server.once("error", () => resolve(false))
        server.listen(base + i, "127.0.0.1", () => resolve(true))
      })
    ))
    await Promise.all(servers.map((server) => new Promise((resolve) => (server.listening ? server.close(resolve) : resolve(undefined)))))
    if (bound.every(Boolean)) return base
  }
  throw new Error(`no ${n} consecutive free ports`)
}

/** Our node as started by `startNode`: the supervisor (or the one process when workers = 1), and its workers' router ports. */
export interface WorkersNode {
  readonly wsPort: number
  readonly wsUrl: string
  readonly endpointUrl: string
  /** One per worker: `router_port + i`. */
  readonly routerUrls: ReadonlyArray<string>
  /** The process started (the supervisor when workers > 1). */
  readonly pid: () => number
  /** It and every process under it. */
  readonly pids: () => Array<number>
  /** The processes under it (the workers); [the process] when it has none. */
  readonly workerPids: () => Array<number>
  readonly output: Array<string>
  /** Its data directory (the embedded store's `autopush.sqlite`). */
  readonly dataDir: string
  /** SIGTERM the process started and wait until it and its workers are gone (`restart` starts it again). */
  readonly terminate: () => Promise<void>
  /** SIGTERM the process started, wait until it and its workers are gone, start it again on the same ports and data directory. */
  readonly restart: () => Promise<void>
  readonly stop: () => Promise<void>
}

/**
 * The real all-in-one entrypoint (`bin/autopush.js`) with `--workers W` (not passed when W = 1),
 * embedded storage in a data directory of its own, every listener on 127.0.0.1; ready once the
 * endpoint and every worker's router port answer `/__lbheartbeat__`.
 */
export const startNode = async (workers: number, extra: ReadonlyArray<string> = []): Promise<WorkersNode> => {
  const cwd = mkdtempSync(join(tmpdir(), "autopush-bench-node-"))
  // One range for all: the public ports must not fall among the workers' router ports.
  const wsPort = await freePortRange(workers + 2)
  const [endpointPort, routerPort] = [wsPort + 1, wsPort + 2]
  const routerUrls = Array.from({ length: workers }, (_, i) => `http://127.0.0.1:${routerPort + i}`)
  const endpointUrl = `http://127.0.0.1:${endpointPort}`
  const args = [
    new URL("../bin/autopush.js", import.meta.url).pathname,
    ...(workers > 1 ? ["--workers", String(workers)] : []),
    "--port", String(wsPort),
    "--router-port", String(routerPort),
    "--router-hostname", "127.0.0.1",
    "--endpoint-port", String(endpointPort),
    "--endpoint-hostname", "127.0.0.1",
    "--bind-host", "127.0.0.1",
    "--data-dir", join(cwd, "data"),
    "--log-level", "warn",
    ...extra
  ]
  const output: Array<string> = []
  let child: ChildProcess | undefined
  const gone = async (pids: ReadonlyArray<number>) => {
    const deadline = Date.now() + 120_000
    while (pids.some((pid) => existsSync(`/proc/${pid}`) && !/^State:\s+Z/m.test(readFileSync(`/proc/${pid}/status`, "utf8")))) {
      if (Date.now() > deadline) throw new Error(`processes ${pids.join(", ")} did not exit within 120 s of SIGTERM`)
      await new Promise((r) => setTimeout(r, 100))
    }
  }
  const down = async () => {
    const started = child
    if (started === undefined || started.exitCode !== null || started.signalCode !== null) return
    const all = [started.pid as number, ...descendants(started.pid as number)]
    const exited = once(started, "exit")
    started.kill("SIGTERM")
    await exited
    await gone(all)
  }
  const up = async () => {
    const spawned = spawn(process.execPath, args, { cwd, stdio: ["ignore", "pipe", "pipe"] })
    child = spawned
    const collect = (chunk: Buffer) => output.push(...chunk.toString().split("\n").filter((l) => l.length > 0))
    spawned.stdout.on("data", collect)
    spawned.stderr.on("data", collect)
    let exited = false
    spawned.once("exit", (code, signal) => {
      exited = true
      output.push(`[autopush pid ${spawned.pid} exited: code ${code}, signal ${signal}]`)
    })
    const deadline = Date.now() + 120_000
    for (const url of [endpointUrl, ...routerUrls]) {
      for (;;) {
        if (exited) throw new Error(`autopush exited while starting:\n${output.slice(-20).join("\n")}`)
        if (Date.now() > deadline) throw new Error(`${url} did not come up:\n${output.slice(-20).join("\n")}`)
        const ok = await fetch(`${url}/__lbheartbeat__`).then((res) => res.ok, () => false)
        if (ok) break
        await new Promise((r) => setTimeout(r, 100))
      }
    }
  }
  await up().catch(async (error: unknown) => {
    await down()
    rmSync(cwd, { recursive: true, force: true })
    throw error
  })
  const pid = () => child?.pid as number
  return {
    wsPort,
    wsUrl: `ws://127.0.0.1:${wsPort}/`,
    endpointUrl,
    routerUrls,
    pid,
    pids: () => [pid(), ...descendants(pid())],
    workerPids: () => {
      const under = descendants(pid())
      return under.length > 0 ? under : [pid()]
    },
    output,
    dataDir: join(cwd, "data"),
    terminate: down,
    restart: async () => {
      await down()
      await up()
    },
    stop: async () => {
      await down()
      rmSync(cwd, { recursive: true, force: true })
    }
  }
}

/** RSS of a process in bytes (0 once it is gone). */
export const rssBytes = (pid: number): number => {
  try {
    return Number(/VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"))?.[1] ?? 0) * 1024
  } catch {
    return 0
  }
}

/** The machine's kernel memory that sockets take: TCP socket buffers (`/proc/net/sockstat`, pages) and the slab (`/proc/meminfo`), in bytes, and TIME_WAIT sockets. */
export const kernelMemory = (): { readonly tcpBuffers: number; readonly slab: number; readonly slabUnreclaimable: number; readonly timeWait: number } => {
  const sockstat = readFileSync("/proc/net/sockstat", "utf8")
  const meminfo = readFileSync("/proc/meminfo", "utf8")
  const kB = (field: string) => Number(new RegExp(`^${field}:\\s+(\\d+) kB`, "m").exec(meminfo)?.[1] ?? 0) * 1024
  return {
    tcpBuffers: Number(/^TCP:.*\bmem (\d+)/m.exec(sockstat)?.[1] ?? 0) * 4096,
    slab: kB("Slab"),
    slabUnreclaimable: kB("SUnreclaim"),
    timeWait: Number(/^TCP:.*\btw (\d+)/m.exec(sockstat)?.[1] ?? 0)
  }
}

/** Client i's source address: 200 per address, so the ephemeral ports of one address suffice. */
const localAddress = (i: number) => `127.0.${1 + Math.floor(i / 50_000)}.${1 + (i % 200)}`

export interface Session {
  readonly ws: WebSocket
  readonly frames: (onFrame: (m: Record<string, unknown>) => void) => void
}

/** Client i's session on `wsUrl`, once open; `handshakeTimeoutMs` bounds the opening handshake (none by default). */
export const connect = (wsUrl: string, i: number, handshakeTimeoutMs?: number): Promise<Session> =>
  new Promise((resolve, reject) => {
    const ws = new WebSocket(wsUrl, { localAddress: localAddress(i), perMessageDeflate: false, ...(handshakeTimeoutMs === undefined ? {} : { handshakeTimeout: handshakeTimeoutMs }) })
    ws.once("open", () => resolve({ ws, frames: (onFrame) => ws.on("message", (data) => onFrame(JSON.parse(data.toString()))) }))
    ws.once("error", reject)
  })

/** A new user on its open session: hello, then one channel registered; its uaid and push endpoint. Fails if the server closes the socket first. */
export const subscribe = (s: Session): Promise<{ readonly uaid: string; readonly endpoint: string }> =>
  new Promise((resolve, reject) => {
    let uaid = ""
    const channelID = randomUUID()
    s.ws.once("close", () => reject(new Error("closed while registering")))
    s.frames((m) => {
      if (m["messageType"] === "hello") {
        uaid = m["uaid"] as string
        s.ws.send(JSON.stringify({ messageType: "register", channelID }))
      }
      if (m["messageType"] !== "register") return
      // A refused register (a storage error, a limit) has no endpoint: say so rather than push to none.
      if (m["status"] !== 200) reject(new Error(`register answered status ${String(m["status"])}`))
      else resolve({ uaid, endpoint: m["pushEndpoint"] as string })
    })
    s.ws.send(JSON.stringify({ messageType: "hello", use_webpush: true }))
  })

/**
 * A storm client's resume on its open session: hello with `uaid`, then its stored message, acked.
 * Fails when the message does not come within `timeoutMs` or the server closes the socket first;
 * `onHello` is called when the hello reply arrives.
 */
export const resume = (s: Session, uaid: string, timeoutMs: number, onHello: () => void): Promise<void> =>
  new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("timeout")), timeoutMs)
    s.ws.once("close", (code, reason) => {
      clearTimeout(timer)
      reject(new Error(`closed ${code} ${reason.toString()}`.trim()))
    })
    s.frames((m) => {
      if (m["messageType"] === "hello") onHello()
      if (m["messageType"] === "notification") {
        s.ws.send(JSON.stringify({ messageType: "ack", updates: [{ channelID: m["channelID"], version: m["version"] }] }))
        clearTimeout(timer)
        resolve()
      }
    })
    s.ws.send(JSON.stringify({ messageType: "hello", uaid, use_webpush: true }))
  })

const pushAgent = new Agent({ keepAlive: true, maxSockets: 8 })
/** A push of `body` (TTL 600) to `endpoint` from a client process: its message id when accepted (201). */
export const pushFromClients = (endpoint: string, body: Buffer): Promise<string | undefined> =>
  new Promise((resolve) => {
    const req = request(endpoint, { method: "POST", agent: pushAgent, headers: { TTL: "600", "Content-Encoding": "aes128gcm", "Content-Length": body.length } }, (res) => {
      res.resume()
      const location = res.headers.location
      res.on("end", () => resolve(res.statusCode === 201 ? location?.slice(location.lastIndexOf("/") + 1) : undefined))
    })
    req.on("error", () => resolve(undefined))
    req.end(body)
  })

/** Sends `message` to a child and waits for its reply carrying `key` (or its `{ error }`). */
export const ask = <T>(child: ChildProcess, message: unknown, key: string): Promise<T> =>
  new Promise((resolve, reject) => {
    const onExit = (code: number | null) => reject(new Error(`a client process exited (${code})`))
    const onMessage = (m: Record<string, unknown>) => {
      if (!(key in m) && !("error" in m)) return
      child.off("message", onMessage)
      child.off("exit", onExit)
      if ("error" in m) reject(new Error(String(m["error"])))
      else resolve(m[key] as T)
    }
    child.on("message", onMessage)
    child.once("exit", onExit)
    child.send(message as Parameters<ChildProcess["send"]>[0])
  })

/** Run `task` for 0..n-1 with at most `limit` at once. */
export const pool = async (n: number, limit: number, task: (i: number) => Promise<void>) => {
  let next = 0
  await Promise.all(Array.from({ length: Math.min(limit, n) }, async () => {
    while (next < n) await task(next++)
  }))
}
