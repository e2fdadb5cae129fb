/**
 * The connection node: the public WebSocket port (`ws`), the private router port, the session
 * registry and the timer ticker, as one layer owning its servers and session fibers.
 */
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Cause from "effect/Cause"
import * as Clock from "effect/Clock"
import * as Fiber from "effect/Fiber"
import * as FiberSet from "effect/FiberSet"
import * as Layer from "effect/Layer"
import * as LogLevel from "effect/LogLevel"
import * as Pull from "effect/Pull"
import * as Queue from "effect/Queue"
import * as References from "effect/References"
import { createServer, type IncomingMessage, type Server } from "node:http"
import type { Duplex } from "node:stream"
import { type RawData, WebSocket, WebSocketServer } from "ws"
import { MalformedRequest, MethodNotAllowed, TooManyConnections } from "../domain/errors.ts"
import { answerOnSocket, answerSocketErrors } from "../platform/raw-http.ts"
import {
  capPerAddress,
  countIdleCloses,
  DEFAULT_SOCKET_LIMITS,
  httpServerTimeouts,
  type SocketLimits
} from "../platform/socket-limits.ts"
import { closeFrame } from "../protocol/close.ts"
import { EndpointCrypto } from "../crypto/endpoint.ts"
import { RouterAuth } from "../crypto/routerAuth.ts"
import { EventLog } from "../observability/EventLog.ts"
import { type Counter, Metrics } from "../observability/Metrics.ts"
import { METRICS } from "../observability/catalog.ts"
import { portCounters } from "../observability/sockets.ts"
import { routerObservability } from "../observability/observability.ts"
import { storageHealthCause, UNNAMED_STORAGE } from "../observability/storageHealth.ts"
import { type MailboxInput, textFrame } from "../protocol/inputs.ts"
import type { InboxBound, InboxGate, Mailbox } from "../protocol/mailbox.ts"
import {
  makeSession,
  protocolFor,
  SessionHandle,
  type SessionOptions,
  type SessionPorts,
  type SessionRunner,
  type Transport
} from "../protocol/session.ts"
import { Broadcasts } from "../broadcast/Broadcasts.ts"
import { failureText, mapStorageOperations, type NodeSession, Storage, type StorageError, type StorageService } from "../storage/Storage.ts"
import { cachedTableStatus } from "../storage/tableKeeper.ts"

import { handlePublicRequest, handleRouterRequest, type HealthSource, type RouterGuard } from "./http.ts"
import { listen } from "../platform/listen.ts"
import { Permits } from "../platform/permits.ts"
import { PeerNodes } from "./peers.ts"
import { NodeRegistry, type NodeRegistryService } from "./registry.ts"
import { SessionTicker } from "./ticker.ts"
import { receiptRecording } from "../receipts/recorder.ts"

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
        const fibers = yield* FiberSet.make()
        const run = yield* FiberSet.runtime(fibers)<never>()
        const runPromise = <A, E>(effect: Effect.Effect<A, E>) =>
          new Promise<A>((resolve, reject) => run(effect).addObserver((exit) => exit._tag === "Success" ? resolve(exit.value) : reject(exit.cause)))

        const health: HealthSource = {
          storageStatus: () =>
            runPromise(
              cachedTableStatus(storage).pipe(
                Effect.map((tables) => {
                  const bad = tables.find((t) => !t.ok)
                  return bad === undefined ? { ok: true } : { ok: false, cause: `${bad.table}: ${bad.cause ?? "unavailable"}` }
                }),
                Effect.catchTag("StorageError", (e) => Effect.succeed({ ok: false, cause: storageHealthCause(options.storageName ?? UNNAMED_STORAGE, e) }))
              )
            ),
          worker: options.worker,
          logError: (message, fields = {}) => void run(Effect.logError(message).pipe(Effect.annotateLogs(fields))),
          logRejected: (fields) => void run(Effect.logInfo("request rejected").pipe(Effect.annotateLogs(fields)))
        }

        const observability = yield* routerObservability(registry)
        // Connection bounds (`platform/socket-limits.ts`): nothing or a partial request → closed
        // (408) after the client request timeout, idle keep-alive → closed; a WebSocket that
        // upgraded has `hello_timeout` to say hello (the session's own timer).
        const socketLimits: SocketLimits = { ...(options.socketLimits ?? DEFAULT_SOCKET_LIMITS), requestTimeoutMs: options.clientRequestTimeoutMs }
        const serverOptions = {
          ...httpServerTimeouts(socketLimits),
          // Node's own 408 only backs up the routes' timeout, which answers with the error JSON.
          requestTimeout: options.clientRequestTimeoutMs + 1_000
        }
        const metrics = yield* Metrics
        const routerCounters = portCounters(metrics, "router")
        const clock = yield* Clock.Clock
        const authNotes = new Map<string, Counter>()
        const guard: RouterGuard = {
          auth: yield* RouterAuth,
          now: () => clock.currentTimeMillisUnsafe(),
          noted: (reason, route) => {
            let counter = authNotes.get(reason)
            if (counter === undefined) authNotes.set(reason, counter = metrics.counter(METRICS.routerAuthRefused.name, { reason }))
            counter.inc()
            // Neither the signature nor the path (it names a client): the reason and the route only.
            if (reason !== "accepted_unsigned") void run(Effect.logDebug("router request refused").pipe(Effect.annotateLogs({ reason, route })))
          }
        }
        // The router port is private (endpoint nodes, operators): not capped per address.
        const routerServer = capPerAddress(
          countIdleCloses(
            answerSocketErrors(
              createServer(serverOptions, handleRouterRequest(registry, health, guard, observability, options.clientRequestTimeoutMs)),
              () => routerCounters.timedOut("request")
            ),
            routerCounters
          ),
          { maxPerAddress: 0, exempt: [] },
          routerCounters,
          () => {}
        )
        const routerPort = yield* listen(routerServer, options.routerPort, options.routerBindHost, "router_port")
        const sessionOptions: SessionOptions = { ...options, routerUrl: routerUrlFor(routerPort) }

        const ports = yield* sessionPorts(sessionOptions, LogLevel.isGreaterThanOrEqualTo("Debug", yield* References.MinimumLogLevel))

        // Pings are answered by PushSocket, under a rate limit: `ws`'s own answering drops the TCP
        // connection without a close frame once too many pongs are pending.
        const wss = new WebSocketServer<typeof PushSocket>({
          noServer: true,
          maxPayload: options.maxMessageBytes,
          clientTracking: false,
          autoPong: false,
          // One client message per turn of the event loop: `ws` would otherwise hand over every
          // frame of a read at once (thousands of small ones), and a flooding client would hold the
          // loop while others wait.
          allowSynchronousEvents: false,
          WebSocket: PushSocket
        })
        // A broken handshake gets the error JSON too (ws would answer in plain text).
        wss.on("wsClientError", (error: Error, socket: Duplex, req: IncomingMessage) =>
          answerOnSocket(
            socket,
            req.method === "GET" ? new MalformedRequest({ message: error.message }) : new MethodNotAllowed(),
            error.message.includes("Sec-WebSocket-Version") ? { "sec-websocket-version": "13" } : {}
          ))
        const limits: TransportLimits = {
          closeGraceMs: options.closeGraceMs,
          maxSendBufferBytes: options.maxSendBufferBytes,
          maxControlFramesPerSecond: options.maxControlFramesPerSecond,
          inbox: { frames: options.inboxFrames, bytes: options.inboxBytes },
          pausedFor: {
            inbox: metrics.counter(METRICS.paused.name, { reason: "inbox" }),
            commands: metrics.counter(METRICS.paused.name, { reason: "commands" })
          },
          defect: (where, cause) => health.logError("websocket handler failed", { where, cause: String(cause) })
        }
        // A session fiber that ended before its session closed (interrupted by the shutdown, or a
        // defect outside the session's boundary) is brought to its end in a fiber of the node's.
        // While the node stops, those that still could not save are counted and reported together
        // (`drain`), not in a line each: a node stopping under more than it can save in
        // `shutdown_timeout` may cut thousands.
        const stopping = { started: false, cut: 0 }
        const countCut = () => Effect.sync(() => void stopping.cut++)
        const finishEnded = function(this: SessionRunner): void {
          if (!this.isClosed) run(stopping.started ? this.finish(countCut) : this.finish())
        }
        // Every session fiber is a child of this one: a child costs its parent one Set entry, where a
        // FiberSet would put an exit observer of its own (a closure) beside the session's (memory per
        // connection). It takes sockets until the drain ends the queue, then waits for its sessions.
        const accepted = yield* Queue.unbounded<PushSocket, Cause.Done>()
        const sessions = yield* Effect.forkScoped(Effect.awaitAllChildren(
          Queue.take(accepted).pipe(
            Effect.flatMap((socket) => makeSession(ports, socket, socket.handle as SessionHandle)),
            Effect.flatMap((session) =>
              Effect.map(
                Effect.forkChild(session.run(), { startImmediately: true }),
                (fiber) => fiber.addObserver(finishEnded.bind(session))
              )
            ),
            Effect.forever,
            Pull.catchDone(() => Effect.void)
          )
        ))
        const accept = (socket: PushSocket): void => {
          const handle = new SessionHandle(options.clientChannelCapacity, Number.POSITIVE_INFINITY, limits.inbox)
          handle.mailbox.gate = socket
          socket.handle = handle
          socket.limits = limits
          // The session's cleanup takes it out of the registry.
          registry.track(handle)
          if (Queue.offerUnsafe(accepted, socket)) return
          // Draining: no new sessions.
          registry.remove(handle)
          socket.terminate()
        }
        const publicCounters = portCounters(metrics, "websocket")
        const refuse = (socket: Duplex): void => void answerOnSocket(socket, new TooManyConnections())
        const publicServer = capPerAddress(
          countIdleCloses(answerSocketErrors(createServer(serverOptions, handlePublicRequest(registry, health)), () => publicCounters.timedOut("request")), publicCounters),
          socketLimits,
          publicCounters,
          refuse
        )
        publicServer.on("upgrade", (req, socket, head) => {
          if (registry.connections.size >= options.maxConnections) {
            publicCounters.refused("max_connections")
            return refuse(socket)
          }
          wss.handleUpgrade(req, socket, head, accept)
        })
        const port = yield* listen(publicServer, options.port, options.bindHost, "port", options.worker !== undefined)
        yield* Effect.logInfo("connection node listening").pipe(
          Effect.annotateLogs({ port, routerPort, routerUrl: sessionOptions.routerUrl })
        )
        // Registered last, so it runs first on shutdown: while the router port still answers.
        // Sessions end, then what they started in the background (peer pokes, finishes).
        const sessionsDone = Effect.andThen(Fiber.await(sessions), FiberSet.awaitEmpty(fibers))
        const interruptSessions = Effect.andThen(Fiber.interrupt(sessions), FiberSet.awaitEmpty(fibers))
        yield* Effect.addFinalizer(() =>
          drain({
            publicServer,
            stopAccepting: () => void Queue.endUnsafe(accepted),
            registry,
            sessionsDone,
            interruptSessions,
            timeoutMs: options.shutdownTimeoutMs,
            leaveRecords: (sessions) => storage.clearNodeIds(sessionOptions.routerUrl, sessions),
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

/**
 * Storage operations of a node's sessions in flight at once. Beyond, they wait here: a reconnect
 * storm queues in the node, not in the store, and an operation's `storage_timeout` starts when it is
 * sent, so it measures the store rather than a queue of the node's own making (which failed the
 * hellos of a storm that a busy store would still have answered in time).
 */
export const SESSION_STORAGE_CONCURRENCY = 128

export const sessionStorage = (storage: StorageService) =>
  Effect.sync(() => {
    const inFlight = new Permits(SESSION_STORAGE_CONCURRENCY)
    return mapStorageOperations(storage, () => (operation) => inFlight.withPermit(operation), { values: false })
  })

/** What a session talks to, from the node's services: the one place the session's ports are assembled. */
export const sessionPorts = (options: SessionOptions, logFrames: boolean) =>
  Effect.gen(function*() {
    return {
      storage: yield* sessionStorage(yield* Storage),
      events: yield* EventLog,
      registry: yield* NodeRegistry,
      peers: yield* PeerNodes,
      endpoints: yield* EndpointCrypto,
      broadcasts: (yield* Broadcasts).current,
      options,
      protocol: protocolFor(options),
      logFrames
    } satisfies SessionPorts
  })

interface TransportLimits {
  readonly closeGraceMs: number
  readonly maxSendBufferBytes: number
  readonly maxControlFramesPerSecond: number
  /** The client's frames waiting in its mailbox at which its socket stops being read. */
  readonly inbox: InboxBound
  /** Counted each time a socket stops being read, by why. */
  readonly pausedFor: { readonly [R in Exclude<PauseReason, "closing">]: Counter }
  /** A bug in a `ws` callback: logged, and the socket closed 1011 — never the process. */
  readonly defect: (where: string, cause: unknown) => void
}

/**
 * Why a socket is not read (any one is enough): its inbox is full, its commands wait for the budget,
 * or its session is closing (nothing it sends matters any more; not counted as a pause).
 */
type PauseReason = "inbox" | "commands" | "closing"
const PAUSED_BY: { readonly [R in PauseReason]: number } = { inbox: 1, commands: 2, closing: 4 }

/**
 * A `ws` socket that is also its session's transport: `ws` makes it (the server's `WebSocket`
 * option) and its events go straight to the session's mailbox, with no listener, closure or side
 * object per connection (memory per connection).
 */
class PushSocket extends WebSocket implements Transport, InboxGate {
  /** Set by `accept` before any frame can arrive. */
  handle: SessionHandle | undefined = undefined
  limits: TransportLimits | undefined = undefined
  /** Control frames in the current one-second window, and when it began. */
  controlFrames = 0
  controlWindow = 0
  /** The client stopped reading: nothing more is sent, the session is being closed. */
  stalled = false
  /** The reasons (`PAUSED_BY` bits) the socket is not read now; read while 0. */
  pausedBy = 0
  /**
   * No listener table (a dictionary object, 184 bytes per connection): nothing listens on a
   * PushSocket, and EventEmitter makes the table afresh if a listener is ever added.
   */
  _events = undefined

  sendText(text: string): void {
    if (this.readyState !== this.OPEN || this.stalled) return
    if (this.bufferedAmount > (this.limits as TransportLimits).maxSendBufferBytes) {
      // Its unacked messages are saved by the session's close; other clients are not held up.
      this.stalled = true
      this.handle?.mailbox.offerFirst({ _tag: "Kick", kind: "slow-client" })
      return
    }
    this.send(text)
  }

  sendClose(code: number, reason: string): void {
    if (this.readyState === this.OPEN) this.close(code, reason)
    setTimeout(terminate, (this.limits as TransportLimits).closeGraceMs, this).unref()
  }

  /** The session's commands wait for the budget: stop reading until they are let through. */
  override pause(): void {
    this.hold("commands")
  }

  override resume(): void {
    this.release("commands")
  }

  /** The mailbox holds as many of the client's frames as it may: stop reading until it drained. */
  inboxFull(): void {
    this.hold("inbox")
  }

  inboxDrained(): void {
    this.release("inbox")
  }

  /** The session is going away: what the client sends is not read any more (the socket ends after the close grace). */
  closing(): void {
    this.hold("closing")
  }

  private hold(reason: PauseReason): void {
    const bit = PAUSED_BY[reason]
    if ((this.pausedBy & bit) !== 0) return
    if (reason !== "closing") (this.limits as TransportLimits).pausedFor[reason].inc()
    if (this.pausedBy === 0) super.pause()
    this.pausedBy |= bit
  }

  private release(reason: PauseReason): void {
    const bit = PAUSED_BY[reason]
    if ((this.pausedBy & bit) === 0) return
    this.pausedBy &= ~bit
    if (this.pausedBy === 0) super.resume()
  }

  sendPing(): void {
    if (this.readyState === this.OPEN) this.ping()
  }

  /** `ws` events, in place of listeners; a bug here closes this socket (1011) and is logged, never thrown. */
  override emit(event: string | symbol, ...args: Array<any>): boolean {
    const mailbox = this.handle?.mailbox
    if (mailbox === undefined) return false
    try {
      switch (event) {
        case "message":
          onMessage(this, mailbox, args[0], args[1])
          break
        case "ping":
          if (this.control(performance.now())) this.pong(args[0])
          else this.flooded(mailbox)
          break
        case "pong":
          if (this.control(performance.now())) mailbox.offer({ _tag: "Pong" })
          else this.flooded(mailbox)
          break
        case "close":
          mailbox.offer({ _tag: "SocketClosed" })
          break
        case "error":
          this.terminate()
          break
        default:
          return false
      }
    } catch (cause) {
      ;(this.limits as TransportLimits).defect(String(event), cause)
      const { code, reason } = closeFrame("internal-error")
      this.sendClose(code, reason)
    }
    return true
  }

  /** Too many control frames: the session is closed, and nothing more the client sends is read. */
  private flooded(mailbox: Mailbox<MailboxInput>): void {
    mailbox.offerFirst({ _tag: "Kick", kind: "control-flood" })
    this.closing()
  }

  /** Count a control frame from the client; false once it sends more than its share this second. */
  private control(now: number): boolean {
    if (now - this.controlWindow >= 1_000) {
      this.controlWindow = now
      this.controlFrames = 0
    }
    return ++this.controlFrames <= (this.limits as TransportLimits).maxControlFramesPerSecond
  }
}

const terminate = (socket: PushSocket): void => socket.terminate()

/**
 * A client's message into its inbox, weighed by its bytes (reading stops while the inbox is full).
 * Once the session is going away nothing more it sends matters: the socket is not read any more
 * (it is ended after the close grace), and what was read already is not decoded.
 */
const onMessage = (socket: PushSocket, mailbox: Mailbox<MailboxInput>, data: RawData, isBinary: boolean): void => {
  if (mailbox.isClosed) return socket.closing()
  const bytes = Array.isArray(data) ? data.reduce((sum, part) => sum + part.length, 0) : data.byteLength
  if (isBinary) return void mailbox.offerFrame({ _tag: "BinaryFrame" }, bytes)
  mailbox.offerFrame(textFrame(data.toString()), bytes)
}

/**
 * Graceful drain: stop accepting connections, close every session with 1001 (Firefox reconnects,
 * elsewhere or here once restarted); each session saves its unacked direct messages on the way out,
 * and from the moment it closes the router port answers 404 for it, so endpoints store instead.
 * Waits for the sessions up to `timeoutMs`; the rest are interrupted, and their cleanup still runs
 * (`interruptSessions` waits for it). Then the node takes its id out of the records of the sessions
 * it had, all at once (`leaveRecords`: a few transactions on SQL stores, where each session
 * clearing its own would cost a commit each), so that endpoints store for them rather than try a
 * node that is gone.
 */
const drain = (
  { publicServer, stopAccepting, registry, sessionsDone, interruptSessions, timeoutMs, leaveRecords, stopping }: {
    readonly publicServer: Server
    readonly stopAccepting: () => void
    readonly registry: NodeRegistryService
    readonly sessionsDone: Effect.Effect<void>
    readonly interruptSessions: Effect.Effect<void>
    readonly timeoutMs: number
    readonly leaveRecords: (sessions: ReadonlyArray<NodeSession>) => Effect.Effect<number, StorageError>
    /** Set here when the drain starts; `cut`: sessions ended without their unacked messages saved. */
    readonly stopping: { started: boolean; readonly cut: number }
  }
) =>
  Effect.gen(function*() {
    stopping.started = true
    publicServer.close()
    stopAccepting()
    const sessions = registry.connections.size
    const identified: Array<NodeSession> = []
    for (const handle of registry.connections) {
      if (handle.uaid !== undefined) identified.push({ uaid: handle.uaid, connectedAt: handle.connectedAt })
      handle.mailbox.offer({ _tag: "Kick", kind: "shutdown" })
    }
    const began = yield* Clock.currentTimeMillis
    const done = yield* sessionsDone.pipe(Effect.timeoutOption(timeoutMs))
    if (done._tag === "None") yield* interruptSessions
    // What is left of `timeoutMs`, and at least a second: records not left by then name a node that
    // is gone, which endpoints find out for themselves (they store, and clear the node id).
    const leftMs = Math.max(1_000, began + timeoutMs - (yield* Clock.currentTimeMillis))
    const left = yield* leaveRecords(identified).pipe(
      Effect.timeoutOrElse({ duration: leftMs, orElse: () => Effect.succeed(0) }),
      Effect.catchTag("StorageError", (error) =>
        Effect.as(
          Effect.logWarning("could not leave the router records of this node's sessions").pipe(
            Effect.annotateLogs({ sessions: identified.length, operation: error.operation, reason: error.reason._tag, cause: failureText(error) })
          ),
          0
        ))
    )
    if (stopping.cut > 0) {
      yield* Effect.logError("sessions ended before their unacked messages could be saved").pipe(
        Effect.annotateLogs({ sessions: stopping.cut, shutdown_timeout_ms: timeoutMs })
      )
    }
    yield* Effect.logInfo("connection node drained").pipe(
      Effect.annotateLogs({ sessions, complete: done._tag === "Some", remaining: registry.connections.size, records_left: left })
    )
  })

