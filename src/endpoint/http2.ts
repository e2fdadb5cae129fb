/**
 * HTTP/2 on the endpoint port, beside HTTP/1.1: h2c with prior knowledge (each new connection's
 * first bytes are looked at: the HTTP/2 connection preface, or an HTTP/1.1 request line), or h2 over
 * TLS chosen by ALPN when the node has a certificate. HTTP/2 requests are handed to the same request
 * listeners as HTTP/1.1 ones (Node's compatibility API, which leaves out the headers HTTP/2 forbids,
 * such as `connection: close`), so every route, check, error and limit is the same on both; a
 * sender can multiplex its pushes on one connection.
 */
import type { IncomingMessage, Server } from "node:http"
import * as http2 from "node:http2"
import type { Socket } from "node:net"
import { Duplex } from "node:stream"
import type { TLSSocket } from "node:tls"

/** What every HTTP/2 client sends first (RFC 9113 §3.4). */
const PREFACE = Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")

/** Streams a connection may have open at once (pushes in flight from one sender). */
const SETTINGS: http2.Settings = { maxConcurrentStreams: 256 }

/**
 * Read a new connection's first bytes until they tell the HTTP/2 preface from anything else, and
 * hand them over with the connection.
 */
const sniff = (socket: Socket, then: (isHttp2: boolean, head: Buffer) => void): void => {
  let head: Buffer = Buffer.alloc(0)
  const onData = (chunk: Buffer): void => {
    head = head.length === 0 ? chunk : Buffer.concat([head, chunk])
    const n = Math.min(head.length, PREFACE.length)
    const matches = head.subarray(0, n).equals(PREFACE.subarray(0, n))
    if (matches && head.length < PREFACE.length) return
    socket.removeListener("data", onData)
    socket.removeListener("close", onClose)
    socket.pause()
    then(matches, head)
  }
  const onClose = (): void => {
    socket.removeListener("data", onData)
  }
  socket.on("data", onData)
  socket.once("close", onClose)
}

/**
 * The connection as a stream that starts with the bytes already read. Node's HTTP/2 session reads
 * a socket's handle directly (bytes put back with `unshift` would be lost); on a plain stream it
 * reads what the stream gives.
 */
const replayed = (socket: Socket, head: Buffer): Duplex => {
  const stream = new Duplex({
    read: () => void socket.resume(),
    write: (chunk: Buffer, encoding, done) => void socket.write(chunk, encoding, done),
    final: (done) => {
      socket.end()
      done()
    },
    destroy: (error, done) => {
      socket.destroy(error ?? undefined)
      done(error)
    }
  })
  stream.push(head)
  socket.on("data", (chunk: Buffer) => {
    if (!stream.push(chunk)) socket.pause()
  })
  socket.on("end", () => stream.push(null))
  socket.on("error", (error) => stream.destroy(error))
  socket.on("close", () => stream.destroy())
  return stream
}

/** The client's address of an HTTP/2 request on a replayed connection (its socket has none). */
const PEER = Symbol("autopush/peer")

/** The address a request came from: its socket's, or, over h2c, the connection's. */
export const peerOf = (req: IncomingMessage): string | undefined =>
  (req as { readonly [PEER]?: string })[PEER] ?? req.socket.remoteAddress

/**
 * `server` (plain, or TLS with `ALPNProtocols: ["h2", "http/1.1"]`) answering HTTP/2 too. Its
 * `close` also closes the HTTP/2 sessions (each finishes its streams in flight, then goes).
 */
export const withHttp2 = <S extends Server>(server: S, tls: boolean): S => {
  const h2 = http2.createServer({ settings: SETTINGS })
  const sessions = new Map<http2.ServerHttp2Session, string | undefined>()
  /** The address of the connection being handed over: its session is made at once. */
  let handing: string | undefined
  h2.on("session", (session) => {
    sessions.set(session, handing)
    session.once("close", () => sessions.delete(session))
  })
  h2.on("request", (req, res) => {
    const peer = sessions.get(req.stream.session as http2.ServerHttp2Session)
    if (peer !== undefined) (req as { [PEER]?: string })[PEER] = peer
    server.emit("request", req, res)
  })
  const emit = server.emit.bind(server)
  server.emit = ((event: string | symbol, ...args: Array<unknown>): boolean => {
    if (tls && event === "secureConnection" && (args[0] as TLSSocket).alpnProtocol === "h2") return h2.emit("connection", args[0])
    if (tls || event !== "connection") return emit(event as string, ...args)
    const socket = args[0] as Socket
    sniff(socket, (isHttp2, head) => {
      if (isHttp2) {
        handing = socket.remoteAddress
        h2.emit("connection", replayed(socket, head))
        handing = undefined
      } else {
        socket.unshift(head)
        emit("connection", socket)
        // Paused while sniffing: the bytes put back flow to the HTTP/1.1 parser.
        socket.resume()
      }
    })
    return true
  }) as S["emit"]
  const close = server.close.bind(server)
  ;(server as Server).close = (callback?: (error?: Error) => void) => {
    for (const session of sessions.keys()) session.close()
    return close(callback)
  }
  return server
}
