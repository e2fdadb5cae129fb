/**
 * The endpoint node's HTTP API (protocol-notes §2.1): routes, CORS, and the one place where errors
 * become responses. Every failure — a validation rule, an unknown path (404), a known path with
 * another method (405), a bug (500) — is answered with the §2.5 JSON of `toErrorResponse`.
 *
 * - `makeEndpointApp(options)` builds the request handler (an `HttpApp`) to mount on any server;
 * - `EndpointServer.layerServer(options)` serves it on `node:http` (port 0 picks a free port, see
 *   `boundPort`), given the `WebPushRouter`; `EndpointServer.layer(options)` also builds the router
 *   with the live `NodeClient`. Both need `Storage`, `EndpointCrypto` and `EventLog`.
 */
import { createServer } from "node:http"
import { NodeHttpServer } from "@effect/platform-node"
import { Cause, Effect, Layer, type Scope } from "effect"
import {
  HttpMiddleware,
  HttpRouter,
  HttpServer,
  type HttpServerError,
  HttpServerRequest,
  HttpServerResponse
} from "effect/http"
import type { EndpointCrypto } from "../crypto/endpoint.ts"
import {
  type ApiError,
  InternalError,
  InvalidRouterType,
  MethodNotAllowed,
  RouteNotFound,
  toErrorResponse
} from "../domain/errors.ts"
import type { EventLog } from "../observability/EventLog.ts"
import { NodeClient } from "../routers/NodeClient.ts"
import { WebPushRouter } from "../routers/webpush.ts"
import type { Storage } from "../storage/Storage.ts"
import { endpointInstrumentation } from "../observability/endpoint.ts"
import { makeHealthHandlers, metricsResponse } from "./health.ts"
import type { EndpointOptions } from "./options.ts"
import { makeWebPushHandlers } from "./webpush.ts"

/** A request handler: what a server runs for each request. */
export type HttpApp = Effect.Effect<HttpServerResponse.HttpServerResponse, never, HttpServerRequest.HttpServerRequest | Scope.Scope>

/** The services the endpoint handlers use. */
export type EndpointServices = Storage | EndpointCrypto | WebPushRouter | EventLog

/** The §2.5 error response of an API error. */
export const errorResponse = (error: ApiError): HttpServerResponse.HttpServerResponse => {
  const { status, headers, body } = toErrorResponse(error)
  return HttpServerResponse.jsonUnsafe(body, { status, headers })
}

/** CORS (§2.1): any origin and header, DELETE/GET/POST/PUT, preflights cached 1 h, `Location` and `TTL` readable. */
export const endpointCors = HttpMiddleware.cors({
  allowedMethods: ["DELETE", "GET", "POST", "PUT"],
  exposedHeaders: ["location", "ttl"],
  maxAge: 3600
})

/** Endpoint tokens (140–184 chars) and message ids (≈ 200–230) are longer than the router's default limit. */
const ROUTER_CONFIG = { maxParamLength: 1024 }

type Handler = Effect.Effect<HttpServerResponse.HttpServerResponse, ApiError, HttpServerRequest.HttpServerRequest | HttpRouter.RouteContext>

const METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "QUERY"] as const
type Method = (typeof METHODS)[number]

const methodNotAllowed: Handler = Effect.fail(new MethodNotAllowed())

/** A path with handlers for some methods; every other method answers 405 (HEAD follows GET, OPTIONS is CORS). */
const resource = (path: `/${string}`, handlers: Partial<Record<Method, Handler>>) =>
  METHODS.map((method) => HttpRouter.route(method, path, handlers[method] ?? methodNotAllowed))

const param = (params: Readonly<Record<string, string | undefined>>, name: string): string => params[name] ?? ""

/** Bridge registration (§2.7) comes with the bridges; until then every router type is refused with 400/108. */
const noBridges: Handler = Effect.fail(new InvalidRouterType())

/** Methods some route answers; any other method is refused (405) wherever it is sent. */
const KNOWN_METHODS: ReadonlySet<string> = new Set([...METHODS, "HEAD", "OPTIONS"])

const toApiError = (error: ApiError | HttpServerError.HttpServerError): ApiError =>
  error._tag !== "HttpServerError" ? error
  : error.reason._tag !== "RouteNotFound" ? new InternalError({ cause: error })
  : KNOWN_METHODS.has(error.reason.request.method) ? new RouteNotFound()
  : new MethodNotAllowed()

/** The edge: typed errors through the one mapping (each also given to `onError`); defects logged and answered 500/999. */
const respondToFailures = <R>(
  app: Effect.Effect<HttpServerResponse.HttpServerResponse, ApiError | HttpServerError.HttpServerError, R>,
  onError: (error: ApiError) => void = () => {}
): Effect.Effect<HttpServerResponse.HttpServerResponse, never, R> =>
  app.pipe(
    Effect.catchCause((cause) => {
      const failure = Cause.findErrorOption(cause)
      if (failure._tag === "Some") {
        const error = toApiError(failure.value)
        onError(error)
        return error._tag === "InternalError"
          ? Effect.logError("request failed", error.cause).pipe(Effect.as(errorResponse(error)))
          : Effect.succeed(errorResponse(error))
      }
      if (Cause.hasInterruptsOnly(cause)) return Effect.failCause(cause as Cause.Cause<never>)
      const internal = new InternalError({ cause: Cause.squash(cause) })
      onError(internal)
      return Effect.logError("request failed unexpectedly", cause).pipe(Effect.as(errorResponse(internal)))
    })
  )

/**
 * The endpoint's request handler, with CORS and error mapping applied. When `Metrics` is provided
 * (the observability layer) it also serves `GET /metrics` and records request and routing metrics.
 */
export const makeEndpointApp = (
  options: EndpointOptions
): Effect.Effect<HttpApp, never, EndpointServices | Scope.Scope> =>
  Effect.gen(function*() {
    const observe = yield* endpointInstrumentation
    const routes = HttpRouter.use((router) =>
      Effect.gen(function*() {
        const webpush = yield* (observe === undefined
          ? makeWebPushHandlers(options)
          : observe.withRouting(makeWebPushHandlers(options)))
        const health = yield* makeHealthHandlers(options)
        const send: Handler = Effect.gen(function*() {
          const params = yield* HttpRouter.params
          const request = yield* HttpServerRequest.HttpServerRequest
          return yield* webpush.send(request, params["version"], param(params, "token"))
        })
        const cancel: Handler = Effect.flatMap(HttpRouter.params, (params) => webpush.cancel(param(params, "messageId")))
        const registration = "/v1/:routerType/:appId/registration"
        yield* router.addAll([
          ...resource("/wpush/:version/:token", { POST: send }),
          ...resource("/wpush/:token", { POST: send }),
          ...resource("/m/:messageId", { DELETE: cancel }),
          ...resource(registration, { POST: noBridges }),
          ...resource(`${registration}/:uaid`, { GET: noBridges, PUT: noBridges, DELETE: noBridges }),
          ...resource(`${registration}/:uaid/subscription`, { POST: noBridges }),
          ...resource(`${registration}/:uaid/subscription/:chid`, { DELETE: noBridges }),
          ...resource("/health", { GET: health.health }),
          ...resource("/__heartbeat__", { GET: health.health }),
          ...resource("/__lbheartbeat__", { GET: health.lbHeartbeat }),
          ...resource("/__version__", { GET: health.version }),
          ...resource("/status", { GET: health.status }),
          ...resource("/__error__", { GET: health.logCheck }),
          ...resource("/v1/err", { GET: health.logCheck }),
          ...(observe === undefined ? [] : resource("/metrics", { GET: metricsResponse(observe.metrics) }))
        ])
      })
    )
    const app = yield* HttpRouter.toHttpEffect(routes).pipe(Effect.provideService(HttpRouter.RouterConfig, ROUTER_CONFIG))
    if (observe === undefined) return endpointCors(respondToFailures(app))
    return observe.instrument(endpointCors(respondToFailures(app, observe.onError)))
  })

/** The port the server listens on (useful with port 0). */
export const boundPort: Effect.Effect<number, never, HttpServer.HttpServer> = Effect.map(
  Effect.service(HttpServer.HttpServer),
  (server) => (server.address._tag === "UnixPathAddress" ? 0 : server.address.port)
)

export const EndpointServer = {
  /** Serve the endpoint on `node:http` at `options.port` / `options.bindHost`; exposes the `HttpServer`. */
  layerServer: (options: EndpointOptions) =>
    Layer.unwrap(Effect.map(makeEndpointApp(options), (app) => HttpServer.serve(app))).pipe(
      // The platform's request spans record URLs and headers (endpoint tokens, message ids, keys):
      // the endpoint's own spans (`observability/tracing.ts`) carry only what may leave the service.
      Layer.provide(Layer.succeed(HttpMiddleware.TracerDisabledWhen)(() => true)),
      Layer.provideMerge(NodeHttpServer.layerServer(createServer, {
        port: options.port,
        host: options.bindHost,
        // On shutdown, requests in flight get this long to finish.
        gracefulShutdownTimeout: options.shutdownTimeoutMs ?? 10_000
      }))
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
