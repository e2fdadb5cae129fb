/**
 * Plain `node:http` pieces every listener shares: JSON and error answers, a bounded body read, the
 * token of a bearer `Authorization` header, and error answers written straight to a socket, where
 * Node gives no response object — a request its HTTP parser refused (Node's own answer is a bare
 * 400/408/431 without the error JSON), a CONNECT (Node drops the connection), a refused WebSocket
 * handshake or upgrade. Every HTTP listener installs `answerSocketErrors`, so these too get the
 * error JSON of the API's table.
 */
import type { IncomingMessage, Server, ServerResponse } from "node:http"
import type { Duplex } from "node:stream"
import {
  type ApiError,
  InvalidRequestBody,
  MalformedRequest,
  MethodNotAllowed,
  type PayloadTooLarge,
  RequestTimeout,
  toErrorResponse
} from "../domain/errors.ts"

export const sendJson = (res: ServerResponse, status: number, body: unknown, headers: Readonly<Record<string, string>> = {}): void => {
  const text = JSON.stringify(body)
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(text), ...headers })
  res.end(text)
}

/** The error JSON of `error`; `close` closes the connection after it (a body left unread). */
export const sendError = (res: ServerResponse, error: ApiError, close = false, extraHeaders: Readonly<Record<string, string>> = {}): void => {
  const { status, headers, body } = toErrorResponse(error)
  sendJson(res, status, body, close ? { ...headers, ...extraHeaders, connection: "close" } : { ...headers, ...extraHeaders })
}

/** The token of `Authorization: Bearer <token>`; undefined for another scheme or none. */
export const bearerToken = (authorization: string | undefined): string | undefined =>
  /^Bearer\s+(\S+)$/i.exec(authorization ?? "")?.[1]

/** Why a body was not read: too large, too slow, or broken off. */
export type BodyRefusal = PayloadTooLarge | RequestTimeout | InvalidRequestBody

export type Body =
  | { readonly _tag: "Body"; readonly bytes: Buffer }
  | { readonly _tag: "Refused"; readonly error: BodyRefusal }

export interface BodyLimits {
  /** Largest body accepted (bytes). */
  readonly maxBytes: number
  /** The refusal of a body over `maxBytes`. */
  readonly tooLarge: PayloadTooLarge
  /** A body whose next chunk takes longer than this (ms) is refused with `RequestTimeout`. */
  readonly idleMs: number
}

/**
 * Of a body over the limit, how much more is read (and dropped) before it is refused: clients send
 * their whole body before they read the answer, and a connection closed with unread data is reset,
 * which takes the answer with it. Beyond this much, the connection is closed all the same.
 */
const DISCARD_MAX_BYTES = 32 * 1024 * 1024

/**
 * The whole body, at most `maxBytes`, each chunk within `idleMs` of the last, handed to `done`
 * once. A body over the limit is read to its end and dropped (at most `DISCARD_MAX_BYTES`, each
 * chunk within `idleMs`) before it is refused, so that the client can read the answer; a body that
 * stalls is refused at once. Once refused, answer and close the connection.
 */
export const readBody = (req: IncomingMessage, limits: BodyLimits, done: (body: Body) => void): void => {
  const declared = Number(req.headers["content-length"] ?? 0)
  if (declared > DISCARD_MAX_BYTES) {
    req.resume()
    return done({ _tag: "Refused", error: limits.tooLarge })
  }
  const chunks: Array<Buffer> = []
  let size = 0
  let tooLarge = declared > limits.maxBytes
  let finished = false
  const finish = (body: Body) => {
    if (finished) return
    finished = true
    clearTimeout(timer)
    req.removeListener("data", onData)
    if (body._tag === "Refused") req.resume()
    done(body)
  }
  const timer = setTimeout(() => finish({ _tag: "Refused", error: tooLarge ? limits.tooLarge : new RequestTimeout() }), limits.idleMs)
  const onData = (chunk: Buffer) => {
    size += chunk.length
    timer.refresh()
    if (size > limits.maxBytes) {
      if (!tooLarge) chunks.length = 0
      tooLarge = true
      if (size > DISCARD_MAX_BYTES) finish({ _tag: "Refused", error: limits.tooLarge })
      return
    }
    chunks.push(chunk)
  }
  req.on("data", onData)
  req.on("end", () =>
    finish(
      tooLarge
        ? { _tag: "Refused", error: limits.tooLarge }
        : { _tag: "Body", bytes: chunks.length === 1 ? chunks[0] as Buffer : Buffer.concat(chunks) }
    ))
  req.on("error", () => finish({ _tag: "Refused", error: new InvalidRequestBody({ message: "The request body could not be read" }) }))
}

/** An error answer as raw HTTP/1.1 text; the connection is closed after it. */
const rawErrorResponse = (error: ApiError, extraHeaders: Readonly<Record<string, string>> = {}): string => {
  const { status, headers, body } = toErrorResponse(error)
  const text = JSON.stringify(body)
  const lines = [
    `HTTP/1.1 ${status} ${body.error}`,
    "content-type: application/json",
    `content-length: ${Buffer.byteLength(text)}`,
    "connection: close",
    ...Object.entries({ ...headers, ...extraHeaders }).map(([k, v]) => `${k}: ${v}`)
  ]
  return `${lines.join("\r\n")}\r\n\r\n${text}`
}

/** Time the client gets to read the answer after our FIN before the socket is destroyed. */
const CLOSE_GRACE_MS = 500

const answered = new WeakSet<Duplex>()

/**
 * Answer `error` on the socket and close it, once (false when it already was). Nothing is written
 * when a response of this connection is already under way (it would be corrupted): the socket is
 * only closed.
 */
export const answerOnSocket = (socket: Duplex, error: ApiError, extraHeaders?: Readonly<Record<string, string>>): boolean => {
  if (answered.has(socket)) return false
  answered.add(socket)
  // Node's own check (`_httpMessage` is the response being written on this socket).
  const inFlight = (socket as { readonly _httpMessage?: { readonly headersSent: boolean } | null })._httpMessage
  if (!socket.writable || inFlight?.headersSent === true) {
    socket.destroy()
    return true
  }
  socket.on("error", () => socket.destroy())
  socket.end(rawErrorResponse(error, extraHeaders))
  setTimeout(() => socket.destroy(), CLOSE_GRACE_MS).unref()
  return true
}

/** What a parser error of Node's HTTP server is for the client; undefined when the client is gone. */
const parserError = (error: Error & { readonly code?: string }): ApiError | undefined => {
  switch (error.code) {
    case "ECONNRESET":
    case "EPIPE":
      return undefined
    case "ERR_HTTP_REQUEST_TIMEOUT":
      return new RequestTimeout()
    case "HPE_HEADER_OVERFLOW":
      return new MalformedRequest({ message: "The request headers are too large" })
    default:
      return new MalformedRequest({ message: "The request could not be parsed" })
  }
}

/**
 * Requests Node's HTTP server cannot hand to a request handler get the error JSON too; `onTimeout`
 * is told of each connection closed because its request's headers did not arrive in time.
 */
export const answerSocketErrors = <S extends Server>(server: S, onTimeout: () => void = () => {}): S => {
  server.on("clientError", (error: Error & { readonly code?: string }, socket: Duplex) => {
    const answer = parserError(error)
    if (answer === undefined) socket.destroy()
    else if (answerOnSocket(socket, answer) && error.code === "ERR_HTTP_REQUEST_TIMEOUT") onTimeout()
  })
  server.on("connect", (_request, socket: Duplex) => answerOnSocket(socket, new MethodNotAllowed()))
  return server
}
