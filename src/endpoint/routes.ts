/**
 * The endpoint's routes on the platform's router: which handler answers each path and method. A
 * handler fails with what went wrong (an `ApiError`, or a `StorageError`), and the error edge
 * (`edge.ts`) answers it. Pushes and receipt subscriptions' GETs spelled plainly are taken before
 * the router sees them (`front.ts`), by the same handlers.
 */
import type { IncomingMessage } from "node:http"
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as HttpRouter from "effect/http/HttpRouter"
import * as HttpServerRequest from "effect/http/HttpServerRequest"
import * as HttpServerResponse from "effect/http/HttpServerResponse"
import { makeConsoleRoutes } from "../console/console.ts"
import { type ApiError, MethodNotAllowed } from "../domain/errors.ts"
import type { makeMatrixGateway } from "../gateway/matrix.ts"
import type { StorageError } from "../storage/Storage.ts"
import { makeBroadcastAdmin } from "./broadcasts.ts"
import { makeErrorsPage } from "./errorsPage.ts"
import { makeHealthHandlers } from "./health.ts"
import { peerOf } from "./http2.ts"
import type { EndpointOptions } from "./options.ts"
import type { RateLimits } from "./rateLimits.ts"
import type { Receipts } from "./receipts.ts"
import { makeRegistrationHandlers, type RegistrationPath } from "./registration.ts"
import type { EmptyAnswer, WebPush } from "./webpush.ts"

/**
 * Endpoint tokens (140–184 chars) and message ids (≈ 200–230) are longer than the router's default
 * limit; a longer one must still reach its route, to be refused as a bad token (404/102), not as an
 * unknown path. (The request line itself is bounded by the server's header size limit.)
 */
export const ROUTER_CONFIG = { maxParamLength: 65_536 }

type Handler = Effect.Effect<
  HttpServerResponse.HttpServerResponse,
  ApiError | StorageError,
  HttpServerRequest.HttpServerRequest | HttpRouter.RouteContext
>

export const METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "QUERY"] as const
type Method = (typeof METHODS)[number]

const methodNotAllowed: Handler = Effect.fail(new MethodNotAllowed())

/** A path with handlers for some methods; every other method answers 405 (HEAD follows GET, OPTIONS is CORS). */
const resource = (path: `/${string}`, handlers: Partial<Record<Method, Handler>>) =>
  METHODS.map((method) => HttpRouter.route(method, path, handlers[method] ?? methodNotAllowed))

/**
 * `handler` after a token of the sender's per-address limit (`rate_limit_per_address`, the pushes'
 * bucket): taken before the request's body, credentials or storage are looked at, 429/116 without one.
 */
const limitedBy = (limits: RateLimits) => (handler: Handler): Handler =>
  Effect.flatMap(HttpServerRequest.HttpServerRequest, (request) => {
    const req = request.source as IncomingMessage
    return Effect.flatMap(Clock.currentTimeMillis, (now) =>
      Effect.andThen(Effect.fromResult(limits.address(peerOf(req), req.headers["x-forwarded-for"], now)), handler))
  })

const param = (params: Readonly<Record<string, string | undefined>>, name: string): string => params[name] ?? ""

const emptyResponse = (answer: EmptyAnswer): HttpServerResponse.HttpServerResponse =>
  HttpServerResponse.empty({ status: answer.status, headers: answer.headers })

/** `POST /wpush/…`, `DELETE` and `GET /m/{id}`, `POST /receipts`. */
const pushHandlers = (webpush: WebPush, receipts: Receipts) => {
  const send: Handler = Effect.gen(function*() {
    const params = yield* HttpRouter.params
    const request = yield* HttpServerRequest.HttpServerRequest
    const pushRequest = webpush.pushRequest(request.source as IncomingMessage)
    return emptyResponse(yield* webpush.push(pushRequest, params["version"], param(params, "token")))
  })
  const cancel: Handler = Effect.flatMap(HttpRouter.params, (params) => Effect.map(webpush.cancel(param(params, "messageId")), emptyResponse))
  const messageStatus: Handler = Effect.gen(function*() {
    const params = yield* HttpRouter.params
    const request = yield* HttpServerRequest.HttpServerRequest
    return HttpServerResponse.jsonUnsafe(yield* receipts.status(param(params, "messageId"), request.source as IncomingMessage))
  })
  const subscribeReceipts: Handler = Effect.flatMap(HttpServerRequest.HttpServerRequest, (request) =>
    Effect.map(receipts.subscribe(request.source as IncomingMessage), emptyResponse))
  return { send, cancel, messageStatus, subscribeReceipts }
}

/** A registration handler given the request and the path's parameters. */
const registrationRoute = (
  handler: (request: HttpServerRequest.HttpServerRequest, path: RegistrationPath) => Effect.Effect<HttpServerResponse.HttpServerResponse, ApiError | StorageError>
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

/** A broadcast admin handler given the request and the broadcast id (`{id}` or `{id}/{name}`). */
const withBroadcastId = (handle: (request: HttpServerRequest.HttpServerRequest, id: string) => Handler): Handler =>
  Effect.gen(function*() {
    const params = yield* HttpRouter.params
    const id = params["name"] === undefined ? param(params, "id") : `${param(params, "id")}/${params["name"]}`
    return yield* handle(yield* HttpServerRequest.HttpServerRequest, id)
  })

/**
 * The route table, with the Matrix gateway's routes and the console's (when it is on). Every route
 * that reads a body, a credential or storage takes a token of the sender's per-address limit first
 * (pushes, receipts and message status in their handlers, the others here); the health, version
 * and error-reference routes answer from memory (the storage status is cached: `health.ts`).
 */
export const makeRoutes = (
  options: EndpointOptions,
  webpush: WebPush,
  receipts: Receipts,
  matrix: Effect.Success<ReturnType<typeof makeMatrixGateway>>,
  limits: RateLimits
) =>
  HttpRouter.use((router) =>
    Effect.gen(function*() {
      const errorsPage = makeErrorsPage()
      const health = yield* makeHealthHandlers(options)
      const bridged = yield* makeRegistrationHandlers(options)
      const push = pushHandlers(webpush, receipts)
      const admin = yield* makeBroadcastAdmin(options.broadcastAdminTokens ?? [])
      const listBroadcasts: Handler = Effect.flatMap(HttpServerRequest.HttpServerRequest, admin.list)
      const consoleRoutes = options.console === undefined ? [] : yield* makeConsoleRoutes(options.console, webpush.senderWarnings.reports)
      const registration = "/v1/:routerType/:appId/registration"
      const limited = limitedBy(limits)
      yield* router.addAll([
        ...resource("/wpush/:version/:token", { POST: push.send }),
        ...resource("/wpush/:token", { POST: push.send }),
        ...resource("/m/:messageId", { DELETE: limited(push.cancel), GET: push.messageStatus }),
        ...resource("/receipts", { POST: push.subscribeReceipts }),
        // GET is answered in front (`front.ts`); other methods get 405 here.
        ...resource("/receipts/:id", {}),
        ...resource(registration, { POST: limited(registrationRoute(bridged.register)) }),
        ...resource(`${registration}/:uaid`, {
          GET: limited(registrationRoute(bridged.channels)),
          PUT: limited(registrationRoute(bridged.update)),
          DELETE: limited(registrationRoute(bridged.unregister))
        }),
        ...resource(`${registration}/:uaid/subscription`, { POST: limited(registrationRoute(bridged.subscribe)) }),
        ...resource(`${registration}/:uaid/subscription/:chid`, { DELETE: limited(registrationRoute(bridged.unsubscribe)) }),
        ...resource("/v1/broadcasts", { GET: limited(listBroadcasts) }),
        // Ids like remote-settings/monitor_changes: one `/` as it is, or any percent-encoded.
        ...resource("/v1/broadcasts/:id", { PUT: limited(withBroadcastId(admin.put)), DELETE: limited(withBroadcastId(admin.remove)) }),
        ...resource("/v1/broadcasts/:id/:name", { PUT: limited(withBroadcastId(admin.put)), DELETE: limited(withBroadcastId(admin.remove)) }),
        ...resource("/health", { GET: health.health }),
        ...resource("/__heartbeat__", { GET: health.health }),
        ...resource("/__lbheartbeat__", { GET: health.lbHeartbeat }),
        ...resource("/errors", { GET: Effect.succeed(errorsPage) }),
        ...resource("/__version__", { GET: health.version }),
        ...resource("/status", { GET: health.status }),
        // Each one writes an error log line: limited, so that a flood cannot fill the log.
        ...resource("/__error__", { GET: limited(health.logCheck) }),
        ...resource("/v1/err", { GET: limited(health.logCheck) }),
        // The Matrix push gateway: its own routes and Matrix error JSON under /_matrix/.
        ...matrix.routes,
        ...consoleRoutes
      ])
    })
  )
