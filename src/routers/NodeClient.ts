/**
 * The one client for connection nodes' router ports, used by endpoint nodes and
 * by connection nodes talking to each other: `PUT {node}/push/{uaid}` hands a notification (the one
 * codec of `domain/router-wire.ts`) to the node holding the client, `PUT {node}/notif/{uaid}` tells it
 * to check storage, `DELETE {node}/notif/{uaid}/{connected_at}` to drop a stale session. Replies are
 * just a status; a connection or timeout failure is a `NodeTransportError` (the node is gone). The
 * current span travels as a W3C `traceparent` header. Every request is signed
 * (`Autopush-Router-Auth`, `crypto/routerAuth.ts`) with the key derived once at start, stamped
 * with the Clock's time. The live layer keeps connections alive per node; tests swap in a fake.
 */
import * as http from "node:http"
import * as https from "node:https"
import { urlToHttpOptions } from "node:url"
import * as Clock from "effect/Clock"
import * as Context from "effect/Context"
import * as Data from "effect/Data"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Tracer from "effect/Tracer"
import { hyphenate } from "../domain/ids.ts"
import { memoize } from "../platform/memo.ts"
import type { Notification } from "../domain/notification.ts"
import { CONNECTED_AT_HEADER, encodeTransportNotification } from "../domain/router-wire.ts"
import { ROUTER_AUTH_HEADER, RouterAuth } from "../crypto/routerAuth.ts"
import { messageSpans } from "../observability/tracing.ts"

export class NodeTransportError extends Data.TaggedError("NodeTransportError")<{
  readonly nodeId: string
  readonly reason: "connect-timeout" | "timeout" | "error"
  readonly cause?: unknown
}> {}

export interface NodeClientService {
  /**
   * Deliver to the connected client — only to its session connected at `connectedAt` (the router
   * record's), when given; the node's status (200 = queued for the client).
   */
  readonly push: (nodeId: string, uaid: string, notification: Notification, connectedAt?: number) => Effect.Effect<number, NodeTransportError>
  /** Ask the node to check storage for this client; the node's status. */
  readonly notify: (nodeId: string, uaid: string) => Effect.Effect<number, NodeTransportError>
  /** Ask the node to drop its session of this client if it is the one connected at `connectedAt`. */
  readonly disconnect: (nodeId: string, uaid: string, connectedAt: number) => Effect.Effect<number, NodeTransportError>
}

interface NodeClientOptions {
  /** Give up when the TCP connection is not up after this long (ms). */
  readonly connectTimeoutMs: number
  /** Give up when the whole exchange has not answered after this long (ms). */
  readonly requestTimeoutMs: number
  /** Agent for `http:` nodes (default: keep-alive); `https:` nodes always use a keep-alive agent. */
  readonly httpAgent?: http.Agent | undefined
  /** Whether the current span travels as `traceparent` (default true); without tracing there is none to read. */
  readonly traced?: boolean | undefined
}

/**
 * The request options of a node's paths, from its id (its router URL) parsed once. A path after a
 * query or fragment in the id lands in them, as it does in the URL spelled out: such an id is
 * parsed per call. A node id that is not a URL throws (a transport failure).
 */
const nodeRequests = (nodeId: string): ((path: string) => http.RequestOptions) => {
  const base = nodeId.replace(/\/+$/, "")
  const url = new URL(`${base}/`)
  if (url.search !== "" || url.hash !== "") return (path) => urlToHttpOptions(new URL(base + path))
  // What a request reads of the URL, on a plain object: `urlToHttpOptions` makes a dictionary,
  // slow to copy for every request.
  const { protocol, hostname, port, auth } = urlToHttpOptions(url)
  const prefix = url.pathname.slice(0, -1)
  return (path) => ({ protocol, hostname, port, auth, path: prefix + path })
}

/** Node ids whose request options are kept. */
const NODES_REMEMBERED = 1_000

const nodePath = (action: "push" | "notif", uaid: string, suffix = ""): string =>
  `/${action}/${uaid.length === 32 ? hyphenate(uaid) : uaid}${suffix}`

/** The W3C `traceparent` of the current span, if there is one. (Not `currentParentSpan`: its "none" is an error with a stack trace.) */
const currentTraceparent: Effect.Effect<string | undefined> = Effect.map(
  Effect.serviceOption(Tracer.ParentSpan),
  (span) => span._tag === "None" ? undefined : `00-${span.value.traceId.padStart(32, "0")}-${span.value.spanId}-${span.value.sampled ? "01" : "00"}`
)

/** The `Autopush-Router-Auth` value of a request: method, path as sent, `Autopush-Connected-At` (or none), body. */
export type RequestSigner = (method: string, path: string, connectedAt: string | undefined, body: string | undefined) => string

/** A `node:http` client with keep-alive agents: one signed request per call, resolved with the reply's status. */
export const makeHttpNodeClient = (
  options: NodeClientOptions & { readonly sign: RequestSigner }
): NodeClientService & { readonly close: () => void } => {
  const agents = {
    "http:": options.httpAgent ?? new http.Agent({ keepAlive: true }),
    "https:": new https.Agent({ keepAlive: true })
  }

  const send = (
    method: "PUT" | "DELETE",
    nodeId: string,
    target: http.RequestOptions,
    body: string | undefined,
    traceparent: string | undefined,
    connectedAt: number | undefined
  ) =>
    Effect.callback<number, NodeTransportError>((resume) => {
      let settled = false
      const settle = (effect: Effect.Effect<number, NodeTransportError>) => {
        if (settled) return
        settled = true
        resume(effect)
      }
      const fail = (reason: NodeTransportError["reason"], cause?: unknown) =>
        settle(Effect.fail(new NodeTransportError({ nodeId, reason, cause })))
      const agent = target.protocol === "https:" ? agents["https:"] : target.protocol === "http:" ? agents["http:"] : undefined
      if (agent === undefined) return fail("error", new Error(`unsupported node URL ${target.protocol}`))
      let connectTimer: NodeJS.Timeout | undefined
      let reason: NodeTransportError["reason"] = "error"
      const headers: http.OutgoingHttpHeaders = body === undefined
        ? { "content-length": 0 }
        : { "content-type": "application/json", "content-length": Buffer.byteLength(body) }
      if (traceparent !== undefined) headers["traceparent"] = traceparent
      const connectedAtText = connectedAt === undefined ? undefined : String(connectedAt)
      if (connectedAtText !== undefined) headers[CONNECTED_AT_HEADER] = connectedAtText
      headers[ROUTER_AUTH_HEADER] = options.sign(method, target.path ?? "/", connectedAtText, body)
      const request = (target.protocol === "https:" ? https : http).request({ ...target, method, agent, headers })
      const abort = (why: NodeTransportError["reason"]) => () => {
        reason = why
        request.destroy(new Error(`node ${why}`))
      }
      const requestTimer = setTimeout(abort("timeout"), options.requestTimeoutMs)
      const clear = () => {
        clearTimeout(requestTimer)
        clearTimeout(connectTimer)
      }
      request.on("socket", (socket) => {
        if (!socket.connecting) return
        connectTimer = setTimeout(abort("connect-timeout"), options.connectTimeoutMs)
        socket.once("connect", () => clearTimeout(connectTimer))
      })
      // Settled once the (empty) reply is read and, a tick later, the agent has pooled the socket
      // again: the next request then reuses it instead of opening another connection.
      request.on("response", (response) => {
        response.on("end", () => {
          clear()
          process.nextTick(settle, Effect.succeed(response.statusCode ?? 0))
        })
        response.on("error", (cause) => {
          clear()
          fail(reason, cause)
        })
        response.resume()
      })
      request.on("error", (cause) => {
        clear()
        fail(reason, cause)
      })
      request.end(body)
      return Effect.sync(() => {
        clear()
        request.destroy()
      })
    })

  const requestsTo = memoize(NODES_REMEMBERED, nodeRequests)
  const traced = options.traced ?? true

  /** A node id that is not a URL (or a body that cannot be sent) is a transport failure too. */
  const call = (method: "PUT" | "DELETE", nodeId: string, path: string, body: () => string | undefined, connectedAt?: number) => {
    const sent = (traceparent: string | undefined) =>
      Effect.suspend(() => send(method, nodeId, requestsTo(nodeId)(path), body(), traceparent, connectedAt))
    return (traced ? Effect.flatMap(currentTraceparent, sent) : sent(undefined)).pipe(
      Effect.catchDefect((cause) => Effect.fail(new NodeTransportError({ nodeId, reason: "error", cause })))
    )
  }

  return {
    push: (nodeId, uaid, notification, connectedAt) =>
      call("PUT", nodeId, nodePath("push", uaid), () => encodeTransportNotification(notification), connectedAt),
    notify: (nodeId, uaid) => call("PUT", nodeId, nodePath("notif", uaid), () => undefined),
    disconnect: (nodeId, uaid, connectedAt) =>
      call("DELETE", nodeId, nodePath("notif", uaid, `/${connectedAt}`), () => undefined),
    close: () => {
      agents["http:"].destroy()
      agents["https:"].destroy()
    }
  }
}

/** A connection node in this same process, reached without HTTP (the all-in-one). */
interface LocalNode {
  /** Its node id (router URL) as router records name it. */
  readonly nodeId: string
  /** Same meaning as its router port's answers: true = 200 (queued), false = 404. */
  readonly push: (uaid: string, notification: Notification, connectedAt?: number) => boolean
  readonly notify: (uaid: string) => boolean
}

/** The live client, signing with `RouterAuth` on the Clock's time, with `traceparent` only when tracing is on. */
const liveClient = (options: NodeClientOptions) =>
  Effect.gen(function*() {
    const spans = yield* messageSpans
    const auth = yield* RouterAuth
    const clock = yield* Clock.Clock
    const sign: RequestSigner = (method, path, connectedAt, body) => auth.sign(clock.currentTimeMillisUnsafe(), method, path, connectedAt, body)
    return yield* Effect.acquireRelease(
      Effect.sync(() => makeHttpNodeClient({ ...options, traced: spans.enabled, sign })),
      (client) => Effect.sync(client.close)
    )
  })

export class NodeClient extends Context.Service<NodeClient, NodeClientService>()("autopush/routers/NodeClient") {
  /** The live client; its sockets are closed with the layer. */
  static readonly layer = (options: NodeClientOptions): Layer.Layer<NodeClient, never, RouterAuth> => Layer.effect(NodeClient, liveClient(options))

  /**
   * The live client, except for the node in this process: its deliveries are handed over directly
   * instead of through a loopback HTTP request to its own router port.
   */
  static readonly layerWithLocal = <E, R>(
    options: NodeClientOptions,
    local: Effect.Effect<LocalNode, E, R>
  ): Layer.Layer<NodeClient, E, R | RouterAuth> =>
    Layer.effect(
      NodeClient,
      Effect.gen(function*() {
        const here = yield* local
        const remote = yield* liveClient(options)
        // Without tracing there is no span context to hand over.
        const traced = (yield* messageSpans).enabled
        return NodeClient.of({
          push: (nodeId, uaid, notification, connectedAt) =>
            nodeId !== here.nodeId ? remote.push(nodeId, uaid, notification, connectedAt)
            : traced ? Effect.map(currentTraceparent, (traceparent) =>
              here.push(uaid, traceparent === undefined ? notification : { ...notification, traceparent }, connectedAt) ? 200 : 404)
            : Effect.sync(() => here.push(uaid, notification, connectedAt) ? 200 : 404),
          notify: (nodeId, uaid) => (nodeId === here.nodeId ? Effect.sync(() => (here.notify(uaid) ? 200 : 404)) : remote.notify(nodeId, uaid)),
          disconnect: remote.disconnect
        })
      })
    )
}
