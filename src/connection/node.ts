/**
 * The connection node: the public WebSocket port (`ws`, `publicPort.ts`), the private router port
 * (`routerPort.ts`), the session registry and the timer ticker, as one layer owning its servers and
 * session fibers (`sessions.ts`); on shutdown it drains (`stop.ts`).
 */
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Fiber from "effect/Fiber"
import * as Layer from "effect/Layer"
import * as LogLevel from "effect/LogLevel"
import * as References from "effect/References"
import type { SocketLimits } from "../platform/socket-limits.ts"
import type { SessionOptions } from "../protocol/session.ts"
import { Storage } from "../storage/Storage.ts"
import { receiptRecording } from "../receipts/recorder.ts"
import { nodeFibers } from "./fibers.ts"
import { healthSource } from "./health.ts"
import { httpPortLimits } from "./http.ts"
import { PeerNodes } from "./peers.ts"
import { servePublicPort } from "./publicPort.ts"
import { NodeRegistry } from "./registry.ts"
import { serveRouterPort } from "./routerPort.ts"
import { runSessions, sessionPorts } from "./sessions.ts"
import { drain, stopAccounting } from "./stop.ts"
import { SessionTicker } from "./ticker.ts"

export interface ConnectionNodeOptions extends SessionOptions {
  /** Public WebSocket port (0: any free port). */
  readonly port: number
  /** Private router port (0: any free port). */
  readonly routerPort: number
  readonly bindHost: string
  /** Address of the private router port (loopback for the all-in-one). */
  readonly routerBindHost: string
  /** Timer resolution of the ticker. */
  readonly tickMs: number
  /** Timeout of requests to other connection nodes. */
  readonly peerTimeoutMs: number
  /** Largest client message accepted (ws closes 1009 beyond it). */
  readonly maxMessageBytes: number
  /** Open WebSockets beyond which an upgrade is answered 503. */
  readonly maxConnections: number
  /** Bytes queued to a client that does not read, beyond which it is closed (1013). */
  readonly maxSendBufferBytes: number
  /** Ping/pong frames a client may send per second (pings are always answered below it); beyond → 1008. */
  readonly maxControlFramesPerSecond: number
  /** A request (headers and body) on the HTTP ports must arrive within this long (408 otherwise). */
  readonly clientRequestTimeoutMs: number
  /** Idle time of kept-alive HTTP connections, and open connections per client address (default: `DEFAULT_SOCKET_LIMITS`). */
  readonly socketLimits?: Omit<SocketLimits, "requestTimeoutMs"> | undefined
  /** On shutdown, how long sessions get to save their messages and close. */
  readonly shutdownTimeoutMs: number
  /** This process's number when the node runs as several workers: the public port is shared with the others (SO_REUSEPORT); `/__heartbeat__` says which. */
  readonly worker?: number | undefined
  /** How long a receipt waits to be collected (s; default 7 days: `receipt_subscription_idle`). */
  readonly receiptRetentionSeconds?: number | undefined
  /** How `/__heartbeat__` and `/health` name the store when it fails (`PostgreSQL at db:5432/autopush`; default "storage"). */
  readonly storageName?: string | undefined
}

export class ConnectionNode extends Context.Service<ConnectionNode, {
  /** Bound ports (useful when configured as 0). */
  readonly port: number
  readonly routerPort: number
  /** This node's id in router records. */
  readonly routerUrl: string
}>()("autopush/connection/ConnectionNode") {
  /**
   * Serve a connection node. `routerUrlFor(routerPort)` builds this node's router URL once the router
   * port is bound (tests bind port 0), so node ids always name a reachable port.
   */
  static readonly layer = (options: Omit<ConnectionNodeOptions, "routerUrl">, routerUrlFor: (routerPort: number) => string) =>
    Layer.effect(
      ConnectionNode,
      Effect.gen(function*() {
        const storage = yield* Storage
        const registry = yield* NodeRegistry
        const fibers = yield* nodeFibers
        const health = healthSource(storage, fibers, options)
        const limits = httpPortLimits(options)
        const routerPort = yield* serveRouterPort({ registry, health, fibers, limits, options })
        const sessionOptions: SessionOptions = { ...options, routerUrl: routerUrlFor(routerPort) }
        const ports = yield* sessionPorts(sessionOptions, LogLevel.isGreaterThanOrEqualTo("Debug", yield* References.MinimumLogLevel))
        const { finishEnded, stopping } = stopAccounting(fibers)
        const sessions = yield* runSessions(ports, registry, options.clientChannelCapacity, finishEnded)
        const { port, server: publicServer } = yield* servePublicPort({ registry, health, limits, options, admit: sessions.accept })
        yield* Effect.logInfo("connection node listening").pipe(
          Effect.annotateLogs({ port, routerPort, routerUrl: sessionOptions.routerUrl })
        )
        // Registered last, so it runs first on shutdown: while the router port still answers.
        // Sessions end, then what they started in the background (peer pokes, finishes).
        yield* Effect.addFinalizer(() =>
          drain({
            publicServer,
            stopAccepting: sessions.stopAccepting,
            registry,
            sessionsDone: Effect.andThen(Fiber.await(sessions.done), fibers.awaitEmpty),
            interruptSessions: Effect.andThen(Fiber.interrupt(sessions.done), fibers.awaitEmpty),
            timeoutMs: options.shutdownTimeoutMs,
            leaveRecords: (identified) => storage.clearNodeIds(sessionOptions.routerUrl, identified),
            stopping
          })
        )
        return ConnectionNode.of({ port, routerPort, routerUrl: sessionOptions.routerUrl })
      })
    ).pipe(
      Layer.provideMerge(SessionTicker(options.tickMs)),
      Layer.provide(PeerNodes.layer),
      Layer.provideMerge(NodeRegistry.layer),
      // Receipts of the messages sent with one: written as the node's events say (acked, expired, …).
      Layer.provide(receiptRecording(options.receiptRetentionSeconds))
    )
}
