/**
 * The Matrix Push Gateway API v1 on the endpoint port, for UnifiedPush: a Matrix homeserver's
 * pusher whose `url` is `{endpoint_url}/_matrix/push/v1/notify` and whose `pushkey` is one of this
 * service's push endpoints gets its notifications pushed to that subscription.
 *
 * - `POST /_matrix/push/v1/notify`, in this order, each step's work linear in the request's size:
 *   1. the sender's per-address limit (the endpoint's `rate_limit_per_address`, shared with its
 *      pushes; the address as `trusted_proxies` tell it), before the body is read: 429
 *      `M_LIMIT_EXCEEDED`;
 *   2. the body read (at most 64 KiB) and parsed (`matrixRequest.ts`): at most `MAX_DEVICES` (64)
 *      devices, nesting at most `MAX_NESTING` deep;
 *   3. the message `{"notification": {…}}` without `devices`, shrunk to 4096 bytes in one pass;
 *   4. each pushkey read once as a push endpoint URL (never fetched: no request leaves the service)
 *      and its token opened with our key: the subscription (uaid and channel) it names. Its scheme
 *      and host are not looked at: this server answers on more origins than `endpoint_url` (a TLS
 *      proxy in front, an address for a name), and only a token made with our key opens, so the
 *      origin adds nothing to what the token proves. Pushkeys naming one subscription, however
 *      spelled, are one target: pushed once, one rate limit, one de-duplication;
 *   5. each target through the push path in-process (the endpoint's `sendMade`,
 *      `endpoint/webpush.ts`: the checks of a push from its token on, and the same delivery), with
 *      the TTL `matrix_gateway_ttl` and the urgency of its `prio`.
 *   Answered `200 {"rejected": [pushkeys]}`, naming the pushkeys that are not ours (not a push
 *   endpoint URL, a token that does not open) or that a push would have answered 404, 410 or 401
 *   (the user or channel gone; a v2 endpoint, which only takes pushes signed with its VAPID key), so
 *   that the homeserver drops those pushers. A transient failure of ours (storage, a bridge, a
 *   subscription's rate limit) is answered with an error instead (5xx or 429), so that the
 *   homeserver retries with backoff: the targets that were pushed meanwhile are not pushed again
 *   (below).
 * - Retries: a subscription given the same `event_id` within `DEDUPE_WINDOW_MS` (10 minutes) of a
 *   push of it is answered as delivered and not pushed twice. The last `DEDUPE_ENTRIES` (50,000)
 *   event and subscription pairs pushed are kept (as SHA-256 digests, a few MB at most); beyond that
 *   many pushes in 10 minutes the oldest are forgotten sooner.
 * - Rate limits: per address as above, and per subscription: the push path's
 *   (`rate_limit_per_subscription`, one bucket per subscription whoever sends to it), so that one
 *   homeserver sending for all its users cannot flood one user's device.
 * - `GET /_matrix/push/v1/notify`: `{"unifiedpush": {"gateway": "matrix"}}`, UnifiedPush's gateway
 *   discovery (a client asks it at its endpoint's origin to learn that it may use this gateway).
 * - Errors are the Matrix API's JSON (`{"errcode", "error"}`), not autopush's: an unknown path under
 *   `/_matrix/` is 404 `M_UNRECOGNIZED`, another method on the notify path 405 `M_UNRECOGNIZED`, a
 *   body over 64 KiB or more than 64 devices 413 `M_TOO_LARGE`, a body that is not JSON 400
 *   `M_NOT_JSON`, JSON that is not a notify request 400 `M_BAD_JSON`. (A bug still reaches the
 *   endpoint's error edge: 500, logged with a request id.)
 * - Logged at info, within `LOG_LINES` a minute (a flood cannot flood the log): each refused
 *   request with its status and reason, and each rejected pushkey once with its reason, by its
 *   opaque id (a pushkey holds an endpoint token, a capability to push).
 * - With `require_vapid` the gateway is off (every `/_matrix/` request is 404 `M_UNRECOGNIZED`): its
 *   messages are not signed by anyone.
 *
 * Counted in `matrix.notify{outcome}`, one per device: delivered, rejected, duplicate (a retry, or
 * another spelling of a subscription in the same request) or failed.
 */
import { createHash } from "node:crypto"
import type { IncomingMessage } from "node:http"
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as Result from "effect/Result"
import * as HttpRouter from "effect/http/HttpRouter"
import * as HttpServerRequest from "effect/http/HttpServerRequest"
import * as HttpServerResponse from "effect/http/HttpServerResponse"
import { EndpointCrypto } from "../crypto/endpoint.ts"
import { type ApiError, PayloadTooLarge, type RateLimited, toErrorResponse } from "../domain/errors.ts"
import type { Urgency } from "../domain/notification.ts"
import { METRICS } from "../observability/catalog.ts"
import { Metrics } from "../observability/Metrics.ts"
import { opaqueId } from "../observability/opaque.ts"
import { RecentMap } from "../platform/memo.ts"
import { type Body, type BodyRefusal, readBody } from "../platform/raw-http.ts"
import {
  isRefusal,
  MAX_MESSAGE_BYTES,
  MAX_NOTIFY_BYTES,
  messageOf,
  NOTIFY_PATH,
  parseNotify,
  pushEndpointOf,
  urgencyOf
} from "./matrixRequest.ts"

/** How long a pushed event is remembered for a subscription: a homeserver's retries within it are not pushed again. */
export const DEDUPE_WINDOW_MS = 10 * 60 * 1000

/** Event and subscription pairs remembered at most (the oldest forgotten first). */
export const DEDUPE_ENTRIES = 50_000

/** `matrix_gateway_ttl`'s default: one day (the endpoint's options leave it out when not configured). */
export const DEFAULT_MATRIX_TTL_SECONDS = 86_400

/** Subscriptions of one request pushed at once. */
const CONCURRENCY = 4

/** Lines about refused requests and rejected pushkeys written per `LOG_WINDOW_MS` at most; the next line written says how many were left out. */
export const LOG_LINES = 60
const LOG_WINDOW_MS = 60_000

/** Rejected pushkeys remembered as logged (by opaque id): each is logged once, not on every retry. */
const LOGGED_PUSHKEYS = 10_000

/** What the gateway needs to know: the endpoint node's options it goes by. */
export interface MatrixGatewayOptions {
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

/** The endpoint's limits as the gateway applies them. */
export interface GatewayLimits {
  /**
   * The per-address limit of the endpoint's routes for the sender of `request` (its peer, or behind
   * a listed proxy the `X-Forwarded-For` client), taken before the body is read.
   */
  readonly address: (request: IncomingMessage, nowMs: number) => Result.Result<void, RateLimited>
}

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
  | { readonly _tag: "rejected"; readonly reason: string }
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

/** A refused request: its status, Matrix error and reason, and whether its connection is closed. */
interface Refusal {
  readonly status: number
  readonly errcode: string
  readonly error: string
  readonly close: boolean
  readonly headers?: Readonly<Record<string, string>>
  readonly extra?: Readonly<Record<string, unknown>>
}

const refusalAnswer = (refusal: Refusal): HttpServerResponse.HttpServerResponse =>
  matrixError(refusal.status, refusal.errcode, refusal.error, { ...refusal.headers, ...(refusal.close ? { connection: "close" } : {}) }, refusal.extra)

/** A body that was not read whole: too large (413), too slow (408) or broken off (400); the connection is closed. */
const bodyRefusal = (error: BodyRefusal): Refusal => {
  switch (error._tag) {
    case "PayloadTooLarge":
      return { status: 413, errcode: "M_TOO_LARGE", error: error.message, close: true }
    case "RequestTimeout":
      return { status: 408, errcode: "M_UNKNOWN", error: "The request body did not arrive in time", close: true }
    case "InvalidRequestBody":
      return { status: 400, errcode: "M_UNKNOWN", error: error.message, close: true }
  }
}

/** A sender over its per-address limit: 429, its body left unread (the connection is closed). */
const addressRefusal = (limited: RateLimited): Refusal => ({
  status: 429,
  errcode: "M_LIMIT_EXCEEDED",
  error: `Too many requests from this address, retry after ${limited.retryAfter} s`,
  close: true,
  headers: { "retry-after": String(limited.retryAfter) },
  extra: { retry_after_ms: limited.retryAfter * 1000 }
})

/**
 * What a device's failed push means for the homeserver: gone for good as a push would say 404, 410
 * or 401 (rejected); worth a retry as 429 or 5xx; anything else (a message a bridge finds too
 * large) is not pushed, and not worth a retry either.
 */
const outcomeOfError = (error: ApiError): Outcome => {
  const { status, headers, body } = toErrorResponse(error)
  if (status === 404 || status === 410 || status === 401) return { _tag: "rejected", reason: `a push to it is answered ${status}: ${body.message}` }
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

const digest = (eventId: string, subscription: string): string =>
  createHash("sha256").update(eventId).update("\u0000").update(subscription).digest("base64url")

/**
 * A budget of log lines: `take(nowMs)` answers undefined when the line is to be left out (over
 * `lines` in the current window of `windowMs`), else how many were left out before it.
 */
const makeLogBudget = (lines: number, windowMs: number) => {
  let windowStart = Number.NEGATIVE_INFINITY
  let written = 0
  let leftOut = 0
  return (nowMs: number): number | undefined => {
    if (nowMs - windowStart >= windowMs) {
      windowStart = nowMs
      written = 0
    }
    if (written >= lines) {
      leftOut++
      return undefined
    }
    written++
    const before = leftOut
    leftOut = 0
    return before
  }
}

/** The pushkeys of one request that name one subscription, and how the first of them is pushed to. */
interface Target {
  readonly version: string | undefined
  readonly token: string
  readonly pushkeys: Array<string>
}

/** Methods the endpoint's routes are registered for. */
const METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "QUERY"] as const

/** The gateway's routes, over the push path's `sendMade` and the endpoint's `limits`. */
export const makeMatrixGateway = Effect.fnUntraced(function*(options: MatrixGatewayOptions, sendMade: SendMade, limits: GatewayLimits) {
  const metrics = yield* Metrics
  const crypto = yield* EndpointCrypto
  const counted = {
    delivered: metrics.counter(METRICS.matrixNotify.name, { outcome: "delivered" }),
    rejected: metrics.counter(METRICS.matrixNotify.name, { outcome: "rejected" }),
    duplicate: metrics.counter(METRICS.matrixNotify.name, { outcome: "duplicate" }),
    failed: metrics.counter(METRICS.matrixNotify.name, { outcome: "failed" })
  }
  // When each event and subscription pair was pushed (ms): claimed as its push starts, forgotten if it fails.
  const pushed = new RecentMap<number>(DEDUPE_ENTRIES)
  const logBudget = makeLogBudget(LOG_LINES, LOG_WINDOW_MS)
  const loggedPushkeys = new RecentMap<true>(LOGGED_PUSHKEYS)
  const ttl = options.ttlSeconds
  const maxMessageBytes = Math.min(MAX_MESSAGE_BYTES, options.maxDataBytes)
  const bodyLimits = {
    maxBytes: MAX_NOTIFY_BYTES,
    tooLarge: new PayloadTooLarge({ message: `The request body must be at most ${MAX_NOTIFY_BYTES} bytes` }),
    idleMs: options.idleMs
  }

  const readNotifyBody = (req: IncomingMessage) =>
    Effect.callback<Body>((resume) => readBody(req, bodyLimits, (body) => resume(Effect.succeed(body))))

  /** A line within the log budget (annotated with the lines left out before it, if any); nothing beyond it. */
  const logBudgeted = (nowMs: number, line: Effect.Effect<void>): Effect.Effect<boolean> => {
    const leftOut = logBudget(nowMs)
    if (leftOut === undefined) return Effect.succeed(false)
    return Effect.as(leftOut === 0 ? line : Effect.annotateLogs(line, { left_out: leftOut }), true)
  }

  /** A refused request, logged with its reason (within the budget) and answered. */
  const refused = (refusal: Refusal, nowMs: number) =>
    Effect.as(
      logBudgeted(nowMs, Effect.logInfo("matrix notify refused").pipe(Effect.annotateLogs({ status: refusal.status, errcode: refusal.errcode, reason: refusal.error }))),
      refusalAnswer(refusal)
    )

  /** A rejected pushkey, logged once (by its opaque id: pushkeys are capabilities) with why, within the budget. */
  const logRejected = (pushkey: string, reason: string, nowMs: number): Effect.Effect<void> => {
    const id = opaqueId(pushkey)
    if (loggedPushkeys.get(id) !== undefined) return Effect.void
    const line = Effect.logInfo("matrix pushkey rejected: the homeserver will delete its pusher").pipe(Effect.annotateLogs({ pushkey: id, reason }))
    return Effect.map(logBudgeted(nowMs, line), (written) => {
      if (written) loggedPushkeys.set(id, true)
    })
  }

  /**
   * The target of `pushkey` in `targets` (by the subscription it names, added if new), or why it is
   * not a subscription of ours. Its token is opened: scheme and host are not looked at, since the
   * token itself tells (see `pushEndpointOf`).
   */
  const targetOf = (pushkey: string, targets: Map<string, Target>): Target | string => {
    const endpoint = pushEndpointOf(pushkey)
    if (endpoint._tag === "NotPushEndpoint") return endpoint.reason
    const opened = crypto.openEndpoint(endpoint.version === "v2" ? "v2" : "v1", endpoint.token)
    if (Result.isFailure(opened)) return "its token does not open with this server's key (not a subscription of this server)"
    const subscription = `${opened.success.uaid}:${opened.success.channelId}`
    let target = targets.get(subscription)
    if (target === undefined) {
      target = { version: endpoint.version, token: endpoint.token, pushkeys: [] }
      targets.set(subscription, target)
    }
    return target
  }

  /** One subscription: a retry already pushed, or through the push path (which answers its rate limit). */
  const deliver = (subscription: string, target: Target, eventId: string | undefined, made: GatewayPush | undefined, nowMs: number): Effect.Effect<Outcome> => {
    const key = eventId === undefined ? undefined : digest(eventId, subscription)
    const at = key === undefined ? undefined : pushed.get(key)
    if (at !== undefined && nowMs - at < DEDUPE_WINDOW_MS) return Effect.succeed(DUPLICATE)
    if (made === undefined) return Effect.succeed(FAILED)
    if (key !== undefined) pushed.set(key, nowMs)
    return sendMade(made, target.version, target.token).pipe(
      Effect.onError(() => Effect.sync(() => key !== undefined && pushed.delete(key))),
      Effect.as(DELIVERED),
      Effect.catch((error: ApiError) => Effect.succeed(outcomeOfError(error)))
    )
  }

  const notify = Effect.gen(function*() {
    const request = yield* HttpServerRequest.HttpServerRequest
    const source = request.source as IncomingMessage
    const nowMs = yield* Clock.currentTimeMillis
    // Before anything is read: a sender over its limit costs a bucket lookup.
    const byAddress = limits.address(source, nowMs)
    if (Result.isFailure(byAddress)) return yield* refused(addressRefusal(byAddress.failure), nowMs)
    const body = yield* readNotifyBody(source)
    if (body._tag === "Refused") return yield* refused(bodyRefusal(body.error), nowMs)
    const parsed = parseNotify(body.bytes)
    if (isRefusal(parsed)) return yield* refused({ ...parsed, close: false }, nowMs)
    const message = messageOf(parsed, maxMessageBytes)
    if (message === undefined) yield* Effect.logWarning("matrix notification too large to push, even without its optional fields")
    const made = message === undefined ? undefined : { body: message, ttl, urgency: urgencyOf(parsed.prio) }

    // Each pushkey read once, and its token opened: the pushkeys that name one subscription (however
    // spelled) are pushed to once, and share its rate limit and its retries' de-duplication.
    const targets = new Map<string, Target>()
    const read = new Map<string, Target | string>()
    const rejected = new Map<string, string>()
    let unresolved = 0
    for (const { pushkey } of parsed.devices) {
      let known = read.get(pushkey)
      if (known === undefined) {
        known = targetOf(pushkey, targets)
        read.set(pushkey, known)
      }
      if (typeof known === "string") {
        rejected.set(pushkey, known)
        unresolved++
      } else {
        known.pushkeys.push(pushkey)
      }
    }
    const outcomes = yield* Effect.forEach(targets, ([subscription, target]) => deliver(subscription, target, parsed.eventId, made, nowMs), {
      concurrency: CONCURRENCY
    })

    // One count per device: a subscription's other spellings in the request count as duplicates of its push.
    const tally = { delivered: 0, rejected: 0, duplicate: 0, failed: 0 }
    const count = (tag: Outcome["_tag"], n: number) => {
      tally[tag] += n
      if (n > 0) counted[tag].inc(n)
    }
    count("rejected", unresolved)
    let retry: Retry | undefined
    let i = 0
    for (const target of targets.values()) {
      const outcome = outcomes[i++] as Outcome
      const devices = target.pushkeys.length
      if (outcome._tag === "delivered") {
        count("delivered", 1)
        count("duplicate", devices - 1)
      } else {
        count(outcome._tag, devices)
      }
      if (outcome._tag === "rejected") for (const pushkey of target.pushkeys) rejected.set(pushkey, outcome.reason)
      if (outcome._tag === "failed") retry ??= outcome.retry
    }
    yield* Effect.logDebug("matrix notify").pipe(Effect.annotateLogs({ devices: parsed.devices.length, subscriptions: targets.size, ...tally }))
    // The rejected pushkeys, each once, in the order the request named them.
    const answer = new Set<string>()
    for (const { pushkey } of parsed.devices) if (rejected.has(pushkey)) answer.add(pushkey)
    for (const pushkey of answer) yield* logRejected(pushkey, rejected.get(pushkey) as string, nowMs)
    if (retry !== undefined) {
      yield* Effect.logInfo("matrix notify answered with an error, for the homeserver to retry").pipe(
        Effect.annotateLogs({ status: retry.status, errcode: retry.errcode, reason: retry.error })
      )
      return retryAnswer(retry)
    }
    return HttpServerResponse.jsonUnsafe({ rejected: [...answer] })
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
