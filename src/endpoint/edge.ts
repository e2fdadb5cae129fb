/**
 * The endpoint's error edge: the one place where a failed request becomes its answer, on the
 * platform's routes (`respondToFailures`) and on the routes in front of them (`front.ts`) alike.
 * Every failure — a validation rule, a storage failure (503/201), an unknown path (404), a known
 * path with another method (405), a bug (500) — is answered with the error JSON of `toErrorResponse`.
 */
import { randomBytes } from "node:crypto"
import * as Cause from "effect/Cause"
import * as Effect from "effect/Effect"
import type * as HttpServerError from "effect/http/HttpServerError"
import * as HttpServerRequest from "effect/http/HttpServerRequest"
import * as HttpServerResponse from "effect/http/HttpServerResponse"
import { type ApiError, InternalError, MethodNotAllowed, RouteNotFound, toErrorResponse } from "../domain/errors.ts"
import { routeLabel } from "../observability/endpoint.ts"
import { type StorageError, storageUnavailable } from "../storage/Storage.ts"
import { METHODS } from "./routes.ts"

/** What a handler may fail with: an API error, a storage failure, or the platform's routing error. */
type Failure = ApiError | StorageError | HttpServerError.HttpServerError

/** The error response (JSON) of an API error. */
const errorResponse = (error: ApiError, extraHeaders: Readonly<Record<string, string>> = {}): HttpServerResponse.HttpServerResponse => {
  const { status, headers, body } = toErrorResponse(error)
  return HttpServerResponse.jsonUnsafe(body, { status, headers: { ...headers, ...extraHeaders } })
}

/** Methods some route answers; any other method is refused (405) wherever it is sent. */
const KNOWN_METHODS: ReadonlySet<string> = new Set([...METHODS, "HEAD", "OPTIONS"])

const toApiError = (error: ApiError | HttpServerError.HttpServerError): ApiError =>
  error._tag !== "HttpServerError" ? error
  : error.reason._tag !== "RouteNotFound" ? new InternalError({ cause: error })
  : KNOWN_METHODS.has(error.reason.request.method) ? new RouteNotFound()
  : new MethodNotAllowed()

/**
 * The API error of a failure. A storage failure is answered 503/201 without its cause, which is
 * logged here (`storageUnavailable`), once per failure; a defect is a bug (500/999).
 */
const apiErrorOf = (cause: Cause.Cause<Failure>): Effect.Effect<ApiError> => {
  const failure = Cause.findErrorOption(cause)
  if (failure._tag === "None") return Effect.succeed(new InternalError({ cause: Cause.squash(cause) }))
  const error = failure.value
  return error._tag === "StorageError" ? Effect.flip(storageUnavailable(error)) : Effect.succeed(toApiError(error))
}

/** Path segments this long may be endpoint tokens, message ids or receipt ids: never logged. */
const OPAQUE_SEGMENT = 24

/** A request's path for a log line: no query, each segment of `OPAQUE_SEGMENT` characters or more elided, the whole at most 200. */
export const loggablePath = (url: string): string => {
  const path = url.split(/[?#]/, 1)[0] ?? ""
  return path.split("/").map((segment) => segment.length >= OPAQUE_SEGMENT ? "…" : segment).join("/").slice(0, 200)
}

/** Answers after which the connection is closed: the request's body was not (fully) read. */
const CLOSES: ReadonlySet<ApiError["_tag"]> = new Set(["RequestTimeout", "PayloadTooLarge"])

/** A failed request's answer: the error, and the headers to answer it with. */
interface FailureAnswer {
  readonly error: ApiError
  readonly headers: Readonly<Record<string, string>>
}

/**
 * The edge: a failed request's error through the one mapping (also given to `onError`), leaving one
 * access-log line (route, status, errno, message — never the path, which carries tokens); a bug or
 * a defect is answered 500/999 with a request id, which its error log line carries too. A path no
 * route answers (404) is logged at debug, with the path, its token-like segments elided: what a
 * browser or a scanner asks for is not news, and "which path?" is the first question. An
 * interruption alone stays one.
 */
export const failureAnswer = (
  cause: Cause.Cause<Failure>,
  method: string,
  url: string,
  onError: (error: ApiError) => void
): Effect.Effect<FailureAnswer> => {
  if (Cause.findErrorOption(cause)._tag === "None" && Cause.hasInterruptsOnly(cause)) return Effect.failCause(cause as Cause.Cause<never>)
  return Effect.flatMap(apiErrorOf(cause), (error): Effect.Effect<FailureAnswer> => {
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
    const answer = { error, headers: CLOSES.has(error._tag) ? { connection: "close" } : {} }
    if (error._tag === "RouteNotFound") {
      return Effect.logDebug("request rejected").pipe(
        Effect.annotateLogs({ method, route, path: loggablePath(url), status, errno: body.errno, reason: body.message }),
        Effect.as(answer)
      )
    }
    return Effect.logInfo("request rejected").pipe(
      Effect.annotateLogs({ method, route, status, errno: body.errno, reason: body.message }),
      Effect.as(answer)
    )
  })
}

/** `app` with its failures answered by `failureAnswer`. */
export const respondToFailures = <R>(
  app: Effect.Effect<HttpServerResponse.HttpServerResponse, Failure, R>,
  onError: (error: ApiError) => void
): Effect.Effect<HttpServerResponse.HttpServerResponse, never, R | HttpServerRequest.HttpServerRequest> =>
  app.pipe(
    Effect.catchCause((cause) =>
      Effect.flatMap(HttpServerRequest.HttpServerRequest, (request) =>
        Effect.map(failureAnswer(cause, request.method, request.url, onError), ({ error, headers }) => errorResponse(error, headers))))
  )
