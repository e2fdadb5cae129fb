/**
 * `npm run bench:memory -- [N] [points]`: what an idle identified connection costs the server,
 * autopush's connection node against a bare `ws` server, each in its own process (--expose-gc).
 * Clients say hello and (MEMORY_REGISTER=1, the default) register one channel, then stay idle.
 * Memory is read at `points` equal steps up to N (after a settle and full GCs) and split into the
 * V8 heap's spaces (used, committed), glibc's main arena (`[heap]`) and other anonymous memory;
 * the figures per connection are least-squares slopes over the steps.
 *
 * MEMORY_SNAPSHOTS=DIR: heap snapshots of each server at every step (`DIR/<kind>-<n>.heapsnapshot`),
 * for `bench/memory-snapshots.ts`. MEMORY_SMAPS=DIR: each server's /proc/self/smaps at every step. MEMORY_KINDS=autopush (or bare): one server only.
 */
import { fork, type ChildProcess } from "node:child_process"
import { readFileSync, writeFileSync } from "node:fs"
import { setTimeout as sleep } from "node:timers/promises"
import v8 from "node:v8"

const self = new URL(import.meta.url).pathname
const role = process.argv[2]
const PER_CLIENT_PROCESS = 5_000
const SETTLE_MS = Number(process.env["MEMORY_SETTLE_MS"] ?? 10_000)
const REGISTER = process.env["MEMORY_REGISTER"] !== "0"
const CHANNEL = "0a1b2c3d-4e5f-4a6b-8c7d-8e9f0a1b2c3d"

interface Reading {
  readonly connections: number
  readonly rss: number
  readonly heapUsed: number
  readonly heapTotal: number
  readonly external: number
  /** Per V8 space: bytes used and committed. */
  readonly spaces: Record<string, { readonly used: number; readonly committed: number }>
  /** Resident bytes of glibc's main arena, of other anonymous mappings, and of file mappings. */
  readonly arena: number
  readonly anon: number
  readonly file: number
}

const residentByKind = () => {
  let arena = 0
  let anon = 0
  let file = 0
  let kind: "arena" | "anon" | "file" = "anon"
  for (const line of readFileSync("/proc/self/smaps", "utf8").split("\n")) {
    const head = /^[0-9a-f]+-[0-9a-f]+ \S+ \S+ \S+ (\d+)\s*(.*)$/.exec(line)
    if (head !== null) {
      const name = head[2] ?? ""
      kind = name === "[heap]" ? "arena" : head[1] !== "0" || name.startsWith("/") ? "file" : "anon"
      continue
    }
    const rss = /^Rss:\s+(\d+) kB/.exec(line)
    if (rss === null) continue
    const bytes = Number(rss[1]) * 1024
    if (kind === "arena") arena += bytes
    else if (kind === "file") file += bytes
    else anon += bytes
  }
  return { arena, anon, file }
}

// ── servers ─────────────────────────────────────────────────────────────────────────────────────

const server = async (kind: string) => {
  let connections = () => 0
  const send = (m: unknown) => process.send?.(m)
  const gc = (globalThis as { gc?: () => void }).gc
  process.on("message", async (m: unknown) => {
    if (m === "measure") {
      for (let i = 0; i < 5; i++) {
        gc?.()
        await sleep(500)
      }
      const { rss, heapUsed, heapTotal, external } = process.memoryUsage()
      const spaces: Record<string, { used: number; committed: number }> = {}
      for (const s of v8.getHeapSpaceStatistics()) spaces[s.space_name] = { used: s.space_used_size, committed: s.physical_space_size }
      const dir = process.env["MEMORY_SMAPS"]
      if (dir !== undefined) writeFileSync(`${dir}/smaps-${kind}-${connections()}.txt`, readFileSync("/proc/self/smaps", "utf8"))
      send({ connections: connections(), rss, heapUsed, heapTotal, external, spaces, ...residentByKind() } satisfies Reading)
    } else if (typeof m === "object" && m !== null && "snapshot" in m) {
      gc?.()
      v8.writeHeapSnapshot((m as { snapshot: string }).snapshot)
      send({ snapshotted: true })
    }
  })
  if (kind === "bare") {
    const { WebSocketServer } = await import("ws")
    const wss = new WebSocketServer({ port: 0, host: "127.0.0.1", clientTracking: true })
    wss.on("connection", (ws) => {
      ws.on("message", (data) => {
        const message = JSON.parse(String(data)) as { messageType: string; channelID?: string }
        ws.send(JSON.stringify(
          message.messageType === "hello"
            ? { messageType: "hello", uaid: "00000000000000000000000000000000", status: 200, use_webpush: true, broadcasts: {} }
            : { messageType: "register", channelID: message.channelID, status: 200, pushEndpoint: "http://127.0.0.1/wpush/v1/x" }
        ))
      })
    })
    connections = () => wss.clients.size
    wss.on("listening", () => send({ port: (wss.address() as { port: number }).port }))
    return
  }
  const { startConnectionNode } = await import("./connection-node.ts")
  const node = await startConnectionNode(new Map())
  connections = node.connections
  send({ port: node.port })
}

// ── clients ─────────────────────────────────────────────────────────────────────────────────────

const clients = async (port: number, count: number, localAddress: string) => {
  const { WebSocket } = await import("ws")
  const sockets: Array<InstanceType<typeof WebSocket>> = []
  let done = 0
  let failed = 0
  let next = 0
  const finish = (ok: boolean) => {
    if (ok) done++
    else failed++
    if (done + failed === count) process.send?.({ identified: done, failed })
    openOne()
  }
  const openOne = () => {
    if (next >= count) return
    next++
    const ws = new WebSocket(`ws://127.0.0.1:${port}/`, { localAddress, perMessageDeflate: false })
    sockets.push(ws)
    let answers = 0
    ws.once("open", () => ws.send(JSON.stringify({ messageType: "hello", use_webpush: true })))
    ws.on("message", () => {
      answers++
      if (answers === 1 && REGISTER) ws.send(JSON.stringify({ messageType: "register", channelID: CHANNEL }))
      else if (answers === (REGISTER ? 2 : 1)) finish(true)
    })
    ws.once("error", () => finish(false))
  }
  for (let i = 0; i < 200; i++) openOne()
  process.on("disconnect", () => process.exit(0))
}

// ── the run ─────────────────────────────────────────────────────────────────────────────────────

const once = <T>(child: ChildProcess, predicate: (m: unknown) => boolean) =>
  new Promise<T>((resolve, reject) => {
    const on = (m: unknown) => {
      if (!predicate(m)) return
      child.off("message", on)
      resolve(m as T)
    }
    child.on("message", on)
    child.once("exit", (code) => reject(new Error(`child exited with ${code}`)))
  })
const has = (key: string) => (m: unknown) => typeof m === "object" && m !== null && key in m

const slope = (xy: ReadonlyArray<readonly [number, number]>): number => {
  const n = xy.length
  const mx = xy.reduce((a, [x]) => a + x, 0) / n
  const my = xy.reduce((a, [, y]) => a + y, 0) / n
  return xy.reduce((a, [x, y]) => a + (x - mx) * (y - my), 0) / xy.reduce((a, [x]) => a + (x - mx) ** 2, 0)
}

const run = async (kind: string, subnet: number, n: number, points: number) => {
  const srv = fork(self, ["server", kind], { execArgv: ["--expose-gc"], stdio: ["ignore", "ignore", "inherit", "ipc"] })
  const { port } = await once<{ port: number }>(srv, has("port"))
  const readings: Array<Reading> = []
  const step = Math.ceil(n / points)
  const children: Array<ChildProcess> = []
  let opened = 0
  let address = 2
  for (let p = 0; p < points; p++) {
    let left = Math.min(step, n - opened)
    while (left > 0) {
      const count = Math.min(left, PER_CLIENT_PROCESS)
      const child = fork(self, ["clients", String(port), String(count), `127.0.${subnet}.${address++}`], { stdio: ["ignore", "ignore", "inherit", "ipc"] })
      children.push(child)
      const r = await once<{ identified: number; failed: number }>(child, has("identified"))
      if (r.failed > 0) console.error(`${kind}: ${r.failed} clients failed`)
      opened += count
      left -= count
    }
    await sleep(SETTLE_MS)
    srv.send("measure")
    readings.push(await once<Reading>(srv, has("rss")))
    const dir = process.env["MEMORY_SNAPSHOTS"]
    if (dir !== undefined) {
      srv.send({ snapshot: `${dir}/${kind}-${readings.at(-1)!.connections}.heapsnapshot` })
      await once(srv, has("snapshotted"))
    }
  }
  for (const c of children) c.kill()
  srv.kill()
  return readings
}

const main = async () => {
  const n = Number(process.argv[2] ?? 15_000)
  const points = Number(process.argv[3] ?? 3)
  const kinds = (process.env["MEMORY_KINDS"] ?? "bare,autopush").split(",")
  const results: Record<string, Record<string, number>> = {}
  for (const [i, kind] of kinds.entries()) {
    const readings = await run(kind, 10 + i + (Date.now() % 20) * 4, n, points)
    const per = (f: (r: Reading) => number) => slope(readings.map((r) => [r.connections, f(r)] as const))
    const row: Record<string, number> = {
      rss: per((r) => r.rss),
      heapUsed: per((r) => r.heapUsed),
      heapTotal: per((r) => r.heapTotal),
      arena: per((r) => r.arena),
      anon: per((r) => r.anon),
      nonHeapAnon: per((r) => r.anon - r.heapTotal)
    }
    for (const space of Object.keys(readings[0]!.spaces)) {
      row[`${space}.used`] = per((r) => r.spaces[space]!.used)
      row[`${space}.committed`] = per((r) => r.spaces[space]!.committed)
    }
    results[kind] = row
    console.log(`${kind}: ${readings.map((r) => `${r.connections} conns rss ${(r.rss / 2 ** 20).toFixed(1)} MiB heap ${(r.heapUsed / 2 ** 20).toFixed(1)}/${(r.heapTotal / 2 ** 20).toFixed(1)} arena ${(r.arena / 2 ** 20).toFixed(1)}`).join("; ")}`)
  }
  const keys = Object.keys(results[kinds[0]!]!)
  console.log(`bytes per connection (slope over ${points} steps to ${n}; register: ${REGISTER})`)
  console.log(["", ...kinds, kinds.length === 2 ? "ratio" : ""].map((s) => s.padStart(22)).join(""))
  for (const k of keys) {
    const values = kinds.map((kind) => results[kind]![k]!)
    if (values.every((v) => Math.abs(v) < 4)) continue
    const ratio = values.length === 2 ? (values[1]! / values[0]!).toFixed(2) + "×" : ""
    console.log([k, ...values.map((v) => v.toFixed(0)), ratio].map((s) => s.padStart(22)).join(""))
  }
}

if (role === "server") await server(process.argv[3]!)
else if (role === "clients") await clients(Number(process.argv[3]), Number(process.argv[4]), process.argv[5]!)
else await main()
