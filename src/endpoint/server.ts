/**
 * The endpoint node's HTTP API: routes, CORS, and the one place where errors
 * become responses. Every failure — a validation rule, an unknown path (404), a known path with
 * another method (405), a bug (500) — is answered with the error JSON of `toErrorResponse`.
 *
 * - `makeEndpoint(options)` builds the request handlers: the platform's `HttpApp` for every route,
 *   and in front of it the push route on plain `node:http` (`push`), which takes the pushes whose
 *   URL is spelled plainly — nearly all of them — without the platform's router and middleware (the
 *   per-notification cost). The two share the handler, the error mapping, CORS and instrumentation;
 * - `EndpointServer.layerServer(options)` serves them on `node:http` (port 0 picks a free port, see
 *   `boundPort`), given the `WebPushRouter`; `EndpointServer.layer(options)` also builds the router
 *   with the live `NodeClient`. Both need `Storage`, `EndpointCrypto` and `EventLog`.
 */
import { randomBytes } from "node:crypto"
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http"
import { createServer as createHttpsServer } from "node:https"
import type { Socket } from "node:net"
import * as NodeHttpServer from "@effect/platform-node/NodeHttpServer"
import * as Cause from "effect/Cause"
import * as Effect from "effect/Effect"
import * as FiberSet from "effect/FiberSet"
import * as Layer from "effect/Layer"
import type * as Scope from "effect/Scope"
import * as HttpMiddleware from "effect/http/HttpMiddleware"
import * as HttpRouter from "effect/http/HttpRouter"
import * as HttpServer from "effect/http/HttpServer"
import type * as HttpServerError from "effect/http/HttpServerError"
import * as HttpServerRequest from "effect/http/HttpServerRequest"
import * as HttpServerResponse from "effect/http/HttpServerResponse"
import { makeConsoleRoutes } from "../console/console.ts"
import type { EndpointCrypto } from "../crypto/endpoint.ts"
import { Bridges } from "../bridges/Bridges.ts"
import { DEFAULT_MATRIX_TTL_SECONDS, makeMatrixGateway } from "../gateway/matrix.ts"
import {
  type ApiError,
  InternalError,
  MethodNotAllowed,
  Overloaded,
  RouteNotFound,
  toErrorResponse,
  TooManyConnections
} from "../domain/errors.ts"
import { answerOnSocket, answerSocketErrors, sendError } from "../platform/raw-http.ts"
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
import { endpointInstrumentation, routeLabel } from "../observability/endpoint.ts"
import { Metrics } from "../observability/Metrics.ts"
import { portCounters } from "../observability/sockets.ts"
import { makeHealthHandlers } from "./health.ts"
import type { EndpointOptions } from "./options.ts"
import { makeBroadcastAdmin } from "./broadcasts.ts"
import { makeRegistrationHandlers, type RegistrationPath } from "./registration.ts"
import { makeErrorsPage } from "./errorsPage.ts"
import { withHttp2 } from "./http2.ts"
import { makeRateLimits, makeTokenBuckets, NO_LIMITS } from "./rateLimits.ts"
import { makeReceipts } from "./receipts.ts"
import { type EmptyAnswer, makeWebPushHandlers } from "./webpush.ts"

/** A request handler: what a server runs for each request. */
export type HttpApp = Effect.Effect<HttpServerResponse.HttpServerResponse, never, HttpServerRequest.HttpServerRequest | Scope.Scope>

/** The services the endpoint handlers use. */
export type EndpointServices = Storage | EndpointCrypto | WebPushRouter | Bridges | EventLog | Metrics

/** The error response (JSON) of an API error. */
export const errorResponse = (error: ApiError, extraHeaders: Readonly<Record<string, string>> = {}): HttpServerResponse.HttpServerResponse => {
  const { status, headers, body } = toErrorResponse(error)
  return HttpServerResponse.jsonUnsafe(body, { status, headers: { ...headers, ...extraHeaders } })
}

/** CORS: any origin and header, DELETE/GET/POST/PUT, preflights cached 1 h, `Location`, `TTL` and `Link` readable. */
const CORS = { allowedMethods: ["DELETE", "GET", "POST", "PUT"], exposedHeaders: ["location", "ttl", "link"], maxAge: 3600 }
export const endpointCors = HttpMiddleware.cors(CORS)

/** What `endpointCors` adds to the answer of a request that is not a preflight. */
const CORS_HEADERS: Readonly<Record<string, string>> = {
  "access-control-allow-origin": "*",
  "access-control-expose-headers": CORS.exposedHeaders.join(",")
}

const emptyResponse = (answer: EmptyAnswer): HttpServerResponse.HttpServerResponse =>
  HttpServerResponse.empty({ status: answer.status, headers: answer.headers })

/**
 * Endpoint tokens (140–184 chars) and message ids (≈ 200–230) are longer than the router's default
 * limit; a longer one must still reach its route, to be refused as a bad token (404/102), not as an
 * unknown path. (The request line itself is bounded by the server's header size limit.)
 */
const ROUTER_CONFIG = { maxParamLength: 65_536 }

type Handler = Effect.Effect<HttpServerResponse.HttpServerResponse, ApiError, HttpServerRequest.HttpServerRequest | HttpRouter.RouteContext>

const METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "QUERY"] as const
type Method = (typeof METHODS)[number]

const methodNotAllowed: Handler = Effect.fail(new MethodNotAllowed())

/** A path with handlers for some methods; every other method answers 405 (HEAD follows GET, OPTIONS is CORS). */
const resource = (path: `/${string}`, handlers: Partial<Record<Method, Handler>>) =>
  METHODS.map((method) => HttpRouter.route(method, path, handlers[method] ?? methodNotAllowed))

const param = (params: Readonly<Record<string, string | undefined>>, name: string): string => params[name] ?? ""

/** Methods some route answers; any other method is refused (405) wherever it is sent. */
const KNOWN_METHODS: ReadonlySet<string> = new Set([...METHODS, "HEAD", "OPTIONS"])

const toApiError = (error: ApiError | HttpServerError.HttpServerError): ApiError =>
  error._tag !== "HttpServerError" ? error
  : error.reason._tag !== "RouteNotFound" ? new InternalError({ cause: error })
  : KNOWN_METHODS.has(error.reason.request.method) ? new RouteNotFound()
  : new MethodNotAllowed()

/** Answers after which the connection is closed: the request's body was not (fully) read. */
const CLOSES: ReadonlySet<ApiError["_tag"]> = new Set(["RequestTimeout", "PayloadTooLarge"])

/**
 * The edge: a failed request's error through the one mapping (also given to `onError`), leaving one
 * access-log line (route, status, errno, message — never the path, which carries tokens); a bug or
 * a defect is answered 500/999 with a request id, which its error log line carries too. The error
 * and the headers to answer it with; an interruption alone stays one.
 */
const failureAnswer = (
  cause: Cause.Cause<ApiError | HttpServerError.HttpServerError>,
  method: string,
  url: string,
  onError: (error: ApiError) => void
): Effect.Effect<{ readonly error: ApiError; readonly headers: Readonly<Record<string, string>> }> => {
  const failure = Cause.findErrorOption(cause)
  if (failure._tag === "None" && Cause.hasInterruptsOnly(cause)) return Effect.failCause(cause as Cause.Cause<never>)
  const error = failure._tag === "Some" ? toApiError(failure.value) : new InternalError({ cause: Cause.squash(cause) })
  onError(error)
  const { status, body } = toErrorResponse(error)
  const route = routeLabel(url)
  if (error._tag === "InternalError") {
    const requestId = randomBytes(8).toString("hex")
    return Effect.logError("request failed").pipe(
      Effect.annotateLogs({ request_id: requestId, method, route, cause: Cause.pretty(cause) }),
      Effect.as({ error, headers: { "x-request-id": requestId } })
    )
  }
  return Effect.logInfo("request rejected").pipe(
    Effect.annotateLogs({ method, route, status, errno: body.errno, reason: body.message }),
    Effect.as({ error, headers: CLOSES.has(error._tag) ? { connection: "close" } : {} })
  )
}

/** `app` with its failures answered by `failureAnswer`. */
const respondToFailures = <R>(
  app: Effect.Effect<HttpServerResponse.HttpServerResponse, ApiError | HttpServerError.HttpServerError, R>,
  onError: (error: ApiError) => void
): Effect.Effect<HttpServerResponse.HttpServerResponse, never, R | HttpServerRequest.HttpServerRequest> =>
  app.pipe(
    Effect.catchCause((cause) =>
      Effect.flatMap(HttpServerRequest.HttpServerRequest, (request) =>
        Effect.map(failureAnswer(cause, request.method, request.url, onError), ({ error, headers }) => errorResponse(error, headers))))
  )

/**
 * `/wpush/{token}` or `/wpush/{version}/{token}` spelled plainly: nothing in it the platform's router
 * would read another way (no query, `;`, percent escape, empty or extra segment). Other spellings
 * go through the router, to the same handler.
 */
const PLAIN_PUSH_PATH = /^\/wpush\/(?:([A-Za-z0-9]+)\/)?([A-Za-z0-9_=-]+)$/

/** `GET /receipts/{id}` (a query is ignored): answered on the request itself, which it may hold open. */
const RECEIPTS_PATH = /^\/receipts\/([^/?#]*)(?:\?.*)?$/

/** The endpoint's handlers: the platform's app for every route, and in front, the routes on `node:http` itself. */
export interface Endpoint {
  readonly app: HttpApp
  /**
   * Take the request if it is a push to a plainly spelled URL, or a receipt subscription's `GET`
   * (and answer it); false otherwise.
   */
  readonly front: (req: IncomingMessage, res: ServerResponse) => boolean
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
    const limits = makeRateLimits(options.rateLimits ?? NO_LIMITS)
    const receipts = yield* makeReceipts(options, limits)
    const webpush = yield* makeWebPushHandlers(options, receipts, limits)
    // The Matrix push gateway: its messages go through the push path (`sendMade`), limited per
    // pushkey at the per-address rate; off when only VAPID-signed pushes are taken.
    const matrix = yield* makeMatrixGateway({
      endpointUrl: options.endpointUrl,
      maxDataBytes: options.maxDataBytes,
      ttlSeconds: options.matrixGatewayTtl ?? DEFAULT_MATRIX_TTL_SECONDS,
      off: options.requireVapid === true,
      idleMs: options.clientRequestTimeoutMs ?? 10_000
    }, webpush.sendMade, makeTokenBuckets((options.rateLimits ?? NO_LIMITS).perAddress).take)
    const maxInFlight = options.maxInFlightRequests ?? Number.POSITIVE_INFINITY
    const errorsPage = makeErrorsPage()
    const routes = HttpRouter.use((router) =>
      Effect.gen(function*() {
        const health = yield* makeHealthHandlers(options)
        const bridged = yield* makeRegistrationHandlers(options)
        const registrationRoute = (
          handler: (request: HttpServerRequest.HttpServerRequest, path: RegistrationPath) => Effect.Effect<HttpServerResponse.HttpServerResponse, ApiError>
        ): Handler =>
          Effect.gen(function*() {
            const params = yield* HttpRouter.params
            return yield* handler(yield* HttpServerRequest.HttpServerRequest, {
              routerType: param(params, "routerType"),
              appId: param(params, "appId"),
              uaid: params["uaid"],
              chid: params["chid"]
            })
          })
        const send: Handler = Effect.gen(function*() {
          const params = yield* HttpRouter.params
          const request = yield* HttpServerRequest.HttpServerRequest
          const pushRequest = webpush.pushRequest(request.source as IncomingMessage)
          return emptyResponse(yield* webpush.send(pushRequest, params["version"], param(params, "token")))
        })
        const cancel: Handler = Effect.flatMap(HttpRouter.params, (params) => Effect.map(webpush.cancel(param(params, "messageId")), emptyResponse))
        const messageStatus: Handler = Effect.gen(function*() {
          const params = yield* HttpRouter.params
          const request = yield* HttpServerRequest.HttpServerRequest
          return HttpServerResponse.jsonUnsafe(yield* receipts.status(param(params, "messageId"), request.source as IncomingMessage))
        })
        const subscribeReceipts: Handler = Effect.flatMap(HttpServerRequest.HttpServerRequest, (request) =>
          Effect.map(receipts.subscribe(request.source as IncomingMessage), emptyResponse))
        const admin = yield* makeBroadcastAdmin(options.broadcastAdminTokens ?? [])
        const withRequest = (handle: (request: HttpServerRequest.HttpServerRequest, id: string) => Handler): Handler =>
          Effect.gen(function*() {
            const params = yield* HttpRouter.params
            const id = params["name"] === undefined ? param(params, "id") : `${param(params, "id")}/${params["name"]}`
            return yield* handle(yield* HttpServerRequest.HttpServerRequest, id)
          })
        const listBroadcasts: Handler = Effect.flatMap(HttpServerRequest.HttpServerRequest, admin.list)
        const consoleRoutes = options.console === undefined ? [] : yield* makeConsoleRoutes(options.console)
        const registration = "/v1/:routerType/:appId/registration"
        yield* router.addAll([
          ...resource("/wpush/:version/:token", { POST: send }),
          ...resource("/wpush/:token", { POST: send }),
          ...resource("/m/:messageId", { DELETE: cancel, GET: messageStatus }),
          ...resource("/receipts", { POST: subscribeReceipts }),
          // GET is answered in front (`collect`); other methods get 405 here.
          ...resource("/receipts/:id", {}),
          ...resource(registration, { POST: registrationRoute(bridged.register) }),
          ...resource(`${registration}/:uaid`, {
            GET: registrationRoute(bridged.channels),
            PUT: registrationRoute(bridged.update),
            DELETE: registrationRoute(bridged.unregister)
          }),
          ...resource(`${registration}/:uaid/subscription`, { POST: registrationRoute(bridged.subscribe) }),
          ...resource(`${registration}/:uaid/subscription/:chid`, { DELETE: registrationRoute(bridged.unsubscribe) }),
          ...resource("/v1/broadcasts", { GET: listBroadcasts }),
          // Ids like remote-settings/monitor_changes: one `/` as it is, or any percent-encoded.
          ...resource("/v1/broadcasts/:id", { PUT: withRequest(admin.put), DELETE: withRequest(admin.remove) }),
          ...resource("/v1/broadcasts/:id/:name", { PUT: withRequest(admin.put), DELETE: withRequest(admin.remove) }),
          ...resource("/health", { GET: health.health }),
          ...resource("/__heartbeat__", { GET: health.health }),
          ...resource("/__lbheartbeat__", { GET: health.lbHeartbeat }),
          ...resource("/errors", { GET: Effect.succeed(errorsPage) }),
          ...resource("/__version__", { GET: health.version }),
          ...resource("/status", { GET: health.status }),
          ...resource("/__error__", { GET: health.logCheck }),
          ...resource("/v1/err", { GET: health.logCheck }),
          // The Matrix push gateway: its own routes and Matrix error JSON under /_matrix/.
          ...matrix.routes,
          ...consoleRoutes
        ])
      })
    )
    const routed = yield* HttpRouter.toHttpEffect(routes).pipe(Effect.provideService(HttpRouter.RouterConfig, ROUTER_CONFIG))
    const app = observe.instrument(endpointCors(respondToFailures(routed, observe.onError)), maxInFlight)

    // The plain push route: the same handler run as a fiber of its own, answered on `res` directly.
    // Its fibers belong to the server: shutdown waits for requests in flight (up to shutdown_timeout,
    // as the server closes), and whatever still runs then is interrupted before the services go.
    const pushes = yield* FiberSet.make()
    const run = yield* FiberSet.runtime(pushes)<EndpointServices>()
    // Receipt subscriptions' GETs, which may be held open: their fibers end when the server stops.
    const held = yield* FiberSet.make()
    const runHeld = yield* FiberSet.runtime(held)<never>()
    const overloaded = new Overloaded()
    const push = (req: IncomingMessage, res: ServerResponse): boolean => {
      const path = req.method === "POST" && req.url !== undefined ? PLAIN_PUSH_PATH.exec(req.url) : null
      if (path === null) return false
      const start = observe.begin(maxInFlight)
      if (start === undefined) {
        sendError(res, overloaded, true, CORS_HEADERS)
        return true
      }
      const url = req.url as string
      const answered = webpush.send(webpush.pushRequest(req), path[1], path[2] as string).pipe(
        Effect.map((answer) => ({ answer, error: undefined })),
        Effect.catchCause((cause) => Effect.map(failureAnswer(cause, "POST", url, observe.onError), (error) => ({ answer: undefined, error })))
      )
      const fiber = run(answered)
      fiber.addObserver((exit) => {
        if (exit._tag === "Failure") return observe.end(start, url, undefined) // interrupted: the client left
        const { answer, error } = exit.value
        if (answer !== undefined) {
          res.writeHead(answer.status, { ...answer.headers, ...CORS_HEADERS, "content-length": 0 })
          res.end()
        } else {
          sendError(res, error.error, false, { ...error.headers, ...CORS_HEADERS })
        }
        observe.end(start, url, res.statusCode)
      })
      // A client that leaves before its answer interrupts the handler, as on the platform's routes.
      if (fiber.pollUnsafe() === undefined) {
        res.once("close", () => {
          if (!res.writableEnded) fiber.interruptUnsafe()
        })
      }
      return true
    }

    const collect = (req: IncomingMessage, res: ServerResponse): boolean => {
      const path = req.method === "GET" && req.url !== undefined ? RECEIPTS_PATH.exec(req.url) : null
      if (path === null) return false
      // Not counted in flight: a held GET must not keep pushes out.
      const start = observe.begin(Number.POSITIVE_INFINITY) as number
      const url = req.url as string
      const fiber = runHeld(receipts.collect(path[1] as string, req, res, CORS_HEADERS).pipe(
        Effect.catchCause((cause) =>
          Effect.map(failureAnswer(cause, "GET", url, observe.onError), (error) =>
            // Storage failing once receipts are streaming: the stream ends (the client asks again).
            res.headersSent ? void res.end() : sendError(res, error.error, false, { ...error.headers, ...CORS_HEADERS })))
      ))
      fiber.addObserver(() => observe.end(start, url, res.headersSent ? res.statusCode : undefined))
      res.once("close", () => fiber.interruptUnsafe())
      return true
    }
    return { app, front: (req, res) => push(req, res) || collect(req, res) }
  })

/** The endpoint's connection bounds: `options.socketLimits` (or the defaults) with the client request timeout. */
export const endpointSocketLimits = (options: EndpointOptions): SocketLimits => ({
  ...(options.socketLimits ?? DEFAULT_SOCKET_LIMITS),
  requestTimeoutMs: options.clientRequestTimeoutMs ?? DEFAULT_SOCKET_LIMITS.requestTimeoutMs
})

/**
 * The endpoint port's server: HTTP/1.1 and HTTP/2, over TLS when the node has a certificate, with
 * `front` before the platform's request listeners, and the connection bounds of
 * `platform/socket-limits.ts`: a connection beyond the per-address cap is answered 503 and closed
 * (over TLS, closed before its handshake); the first request (headers, or an HTTP/2 stream) is due
 * within the client request timeout of connecting, the TLS handshake included; idle connections go
 * after the idle timeout.
 */
const listener = (options: EndpointOptions, front: (req: IncomingMessage, res: ServerResponse) => boolean, counters: PortCounters): Server => {
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
const withFront = (server: Server, front: (req: IncomingMessage, res: ServerResponse) => boolean): Server => {
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
    EndpointServer.layerServer(options).pipe(Layer.provide(WebPushRouter.layer.pipe(Layer.provide(nodeClient)))),

  /** `layerServer` with the WebPush router and the live connection-node client. */
  layer: (options: EndpointOptions) => EndpointServer.layerWith(options, NodeClient.layer(nodeClientOptions(options)))
}

/** The connection-node client's timeouts from the endpoint's options. */
export const nodeClientOptions = (options: EndpointOptions) => ({
  connectTimeoutMs: options.connectionTimeoutMs,
  requestTimeoutMs: options.requestTimeoutMs
})
