/**
 * The HTTP/2 connection deadlines are read on a monotonic clock: a step of the wall clock between a
 * connection's arrival and its preface (NTP, a faked date) neither expires it at once (a step
 * forward) nor lets it stay past its bound (a step back).
 */
import { createServer, type Server } from "node:http"
import * as http2 from "node:http2"
import { connect, type Socket } from "node:net"
import { afterEach, assert, describe, it, vi } from "vitest"
import { withHttp2 } from "../../src/endpoint/http2.ts"

const REQUEST_TIMEOUT_MS = 600

const serve = async (): Promise<{ readonly server: Server; readonly port: number }> => {
  const server = withHttp2(createServer((_req, res) => res.end("ok")), false, { requestTimeoutMs: REQUEST_TIMEOUT_MS, idleTimeoutMs: 5_000 })
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  return { server, port: (server.address() as { port: number }).port }
}

/** A TCP connection, open (the server has seen it) before the HTTP/2 session is started on it. */
const tcp = (port: number): Promise<Socket> =>
  new Promise((resolve, reject) => {
    const socket = connect(port, "127.0.0.1", () => resolve(socket))
    socket.once("error", reject)
  })

/** The wall clock stepped by `ms` from now on (the server runs in this process). */
const stepWallClock = (ms: number): void => {
  const real = Date.now.bind(Date)
  vi.spyOn(Date, "now").mockImplementation(() => real() + ms)
}

const sessionOn = (port: number, socket: Socket): http2.ClientHttp2Session =>
  http2.connect(`http://127.0.0.1:${port}`, { createConnection: () => socket })

describe("HTTP/2 deadlines and the wall clock", () => {
  const servers: Array<Server> = []
  afterEach(async () => {
    vi.restoreAllMocks()
    await Promise.all(servers.splice(0).map((s) => new Promise((resolve) => s.close(resolve))))
  })

  it("a step forward of the wall clock does not expire a new connection: its first request is answered", async () => {
    const { server, port } = await serve()
    servers.push(server)
    const socket = await tcp(port)
    await new Promise((resolve) => setTimeout(resolve, 50))
    stepWallClock(3_600_000)
    const session = sessionOn(port, socket)
    try {
      await new Promise((resolve) => setTimeout(resolve, 100))
      const status = await new Promise<number>((resolve, reject) => {
        const stream = session.request({ ":path": "/" })
        stream.on("response", (headers) => resolve(Number(headers[":status"])))
        stream.on("error", reject)
        stream.end()
      })
      assert.strictEqual(status, 200)
    } finally {
      session.destroy()
    }
  })

  it("a step back of the wall clock does not keep a silent connection past request_timeout", async () => {
    const { server, port } = await serve()
    servers.push(server)
    const socket = await tcp(port)
    await new Promise((resolve) => setTimeout(resolve, 50))
    stepWallClock(-3_600_000)
    const startedAt = performance.now()
    const session = sessionOn(port, socket)
    session.on("error", () => {})
    // Preface and settings, never a stream: the server says GOAWAY once the first request is due.
    await new Promise<void>((resolve) => session.once("goaway", () => resolve()))
    const tookMs = performance.now() - startedAt
    session.destroy()
    assert.isBelow(tookMs, REQUEST_TIMEOUT_MS + 5_000, `closed ${tookMs} ms after its preface`)
  }, 15_000)
})
