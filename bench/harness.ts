/**
 * What the benchmarks that drive the real all-in-one process share: starting it, reading its CPU and
 * RSS from /proc, push clients over real sockets, and quantiles.
 */
import { readFileSync } from "node:fs"
import { Agent, request } from "node:http"
import { randomUUID } from "node:crypto"
import WebSocket from "ws"
import { openClient, type TestClient } from "../test/connection/client.ts"
import { type Deployment, startAllInOne } from "../test/e2e/servers.ts"

/** A flag's value, else the environment's, else the fallback. */
export const option = (flag: string, env: string, fallback: string): string => {
  const i = process.argv.indexOf(`--${flag}`)
  return (i >= 0 ? process.argv[i + 1] : undefined) ?? process.env[env] ?? fallback
}

// ── the server process, seen from outside ────────────────────────────────────────────────────────

/** User + system CPU of a process, in ms (clock ticks are 10 ms). */
export const cpuMs = (pid: number): number => {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8")
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ")
  return (Number(fields[11]) + Number(fields[12])) * 10
}
export const rssMiB = (pid: number): number => {
  const match = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"))
  return Number(match?.[1] ?? 0) / 1024
}

export const quantile = (values: ReadonlyArray<number>, q: number): number => {
  if (values.length === 0) return Number.NaN
  const sorted = [...values].sort((a, b) => a - b)
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] as number
}
export const fmt = (n: number, digits = 1) => n.toFixed(digits)

export const start = async (extra: ReadonlyArray<string>): Promise<{ readonly deployment: Deployment; readonly pid: number }> => {
  const deployment = await startAllInOne(["--log-level", "warn", ...extra])
  return { deployment, pid: deployment.pid() as number }
}

export const hello = async (wsUrl: string): Promise<TestClient> => {
  const client = await openClient(wsUrl)
  client.send({ messageType: "hello", use_webpush: true })
  await client.next((m) => m["messageType"] === "hello", 10_000)
  return client
}

export const register = async (client: TestClient): Promise<string> => {
  client.send({ messageType: "register", channelID: randomUUID() })
  const reply = await client.next((m) => m["messageType"] === "register", 30_000)
  if (reply["status"] !== 200) throw new Error(`register answered ${JSON.stringify(reply)}`)
  return reply["pushEndpoint"] as string
}

export const agent = new Agent({ keepAlive: true, maxSockets: 32 })
export const push = (endpoint: string, body: Buffer): Promise<number> =>
  new Promise((resolve, reject) => {
    const req = request(endpoint, { method: "POST", agent, headers: { TTL: "600", "Content-Encoding": "aes128gcm", "Content-Length": body.length } }, (res) => {
      res.resume()
      res.on("end", () => resolve(res.statusCode ?? 0))
    })
    req.on("error", reject)
    req.end(body)
  })

/** Opens `count` sockets that say hello and then only hold on (from fresh loopback addresses). */
export const idleSockets = async (wsUrl: string, count: number): Promise<Array<WebSocket>> => {
  const sockets: Array<WebSocket> = []
  let next = 0
  const openOne = async (): Promise<void> => {
    while (next < count) {
      const i = next++
      const ws = new WebSocket(wsUrl, { localAddress: `127.0.${1 + Math.floor(i / 20_000)}.${1 + (i % 200)}`, perMessageDeflate: false })
      sockets.push(ws)
      await new Promise<void>((resolve, reject) => {
        ws.once("open", () => ws.send(JSON.stringify({ messageType: "hello", use_webpush: true })))
        ws.once("message", () => resolve())
        ws.once("error", reject)
      })
    }
  }
  await Promise.all(Array.from({ length: 100 }, openOne))
  return sockets
}

