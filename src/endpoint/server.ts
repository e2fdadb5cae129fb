/**
 * The endpoint node's HTTP server. A request finds its answer here:
 *
 * - `front.ts`: pushes to a plainly spelled URL, and receipt subscriptions' GETs, taken on
 *   `node:http` itself before the platform sees them;
 * - `routes.ts`: every route on the platform's router (the push path: `webpush.ts`, in two steps,
 *   `acceptPush.ts` and `deliverPush.ts`);
 * - `edge.ts`: the one place where a failure becomes its answer, for both.
 *
 * `makeEndpoint(options)` builds them; `EndpointServer.layerServer(options)` serves them on
 * `node:http` (port 0 picks a free port, see `boundPort`), given the `WebPushRouter`;
 * `EndpointServer.layer(options)` also builds the router with the live `NodeClient`. Both need
 * `Storage`, `EndpointCrypto` and `EventLog`.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http"
import { createServer as createHttpsServer } from "node:https"
import type { Socket } from "node:net"
import * as NodeHttpServer from "@effect/platform-node/NodeHttpServer"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import type * as Scope from "effect/Scope"
import * as HttpMiddleware from "effect/http/HttpMiddleware"
import * as HttpRouter from "effect/http/HttpRouter"
import * as HttpServer from "effect/http/HttpServer"
import type * as HttpServerRequest from "effect/http/HttpServerRequest"
import type * as HttpServerResponse from "effect/http/HttpServerResponse"
import type { EndpointCrypto } from "../crypto/endpoint.ts"
import { Bridges } from "../bridges/Bridges.ts"
import { DEFAULT_MATRIX_TTL_SECONDS, makeMatrixGateway } from "../gateway/matrix.ts"
import { TooManyConnections } from "../domain/errors.ts"
import { answerOnSocket, answerSocketErrors } from "../platform/raw-http.ts"
import {
  capPerAddress,
  countIdleCloses,
  DEFAULT_SOCKET_LIMITS,
  httpServerTimeouts,
  type PortCounters,
  type SocketLimits
} from "../platform/socket-limits.ts"
import type { EventLog } from "../observability/EventLog.ts"
import { NodeClient } from "../routers/NodeClient.ts"
import { WebPushRouter } from "../routers/webpush.ts"
import type { Storage } from "../storage/Storage.ts"
import { endpointInstrumentation } from "../observability/endpoint.ts"
import { Metrics } from "../observability/Metrics.ts"
import { portCounters } from "../observability/sockets.ts"
import { endpointCors } from "./cors.ts"
import { respondToFailures } from "./edge.ts"
import { type Front, makeFront } from "./front.ts"
import { clientRequestTimeoutOf, type EndpointOptions } from "./options.ts"
import { peerOf, withHttp2 } from "./http2.ts"
import { makeRateLimits, NO_LIMITS } from "./rateLimits.ts"
import { makeEndpointReceipts } from "./receipts.ts"
import { makeRoutes, ROUTER_CONFIG } from "./routes.ts"
import { makeWebPushHandlers } from "./webpush.ts"

/** A request handler: what a server runs for each request. */
export type HttpApp = Effect.Effect<HttpServerResponse.HttpServerResponse, never, HttpServerRequest.HttpServerRequest | Scope.Scope>

/** The services the endpoint handlers use. */
export type EndpointServices = Storage | EndpointCrypto | WebPushRouter | Bridges | EventLog | Metrics

/** The endpoint's handlers: the platform's app for every route, and in front, the routes on `node:http` itself. */
export interface Endpoint {
  readonly app: HttpApp
  /**
   * Take the request if it is a push to a plainly spelled URL, or a receipt subscription's `GET`
   * (and answer it); false otherwise.
   */
  readonly front: Front
}

/**
 * The endpoint's request handlers, with CORS, error mapping, request and routing metrics, and the
 * in-flight limit applied. `/metrics` is not served here (the public port): see `metricsListener`.
 */
export const makeEndpoint = (
  options: EndpointOptions
): Effect.Effect<Endpoint, never, EndpointServices | Scope.Scope> =>
  Effect.gen(function*() {
    const observe = yield* endpointInstrumentation
    const limits = makeRateLimits(options.rateLimits ?? NO_LIMITS, yield* Metrics)
    const receipts = yield* makeEndpointReceipts(options, limits)
    const webpush = yield* makeWebPushHandlers(options, receipts, limits)
    // The Matrix push gateway: its messages go through the push path (`sendMade`, where each
    // subscription's limit applies); a notify counts against its sender's address as a push does;
    // off when only VAPID-signed pushes are taken.
    const matrix = yield* makeMatrixGateway({
      maxDataBytes: options.maxDataBytes,
      ttlSeconds: options.matrixGatewayTtl ?? DEFAULT_MATRIX_TTL_SECONDS,
      off: options.requireVapid === true,
      idleMs: clientRequestTimeoutOf(options)
    }, webpush.sendMade, {
      address: (req, nowMs) => limits.address(peerOf(req), req.headers["x-forwarded-for"], nowMs)
    })
    const maxInFlight = options.maxInFlightRequests ?? Number.POSITIVE_INFINITY
    const routes = makeRoutes(options, webpush, receipts, matrix, limits)
    const routed = yield* HttpRouter.toHttpEffect(routes).pipe(Effect.provideService(HttpRouter.RouterConfig, ROUTER_CONFIG))
    const app = observe.instrument(endpointCors(respondToFailures(routed, observe.onError)), maxInFlight)
    const front = yield* makeFront(observe, maxInFlight, webpush, receipts)
    return { app, front }
  })

/** The endpoint's connection bounds: `options.socketLimits` (or the defaults) with the client request timeout. */
export const endpointSocketLimits = (options: EndpointOptions): SocketLimits => ({
  ...(options.socketLimits ?? DEFAULT_SOCKET_LIMITS),
  requestTimeoutMs: clientRequestTimeoutOf(options)
})

/**
 * The endpoint port's server: HTTP/1.1 and HTTP/2, over TLS when the node has a certificate, with
 * `front` before the platform's request listeners, and the connection bounds of
 * `platform/socket-limits.ts`: a connection beyond the per-address cap is answered 503 and closed
 * (over TLS, closed before its handshake); the first request (headers, or an HTTP/2 stream) is due
 * within the client request timeout of connecting, the TLS handshake included; idle connections go
 * after the idle timeout.
 */
const listener = (options: EndpointOptions, front: Front, counters: PortCounters): Server => {
  const limits = endpointSocketLimits(options)
  const http1 = {
    // Headers must arrive within the client timeout; a body that stalls is answered 408 by the
    // push handler (this whole-request limit only backs it up, with `answerSocketErrors`' 408).
    ...httpServerTimeouts(limits),
    requestTimeout: limits.requestTimeoutMs * 2,
    // The API has no upgrade routes: a request asking for one is served as any other (the
    // platform's upgrade path answers some of them with a bare 411).
    shouldUpgradeCallback: () => false
  }
  const tls = options.tls !== undefined
  const server = tls
    ? createHttpsServer({
      ...http1,
      cert: options.tls?.cert,
      key: options.tls?.key,
      ALPNProtocols: ["h2", "http/1.1"],
      // `withHttp2` closes a connection without a request by then (the handshake included); Node's
      // own timer (120 s by default) only backs it up.
      handshakeTimeout: limits.requestTimeoutMs + 1_000
    }) as unknown as Server
    : createServer(http1)
  const refuse = tls ? (socket: Socket) => void socket.destroy() : (socket: Socket) => void answerOnSocket(socket, new TooManyConnections())
  // Outermost first: the cap sees a connection before anything else; `withHttp2` wraps `front`,
  // so that it sees every request (a connection's first one stops its timer).
  return capPerAddress(
    withHttp2(countIdleCloses(answerSocketErrors(withFront(server, front), () => counters.timedOut("request")), counters), tls, limits, counters),
    limits,
    counters,
    refuse
  )
}

/**
 * `server` with `front` before its `request` listeners: a request `front` takes (and answers) never
 * reaches them; the platform's server, which owns the listeners, sees every other one.
 */
const withFront = (server: Server, front: Front): Server => {
  const emit = server.emit.bind(server)
  server.emit = ((event: string | symbol, ...args: Array<unknown>): boolean =>
    event === "request" && front(args[0] as IncomingMessage, args[1] as ServerResponse) ? true : emit(event as string, ...args)) as Server["emit"]
  return server
}

/** The port the server listens on (useful with port 0). */
export const boundPort: Effect.Effect<number, never, HttpServer.HttpServer> = Effect.map(
  Effect.service(HttpServer.HttpServer),
  (server) => (server.address._tag === "UnixPathAddress" ? 0 : server.address.port)
)

export const EndpointServer = {
  /** Serve the endpoint on `node:http` at `options.port` / `options.bindHost`, with the bridges of `options.bridges`; exposes the `HttpServer`. */
  layerServer: (options: EndpointOptions) =>
    Layer.unwrap(Effect.zipWith(makeEndpoint(options), Effect.service(Metrics), ({ app, front }, metrics) =>
      HttpServer.serve(app).pipe(Layer.provideMerge(NodeHttpServer.layerServer(() => listener(options, front, portCounters(metrics, "endpoint")), {
        port: options.port,
        host: options.bindHost,
        reusePort: options.worker !== undefined,
        // On shutdown, requests in flight get this long to finish.
        gracefulShutdownTimeout: options.shutdownTimeoutMs ?? 10_000
      }))))).pipe(
      // The platform's request spans record URLs and headers (endpoint tokens, message ids, keys):
      // the endpoint's own spans (`observability/tracing.ts`) carry only what may leave the service.
      Layer.provide(Layer.succeed(HttpMiddleware.TracerDisabledWhen)(() => true)),
      Layer.provide(Bridges.layer(options.bridges ?? {}))
    ),

  /** `layerServer` with the WebPush router over the given connection-node client. */
  layerWith: <E, R>(options: EndpointOptions, nodeClient: Layer.Layer<NodeClient, E, R>) =>
    EndpointServer.layerServer(options).pipe(Layer.provide(
      WebPushRouter.layerWith({ maxStoredPerSubscription: options.maxStoredPerSubscription }).pipe(
        Layer.provide(nodeClient)
      )
    )),

  /** `layerServer` with the WebPush router and the live connection-node client. */
  layer: (options: EndpointOptions) => EndpointServer.layerWith(options, NodeClient.layer(nodeClientOptions(options)))
}

/** The connection-node client's timeouts from the endpoint's options. */
export const nodeClientOptions = (options: EndpointOptions) => ({
  connectTimeoutMs: options.connectionTimeoutMs,
  requestTimeoutMs: options.requestTimeoutMs
})
