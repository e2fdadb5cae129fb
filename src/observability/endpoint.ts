/**
 * The endpoint node's request instrumentation: `request.in_flight`, `request.time{route,status}`,
 * `request.error{errno,status}`, and the `max_in_flight_requests` gate. (What became of each message
 * is the `notification.routed.1` event the push handler records where routing is decided.)
 */
import * as Effect from "effect/Effect"
import type * as Scope from "effect/Scope"
import * as HttpServerRequest from "effect/http/HttpServerRequest"
import * as HttpServerResponse from "effect/http/HttpServerResponse"
import { type ApiError, Overloaded, toErrorResponse } from "../domain/errors.ts"
import { METRICS } from "./catalog.ts"
import { handlesBy, Metrics, type MetricsService, type Timer } from "./Metrics.ts"

/** Coarse route of a request path (a bounded label). */
export const routeLabel = (url: string): string =>
  url.startsWith("/wpush/") ? "push"
  : url.startsWith("/m/") ? "message"
  : url.startsWith("/receipts") ? "receipts"
  : url.startsWith("/v1/err") ? "health"
  : url.startsWith("/v1/broadcasts") ? "broadcasts"
  : url.startsWith("/v1/") ? "registration"
  : url.startsWith("/_matrix/") ? "matrix"
  : url === "/metrics" ? "metrics"
  : /^\/(health|status|__heartbeat__|__lbheartbeat__|__version__|__error__)(\?|$)/.test(url) ? "health"
  : "other"

interface EndpointInstrumentation {
  readonly metrics: MetricsService
  /** Count an error response. */
  readonly onError: (error: ApiError) => void
  /**
   * A request starts: its start time, or undefined when `maxInFlight` requests are in hand (it is
   * then to be answered 503/201 at once, without being read; the error is counted here).
   */
  readonly begin: (maxInFlight: number) => number | undefined
  /** A begun request was answered with `status` (or, with undefined, not at all). */
  readonly end: (start: number, url: string, status: number | undefined) => void
  /** `begin` and `end` around a whole request handler of the platform's server. */
  readonly instrument: <E, R>(
    app: Effect.Effect<HttpServerResponse.HttpServerResponse, E, R>,
    maxInFlight: number
  ) => Effect.Effect<HttpServerResponse.HttpServerResponse, E, R | HttpServerRequest.HttpServerRequest>
  /** No longer report `request.in_flight`. */
  readonly close: () => void
}

const makeEndpointInstrumentation = (metrics: MetricsService): EndpointInstrumentation => {
  let handling = 0
  // Read when it is reported (a scrape, a statsd flush), not updated by every request.
  const close = metrics.sampled(METRICS.inFlight.name, {}, () => handling)
  const requestTime = handlesBy((key): Timer => {
    const at = key.indexOf(" ")
    return metrics.timer(METRICS.requestTime.name, { route: key.slice(0, at), status: key.slice(at + 1) })
  })
  const requestError = handlesBy((key) => {
    const at = key.indexOf(" ")
    return metrics.counter(METRICS.requestError.name, { errno: key.slice(0, at), status: key.slice(at + 1) })
  })
  const overloaded = toErrorResponse(new Overloaded())
  const begin = (maxInFlight: number): number | undefined => {
    if (handling >= maxInFlight) {
      requestError(`${overloaded.body.errno} ${overloaded.status}`).inc()
      return undefined
    }
    handling++
    return performance.now()
  }
  const end = (start: number, url: string, status: number | undefined): void => {
    handling--
    if (status !== undefined) requestTime(`${routeLabel(url)} ${status}`).record(performance.now() - start)
  }
  return {
    metrics,
    onError: (error) => {
      const { status, body } = toErrorResponse(error)
      requestError(`${body.errno ?? "none"} ${status}`).inc()
    },
    begin,
    end,
    instrument: (app, maxInFlight) =>
      Effect.flatMap(Effect.service(HttpServerRequest.HttpServerRequest), (request) => {
        const start = begin(maxInFlight)
        if (start === undefined) {
          return Effect.succeed(HttpServerResponse.jsonUnsafe(overloaded.body, {
            status: overloaded.status,
            headers: { ...overloaded.headers, connection: "close" }
          }))
        }
        return app.pipe(
          Effect.onExit((exit) => Effect.sync(() => end(start, request.url, exit._tag === "Success" ? exit.value.status : undefined)))
        )
      }),
    close
  }
}

/** The endpoint's instrumentation over the node's `Metrics`, for the scope. */
export const endpointInstrumentation: Effect.Effect<EndpointInstrumentation, never, Metrics | Scope.Scope> = Effect.acquireRelease(
  Effect.map(Effect.service(Metrics), makeEndpointInstrumentation),
  (instrumentation) => Effect.sync(instrumentation.close)
)
