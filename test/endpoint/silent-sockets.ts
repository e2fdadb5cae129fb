/**
 * Clients that hold sockets and say little: many raw connections from one address, each sending
 * some bytes (or none) and then nothing, with when each was answered and closed; a victim's
 * requests from another address, timed; the process's open TCP sockets.
 */
import * as http from "node:http"
import { connect as tcpConnect, type Socket } from "node:net"

export interface Held {
  /** Its place among the connections opened together (what `first` was given). */
  readonly index: number
  readonly socket: Socket
  readonly connectedAt: number
  /** When the server closed it (undefined: still open). */
  closedAt: number | undefined
  received: Buffer
}

/** The HTTP/2 connection preface. */
export const PREFACE = Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
/** An empty SETTINGS frame. */
export const SETTINGS_FRAME = Buffer.from([0, 0, 0, 4, 0, 0, 0, 0, 0])

/** Open `count` connections to `port` (in batches, the listen backlog being finite), each sending `first`. */
export const holdSockets = async (
  port: number,
  count: number,
  first: (i: number) => Buffer | string,
  localAddress = "127.0.0.1"
): Promise<ReadonlyArray<Held>> => {
  const held: Array<Held> = []
  for (let start = 0; start < count; start += 250) {
    await Promise.all(Array.from({ length: Math.min(250, count - start) }, (_, j) =>
      new Promise<void>((resolve) => {
        const socket = tcpConnect({ port, host: "127.0.0.1", localAddress })
        const entry: Held = { index: start + j, socket, connectedAt: 0, closedAt: undefined, received: Buffer.alloc(0) }
        socket.on("data", (chunk: Buffer) => void (entry.received = Buffer.concat([entry.received, chunk])))
        socket.on("error", () => {})
        socket.on("close", () => void (entry.closedAt = performance.now()))
        socket.once("connect", () => {
          ;(entry as { connectedAt: number }).connectedAt = performance.now()
          const bytes = first(start + j)
          if (bytes.length > 0) socket.write(bytes)
          held.push(entry)
          resolve()
        })
      })))
  }
  return held
}

/** Resolves once every socket is closed, or after `ms` (then some are still open). */
export const allClosed = (held: ReadonlyArray<Held>, ms: number): Promise<boolean> =>
  new Promise((resolve) => {
    const deadline = performance.now() + ms
    const check = () => {
      if (held.every((h) => h.closedAt !== undefined)) return resolve(true)
      if (performance.now() > deadline) return resolve(false)
      setTimeout(check, 20)
    }
    check()
  })

/** How long each socket stayed open (ms), sorted. */
export const lifetimes = (held: ReadonlyArray<Held>): Array<number> =>
  held.map((h) => (h.closedAt ?? Number.POSITIVE_INFINITY) - h.connectedAt).sort((a, b) => a - b)

/** The process's open TCP sockets (clients and servers' connections; listeners not counted). */
export const openTcpSockets = (): number => process.getActiveResourcesInfo().filter((kind) => kind === "TCPSocketWrap").length

/** One request on a fresh connection from `localAddress`: its status and how long it took (ms). */
export const timedRequest = (
  port: number,
  method: string,
  path: string,
  body: string,
  headers: Record<string, string>,
  localAddress = "127.0.0.2"
): Promise<{ readonly status: number; readonly ms: number; readonly text: string }> =>
  new Promise((resolve, reject) => {
    const start = performance.now()
    const req = http.request({ host: "127.0.0.1", port, method, path, localAddress, agent: false, headers: { ...headers, connection: "close" } }, (res) => {
      const chunks: Array<Buffer> = []
      res.on("data", (c: Buffer) => chunks.push(c))
      res.on("end", () => resolve({ status: res.statusCode ?? 0, ms: performance.now() - start, text: Buffer.concat(chunks).toString() }))
    })
    req.on("error", reject)
    req.end(body)
  })

/** The frame types in a run of HTTP/2 frames (after the server's preface, which is frames too). */
export const frameTypes = (bytes: Buffer): Array<number> => {
  const types: Array<number> = []
  let at = 0
  while (at + 9 <= bytes.length) {
    const length = bytes.readUIntBE(at, 3)
    types.push(bytes[at + 3] as number)
    at += 9 + length
  }
  return types
}

export const GOAWAY = 7

export const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))
