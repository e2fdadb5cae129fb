/**
 * The node's public WebSocket port: its server (request and idle bounds, open connections capped per
 * client address), the upgrade guard (beyond `max_connections` an upgrade is answered 503; a broken
 * handshake gets the error JSON) and the `ws` server whose sockets are the sessions' transports.
 */
import * as Effect from "effect/Effect"
import { createServer, type IncomingMessage } from "node:http"
import type { Duplex } from "node:stream"
import { type ServerOptions, WebSocketServer } from "ws"
import { MalformedRequest, MethodNotAllowed, TooManyConnections } from "../domain/errors.ts"
import { Metrics } from "../observability/Metrics.ts"
import { portCounters } from "../observability/sockets.ts"
import { answerOnSocket, answerSocketErrors } from "../platform/raw-http.ts"
import { listen } from "../platform/listen.ts"
import { capPerAddress, countIdleCloses } from "../platform/socket-limits.ts"
import { handlePublicRequest, type HealthSource, type HttpPortLimits } from "./http.ts"
import type { NodeRegistryService } from "./registry.ts"
import { PushSocket, type TransportLimits, transportLimits } from "./socket.ts"

export interface PublicPortOptions {
  readonly port: number
  readonly bindHost: string
  readonly maxMessageBytes: number
  readonly maxConnections: number
  readonly maxSendBufferBytes: number
  readonly maxControlFramesPerSecond: number
  readonly closeGraceMs: number
  readonly inboxFrames: number
  readonly inboxBytes: number
  /** Set when the node runs as several workers: the port is shared with the others (SO_REUSEPORT). */
  readonly worker?: number | undefined
}

/** Pings are answered by PushSocket, under a rate limit: `ws`'s own answering drops the TCP connection without a close frame once too many pongs are pending. */
const webSocketServer = (maxPayload: number, closeGraceMs: number) => {
  // `closeTimeout` is an option of ws (8.23 here) its type declarations do not list yet.
  const options: ServerOptions<typeof PushSocket> & { readonly closeTimeout: number } = {
    noServer: true,
    maxPayload,
    // `ws` ends a connection this long after its close frame was queued (30 s of its own
    // otherwise): behind megabytes a slow client has not read yet, the close frame would be cut off
    // before it could get there, however long `close_grace` is.
    closeTimeout: closeGraceMs,
    clientTracking: false,
    autoPong: false,
    // One client message per turn of the event loop: `ws` would otherwise hand over every frame of
    // a read at once (thousands of small ones), and a flooding client would hold the loop while
    // others wait.
    allowSynchronousEvents: false,
    WebSocket: PushSocket
  }
  const wss = new WebSocketServer<typeof PushSocket>(options)
  // A broken handshake gets the error JSON too (ws would answer in plain text).
  wss.on("wsClientError", (error: Error, socket: Duplex, req: IncomingMessage) =>
    answerOnSocket(
      socket,
      req.method === "GET" ? new MalformedRequest({ message: error.message }) : new MethodNotAllowed(),
      error.message.includes("Sec-WebSocket-Version") ? { "sec-websocket-version": "13" } : {}
    ))
  return wss
}

/** Listen on the public port; each upgraded socket, its limits set, goes to `admit`. The bound port and its server (closed first on shutdown). */
export const servePublicPort = (
  { registry, health, limits, options, admit }: {
    readonly registry: NodeRegistryService
    readonly health: HealthSource
    readonly limits: HttpPortLimits
    readonly options: PublicPortOptions
    readonly admit: (socket: PushSocket) => void
  }
) =>
  Effect.gen(function*() {
    const metrics = yield* Metrics
    const socketLimits: TransportLimits = transportLimits(
      options,
      metrics,
      (where, cause) => health.logError("websocket handler failed", { where, cause: String(cause) })
    )
    const upgraded = (socket: PushSocket): void => {
      socket.limits = socketLimits
      admit(socket)
    }
    const wss = webSocketServer(options.maxMessageBytes, options.closeGraceMs)
    const counters = portCounters(metrics, "websocket")
    const refuse = (socket: Duplex): void => void answerOnSocket(socket, new TooManyConnections())
    const server = capPerAddress(
      countIdleCloses(answerSocketErrors(createServer(limits.serverOptions, handlePublicRequest(registry, health)), () => counters.timedOut("request")), counters),
      limits.socketLimits,
      counters,
      refuse
    )
    server.on("upgrade", (req, socket, head) => {
      if (registry.connections.size >= options.maxConnections) {
        counters.refused("max_connections")
        return refuse(socket)
      }
      wss.handleUpgrade(req, socket, head, upgraded)
    })
    const port = yield* listen(server, options.port, options.bindHost, "port", options.worker !== undefined)
    return { port, server }
  })
