/**
 * The Matrix Push Gateway API v1 on the endpoint port, for UnifiedPush: a Matrix homeserver's
 * pusher whose `url` is `{endpoint_url}/_matrix/push/v1/notify` and whose `pushkey` is one of this
 * service's push endpoints gets its notifications pushed to that subscription.
 *
 * - `POST /_matrix/push/v1/notify`: for each device whose pushkey is a push endpoint URL of this
 *   service (parsed and its token decrypted, never fetched: no request leaves the service), the
 *   message `{"notification": {…}}` without `devices` (`matrixRequest.ts`) goes through the push
 *   path in-process (the endpoint's `sendMade`, `endpoint/webpush.ts`: the checks of a push from its
 *   token on, and the same delivery), with the TTL `matrix_gateway_ttl` and the urgency of its `prio`. Answered
 *   `200 {"rejected": [pushkeys]}`, naming the pushkeys that are not ours or that a push would have
 *   answered 404, 410 or 401 (a token that does not decrypt; the user or channel gone; a v2 endpoint,
 *   which only takes pushes signed with its VAPID key), so that the homeserver drops those pushers.
 *   A transient failure of ours (storage, a bridge, the pushkey's rate limit) is answered with an
 *   error instead (5xx or 429), so that the homeserver retries with backoff: the devices that were
 *   pushed meanwhile are not pushed again (below).
 * - Retries: a device given the same `event_id` within `DEDUPE_WINDOW_MS` (10 minutes) of a push of
 *   it is answered as delivered and not pushed twice. The last `DEDUPE_ENTRIES` (50,000) event and
 *   pushkey pairs pushed are kept (as SHA-256 digests, a few MB at most); beyond that many pushes in
 *   10 minutes the oldest are forgotten sooner.
 * - Rate limit: per pushkey (`rate_limit_per_address` and its burst), not per address: one
 *   homeserver sends for all its users.
 * - `GET /_matrix/push/v1/notify`: `{"unifiedpush": {"gateway": "matrix"}}`, UnifiedPush's gateway
 *   discovery (a client asks it at its endpoint's origin to learn that it may use this gateway).
 * - Errors are the Matrix API's JSON (`{"errcode", "error"}`), not autopush's: an unknown path under
 *   `/_matrix/` is 404 `M_UNRECOGNIZED`, another method on the notify path 405 `M_UNRECOGNIZED`, a
 *   body over 64 KiB 413 `M_TOO_LARGE`, a body that is not JSON 400 `M_NOT_JSON`, JSON that is not
 *   a notify request 400 `M_BAD_JSON`. (A bug still reaches the endpoint's error edge: 500, logged
 *   with a request id.)
 * - With `require_vapid` the gateway is off (every `/_matrix/` request is 404 `M_UNRECOGNIZED`): its
 *   messages are not signed by anyone.
 *
 * Counted in `matrix.notify{outcome}`, one per device: delivered, rejected, duplicate or failed.
 */
import { createHash } from "node:crypto"
import type { IncomingMessage } from "node:http"
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as HttpRouter from "effect/http/HttpRouter"
import * as HttpServerRequest from "effect/http/HttpServerRequest"
import * as HttpServerResponse from "effect/http/HttpServerResponse"
import { type ApiError, PayloadTooLarge, toErrorResponse } from "../domain/errors.ts"
import type { Urgency } from "../domain/notification.ts"
import { METRICS } from "../observability/catalog.ts"
import { Metrics } from "../observability/Metrics.ts"
import { RecentMap } from "../platform/memo.ts"
import { type Body, type BodyRefusal, readBody } from "../platform/raw-http.ts"
import {
  type Device,
  isRefusal,
  MAX_MESSAGE_BYTES,
  MAX_NOTIFY_BYTES,
  messageOf,
  NOTIFY_PATH,
  ownEndpointOf,
  parseNotify,
  urgencyOf
} from "./matrixRequest.ts"

/** How long a pushed event is remembered for a pushkey: a homeserver's retries within it are not pushed again. */
export const DEDUPE_WINDOW_MS = 10 * 60 * 1000

/** Event and pushkey pairs remembered at most (the oldest forgotten first). */
export const DEDUPE_ENTRIES = 50_000

/** `matrix_gateway_ttl`'s default: one day (the endpoint's options leave it out when not configured). */
export const DEFAULT_MATRIX_TTL_SECONDS = 86_400

/** Devices of one request pushed at once. */
const CONCURRENCY = 4

/** What the gateway needs to know: the endpoint node's options it goes by. */
export interface MatrixGatewayOptions {
  /** Public base URL of the endpoint node: the pushkeys under it are ours. */
  readonly endpointUrl: string
  /** Largest push body (`max_data_bytes`): a message is made to fit the smaller of it and 4096. */
  readonly maxDataBytes: number
  /** TTL of the messages made (seconds; `matrix_gateway_ttl`). */
  readonly ttlSeconds: number
  /** Off: every `/_matrix/` request is 404 (`require_vapid`: only signed pushes are taken). */
  readonly off: boolean
  /** A request body that stops arriving for this long is answered 408 (ms). */
  readonly idleMs: number
}

/** A message made for a device, as the push path takes it (`MadePush` of `endpoint/acceptPush.ts`). */
export interface GatewayPush {
  readonly body: Buffer
  readonly ttl: number
  readonly urgency: Urgency
}

/** The push path's entry for made messages (the endpoint's `sendMade`): the version segment and token of the pushkey's path. */
export type SendMade = (made: GatewayPush, version: string | undefined, token: string) => Effect.Effect<unknown, ApiError>

/** The rate limit per pushkey: takes a token, answering 0 (go) or the whole seconds until one is back. */
export type TakeToken = (pushkey: string, nowMs: number) => number

/** A failure the homeserver should retry the request for: the error it is answered with. */
interface Retry {
  readonly status: number
  readonly errcode: "M_LIMIT_EXCEEDED" | "M_UNKNOWN"
  readonly error: string
  /** Seconds, when known. */
  readonly retryAfter: string | undefined
}

type Outcome =
  | { readonly _tag: "delivered" }
  | { readonly _tag: "duplicate" }
  | { readonly _tag: "rejected"; readonly pushkey: string }
  | { readonly _tag: "failed"; readonly retry: Retry | undefined }

const DELIVERED: Outcome = { _tag: "delivered" }
const DUPLICATE: Outcome = { _tag: "duplicate" }
const FAILED: Outcome = { _tag: "failed", retry: undefined }

/** A Matrix error answer (`{"errcode", "error"}` and any extra fields). */
export const matrixError = (
  status: number,
  errcode: string,
  error: string,
  headers: Readonly<Record<string, string>> = {},
  extra: Readonly<Record<string, unknown>> = {}
): HttpServerResponse.HttpServerResponse => HttpServerResponse.jsonUnsafe({ errcode, error, ...extra }, { status, headers })

const unrecognized = matrixError(404, "M_UNRECOGNIZED", "Unrecognized request")

/** A body that was not read whole: too large (413), too slow (408) or broken off (400); the connection is closed. */
const bodyRefused = (error: BodyRefusal): HttpServerResponse.HttpServerResponse => {
  const close = { connection: "close" }
  switch (error._tag) {
    case "PayloadTooLarge":
      return matrixError(413, "M_TOO_LARGE", error.message, close)
    case "RequestTimeout":
      return matrixError(408, "M_UNKNOWN", "The request body did not arrive in time", close)
    case "InvalidRequestBody":
      return matrixError(400, "M_UNKNOWN", error.message, close)
  }
}

/**
 * What a device's failed push means for the homeserver: gone for good as a push would say 404, 410
 * or 401 (rejected); worth a retry as 429 or 5xx; anything else (a message a bridge finds too
 * large) is not pushed, and not worth a retry either.
 */
const outcomeOfError = (error: ApiError, pushkey: string): Outcome => {
  const { status, headers, body } = toErrorResponse(error)
  if (status === 404 || status === 410 || status === 401) return { _tag: "rejected", pushkey }
  if (status === 429 || status >= 500) {
    return {
      _tag: "failed",
      retry: { status, errcode: status === 429 ? "M_LIMIT_EXCEEDED" : "M_UNKNOWN", error: body.message, retryAfter: headers["retry-after"] }
    }
  }
  return FAILED
}

/** The answer of a request with a device to retry. */
const retryAnswer = (retry: Retry): HttpServerResponse.HttpServerResponse => {
  const headers = retry.retryAfter === undefined ? {} : { "retry-after": retry.retryAfter }
  const extra = retry.errcode === "M_LIMIT_EXCEEDED" && retry.retryAfter !== undefined ? { retry_after_ms: Number(retry.retryAfter) * 1000 } : {}
  return matrixError(retry.status, retry.errcode, retry.error, headers, extra)
}

const digest = (eventId: string, pushkey: string): string =>
  createHash("sha256").update(eventId).update("\u0000").update(pushkey).digest("base64url")

/** Methods the endpoint's routes are registered for. */
const METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "QUERY"] as const

/** The gateway's routes, over the push path's `sendMade` and the per-pushkey limit `take`. */
export const makeMatrixGateway = Effect.fnUntraced(function*(options: MatrixGatewayOptions, sendMade: SendMade, take: TakeToken) {
  const metrics = yield* Metrics
  const counted = {
    delivered: metrics.counter(METRICS.matrixNotify.name, { outcome: "delivered" }),
    rejected: metrics.counter(METRICS.matrixNotify.name, { outcome: "rejected" }),
    duplicate: metrics.counter(METRICS.matrixNotify.name, { outcome: "duplicate" }),
    failed: metrics.counter(METRICS.matrixNotify.name, { outcome: "failed" })
  }
  // When each event and pushkey pair was pushed (ms): claimed as its push starts, forgotten if it fails.
  const pushed = new RecentMap<number>(DEDUPE_ENTRIES)
  const ttl = options.ttlSeconds
  const ownEndpoint = ownEndpointOf(options.endpointUrl)
  const maxMessageBytes = Math.min(MAX_MESSAGE_BYTES, options.maxDataBytes)
  const bodyLimits = {
    maxBytes: MAX_NOTIFY_BYTES,
    tooLarge: new PayloadTooLarge({ message: `The request body must be at most ${MAX_NOTIFY_BYTES} bytes` }),
    idleMs: options.idleMs
  }

  const readNotifyBody = (req: IncomingMessage) =>
    Effect.callback<Body>((resume) => readBody(req, bodyLimits, (body) => resume(Effect.succeed(body))))

  /** One device: not ours, a retry already pushed, over its rate limit, or through the push path. */
  const deliver = (device: Device, eventId: string | undefined, made: GatewayPush | undefined, nowMs: number): Effect.Effect<Outcome> => {
    const endpoint = ownEndpoint(device.pushkey)
    if (endpoint === undefined) return Effect.succeed({ _tag: "rejected", pushkey: device.pushkey })
    const key = eventId === undefined ? undefined : digest(eventId, device.pushkey)
    const at = key === undefined ? undefined : pushed.get(key)
    if (at !== undefined && nowMs - at < DEDUPE_WINDOW_MS) return Effect.succeed(DUPLICATE)
    if (made === undefined) return Effect.succeed(FAILED)
    const wait = take(device.pushkey, nowMs)
    if (wait > 0) {
      return Effect.succeed({
        _tag: "failed",
        retry: { status: 429, errcode: "M_LIMIT_EXCEEDED", error: `Too many notifications for this pushkey, retry after ${wait} s`, retryAfter: String(wait) }
      })
    }
    if (key !== undefined) pushed.set(key, nowMs)
    return sendMade(made, endpoint.version, endpoint.token).pipe(
      Effect.onError(() => Effect.sync(() => key !== undefined && pushed.delete(key))),
      Effect.as(DELIVERED),
      Effect.catch((error: ApiError) => Effect.succeed(outcomeOfError(error, device.pushkey)))
    )
  }

  const notify = Effect.gen(function*() {
    const request = yield* HttpServerRequest.HttpServerRequest
    const body = yield* readNotifyBody(request.source as IncomingMessage)
    if (body._tag === "Refused") return bodyRefused(body.error)
    const parsed = parseNotify(body.bytes)
    if (isRefusal(parsed)) return matrixError(400, parsed.errcode, parsed.error)
    const nowMs = yield* Clock.currentTimeMillis
    const message = messageOf(parsed, maxMessageBytes)
    if (message === undefined) yield* Effect.logWarning("matrix notification too large to push, even without its optional fields")
    const made = message === undefined ? undefined : { body: message, ttl, urgency: urgencyOf(parsed.prio) }
    const outcomes = yield* Effect.forEach(parsed.devices, (device) => deliver(device, parsed.eventId, made, nowMs), { concurrency: CONCURRENCY })
    const tally = { delivered: 0, rejected: 0, duplicate: 0, failed: 0 }
    for (const outcome of outcomes) {
      tally[outcome._tag]++
      counted[outcome._tag].inc()
    }
    const retry = outcomes.find((o): o is Extract<Outcome, { _tag: "failed" }> => o._tag === "failed" && o.retry !== undefined)?.retry
    yield* Effect.logDebug("matrix notify").pipe(Effect.annotateLogs({ devices: outcomes.length, ...tally }))
    if (retry !== undefined) {
      yield* Effect.logInfo("matrix notify answered with an error, for the homeserver to retry").pipe(
        Effect.annotateLogs({ status: retry.status, errcode: retry.errcode, reason: retry.error })
      )
      return retryAnswer(retry)
    }
    const rejected = [...new Set(outcomes.flatMap((o) => (o._tag === "rejected" ? [o.pushkey] : [])))]
    return HttpServerResponse.jsonUnsafe({ rejected })
  })

  const discovery = HttpServerResponse.jsonUnsafe({ unifiedpush: { gateway: "matrix" } })
  const methodNotAllowed = matrixError(405, "M_UNRECOGNIZED", "Unrecognized request: use POST (or GET for discovery)")
  const handlerOf = (method: (typeof METHODS)[number]) =>
    options.off ? Effect.succeed(unrecognized)
    : method === "GET" ? Effect.succeed(discovery)
    : method === "POST" ? notify
    : Effect.succeed(methodNotAllowed)

  return {
    routes: [
      ...METHODS.map((method) => HttpRouter.route(method, NOTIFY_PATH, handlerOf(method))),
      HttpRouter.route("*", "/_matrix/*", Effect.succeed(unrecognized))
    ]
  }
})
