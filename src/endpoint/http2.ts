/**
 * HTTP/2 on the endpoint port, beside HTTP/1.1: h2c with prior knowledge (each new connection's
 * first bytes are looked at: the HTTP/2 connection preface, or an HTTP/1.1 request line), or h2 over
 * TLS chosen by ALPN when the node has a certificate. HTTP/2 requests are handed to the same request
 * listeners as HTTP/1.1 ones (Node's compatibility API, which leaves out the headers HTTP/2 forbids,
 * such as `connection: close`), so every route, check, error and limit is the same on both; a
 * sender can multiplex its pushes on one connection.
 *
 * Time bounds (`platform/socket-limits.ts`): within `requestTimeoutMs` of connecting, a connection
 * must have finished its TLS handshake (when there is one), said what it speaks, and sent its first
 * request: the headers of one over HTTP/1.1 (else 408, then closed), a stream over HTTP/2 (else a
 * GOAWAY); sending nothing, or part of a handshake or of the preface, it is closed. An HTTP/2
 * session is closed with a GOAWAY once it has had no open stream for `idleTimeoutMs`; a stream is
 * closed once answered (a request body that stalls is answered 408 by the body read). (Later
 * HTTP/1.1 requests and idle HTTP/1.1 connections are Node's: `headersTimeout`, `keepAliveTimeout`.)
 */
import type { IncomingMessage, Server } from "node:http"
import * as http2 from "node:http2"
import type { Socket } from "node:net"
import { Duplex } from "node:stream"
import type { TLSSocket } from "node:tls"
import { RequestTimeout } from "../domain/errors.ts"
import { answerOnSocket } from "../platform/raw-http.ts"
import { NO_COUNTERS, type PortCounters, type SocketLimits, type TimeoutPhase } from "../platform/socket-limits.ts"

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
    socket.removeListener("end", onEnd)
    socket.removeListener("close", onClose)
    socket.pause()
    then(matches, head)
  }
  // A client that hangs up before its first bytes tell what it speaks is gone: nothing to answer
  // (the HTTP server keeps half-open connections, so without this it would wait for the timeout).
  const onEnd = (): void => {
    socket.destroy()
  }
  const onClose = (): void => {
    socket.removeListener("data", onData)
    socket.removeListener("end", onEnd)
  }
  socket.on("data", onData)
  socket.once("end", onEnd)
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

/** After its GOAWAY, time a session gets to go before it is destroyed. */
const GOAWAY_GRACE_MS = 1_000

/**
 * The clock deadlines are read on: monotonic (`performance.now()`), so that a step of the wall clock
 * (NTP, a faked date) neither expires a connection early nor keeps it past its bound.
 */
const now = (): number => performance.now()

/**
 * Close `session` (GOAWAY) when it has opened no stream by `firstBy` (on that clock), or when it has had
 * no open stream for `idleMs` since its last one closed.
 */
const watchSession = (session: http2.ServerHttp2Session, firstBy: number, idleMs: number, counters: PortCounters): void => {
  let open = 0
  let phase: TimeoutPhase = "request"
  const expire = (): void => {
    if (session.closed || session.destroyed || open > 0) return
    counters.timedOut(phase)
    // No stream is open: the session goes as soon as its GOAWAY is written.
    session.close()
    setTimeout(() => session.destroy(), GOAWAY_GRACE_MS).unref()
  }
  let timer = setTimeout(expire, Math.max(0, firstBy - now())).unref()
  session.on("stream", (stream: http2.ServerHttp2Stream) => {
    open++
    clearTimeout(timer)
    // Answered while the client's side is still open (a body it never ends, or one not read because
    // the answer came first): the stream is reset with NO_ERROR, as RFC 9113 §8.1 allows after a
    // complete response, instead of staying open, and the session with it, for as long as the client likes.
    stream.once("finish", () => {
      if (!stream.destroyed && stream.state.remoteClose === 0) stream.close(http2.constants.NGHTTP2_NO_ERROR)
    })
    stream.once("close", () => {
      if (--open > 0 || session.closed || session.destroyed) return
      phase = "idle"
      timer = setTimeout(expire, idleMs).unref()
    })
  })
  session.once("close", () => clearTimeout(timer))
}

/** A new connection's first request: due by `firstBy` (on the monotonic clock), else `timer` closes it. */
interface FirstRequest {
  readonly firstBy: number
  readonly timer: NodeJS.Timeout
  /** The socket it speaks HTTP/1.1 on, once known (the 408 is written there). */
  http1: Duplex | undefined
}

/** The client's address of an HTTP/2 request on a replayed connection (its socket has none). */
const PEER = Symbol("autopush/peer")

/** The address a request came from: its socket's, or, over h2c, the connection's. */
export const peerOf = (req: IncomingMessage): string | undefined =>
  (req as { readonly [PEER]?: string })[PEER] ?? req.socket.remoteAddress

/**
 * `server` (plain, or TLS with `ALPNProtocols: ["h2", "http/1.1"]`) answering HTTP/2 too, within
 * the time bounds of `limits` (timeouts counted by `counters`). Its `close` also closes the HTTP/2
 * sessions (each finishes its streams in flight, then goes).
 */
export const withHttp2 = <S extends Server>(
  server: S,
  tls: boolean,
  limits: Pick<SocketLimits, "requestTimeoutMs" | "idleTimeoutMs">,
  counters: PortCounters = NO_COUNTERS
): S => {
  const h2 = http2.createServer({ settings: SETTINGS })
  const sessions = new Map<http2.ServerHttp2Session, string | undefined>()
  /** The connection being handed over (its session is made at once): its address, and when its first stream is due. */
  let handing: { readonly peer: string | undefined; readonly firstBy: number } | undefined
  h2.on("session", (session) => {
    sessions.set(session, handing?.peer)
    session.once("close", () => sessions.delete(session))
    watchSession(session, handing?.firstBy ?? now() + limits.requestTimeoutMs, limits.idleTimeoutMs, counters)
  })
  h2.on("request", (req, res) => {
    const peer = sessions.get(req.stream.session as http2.ServerHttp2Session)
    if (peer !== undefined) (req as { [PEER]?: string })[PEER] = peer
    server.emit("request", req, res)
  })
  /** Connections (by their TCP socket) whose first request has not come yet. */
  const arriving = new WeakMap<Socket, FirstRequest>()
  /** The same, by the socket HTTP/1.1 requests name (the TCP socket, or over TLS the TLS socket). */
  const pending = new WeakMap<Duplex, FirstRequest>()
  /** Close `socket` at `firstBy` unless its first request came: 408 once HTTP/1.1 is spoken, else a bare close. */
  const awaitFirstRequest = (socket: Socket): FirstRequest => {
    const first: FirstRequest = {
      firstBy: now() + limits.requestTimeoutMs,
      http1: undefined,
      timer: setTimeout(() => {
        if (first.http1 === undefined) socket.destroy()
        else if (!answerOnSocket(first.http1, new RequestTimeout())) return
        counters.timedOut("request")
      }, limits.requestTimeoutMs).unref()
    }
    arriving.set(socket, first)
    socket.once("close", () => clearTimeout(first.timer))
    return first
  }
  /** `socket` (the TCP one, or a TLS one on it) speaks HTTP/1.1 from now on. */
  const speaksHttp1 = (first: FirstRequest | undefined, socket: Duplex): void => {
    if (first === undefined) return
    first.http1 = socket
    pending.set(socket, first)
  }
  const toHttp2 = (first: FirstRequest | undefined, peer: string | undefined, connection: Duplex): void => {
    if (first !== undefined) clearTimeout(first.timer)
    handing = { peer, firstBy: first?.firstBy ?? now() + limits.requestTimeoutMs }
    h2.emit("connection", connection)
    handing = undefined
  }
  const emit = server.emit.bind(server)
  server.emit = ((event: string | symbol, ...args: Array<unknown>): boolean => {
    switch (event) {
      case "request":
      case "checkContinue": {
        const socket = (args[0] as IncomingMessage).socket
        const first = pending.get(socket)
        if (first !== undefined) {
          clearTimeout(first.timer)
          pending.delete(socket)
        }
        return emit(event, ...args)
      }
      case "secureConnection": {
        const socket = args[0] as TLSSocket
        // Node's own link from a TLS socket to the TCP socket under it.
        const first = arriving.get((socket as unknown as { readonly _parent?: Socket })._parent as Socket)
        if (socket.alpnProtocol === "h2") {
          toHttp2(first, socket.remoteAddress, socket)
          return true
        }
        speaksHttp1(first, socket)
        return emit(event, ...args)
      }
      case "connection": {
        const socket = args[0] as Socket
        const first = awaitFirstRequest(socket)
        if (tls) return emit(event, ...args)
        sniff(socket, (isHttp2, head) => {
          if (isHttp2) return toHttp2(first, socket.remoteAddress, replayed(socket, head))
          speaksHttp1(first, socket)
          socket.unshift(head)
          emit("connection", socket)
          // Paused while sniffing: the bytes put back flow to the HTTP/1.1 parser.
          socket.resume()
        })
        return true
      }
      default:
        return emit(event as string, ...args)
    }
  }) as S["emit"]
  const close = server.close.bind(server)
  ;(server as Server).close = (callback?: (error?: Error) => void) => {
    for (const session of sessions.keys()) session.close()
    return close(callback)
  }
  return server
}
