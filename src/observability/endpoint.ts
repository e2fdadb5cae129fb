/**
 * The endpoint node's instrumentation, on when `Metrics` is provided (the observability layer):
 * - requests: `request.in_flight`, `request.time{route,status}`, `request.error{errno,status}`;
 * - routing: each routed message is recorded as `notification.routed.1` (outcome and time), from
 *   which the metrics sink makes `notification.routed` / `notification.route_time` and the trace
 *   shows the endpoint's half of a direct delivery.
 */
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as HttpServerRequest from "effect/http/HttpServerRequest"
import * as HttpServerResponse from "effect/http/HttpServerResponse"
import { type ApiError, Overloaded, toErrorResponse } from "../domain/errors.ts"
import { domainEvent, type RouteOutcome } from "../domain/events.ts"
import { WebPushRouter, type WebPushRouterService } from "../routers/webpush.ts"
import { METRICS } from "./catalog.ts"
import { EventLog, type EventLogService } from "./EventLog.ts"
import { Metrics, type MetricsService, type Timer } from "./Metrics.ts"

/** A router that records `notification.routed.1` for every message it routes (or fails to). */
export const recordRouting = (router: WebPushRouterService, events: EventLogService): WebPushRouterService => ({
  route: (user, table, notification) =>
    Effect.suspend(() => {
      const start = performance.now()
      const record = (outcome: RouteOutcome, version = notification.version) =>
        Effect.map(Clock.currentTimeMillis, (now) =>
          events.record(domainEvent("notification.routed.1", user.uaid, now, {
            channelId: notification.channelId,
            version,
            outcome,
            durationMs: Math.round((performance.now() - start) * 1000) / 1000
          }))
        )
      return router.route(user, table, notification).pipe(
        Effect.tap((routed) => record(routed.outcome, routed.notification.version)),
        Effect.tapError(() => record("failed"))
      )
    })
})

/** Coarse route of a request path (a bounded label). */
export const routeLabel = (url: string): string =>
  url.startsWith("/wpush/") ? "push"
  : url.startsWith("/m/") ? "cancel"
  : url.startsWith("/v1/err") ? "health"
  : url.startsWith("/v1/") ? "registration"
  : url === "/metrics" ? "metrics"
  : /^\/(health|status|__heartbeat__|__lbheartbeat__|__version__|__error__)(\?|$)/.test(url) ? "health"
  : "other"

export interface EndpointInstrumentation {
  readonly metrics: MetricsService
  /** Run `handlers` with the routing recorded (`recordRouting` over the `WebPushRouter` in context). */
  readonly withRouting: <A, E, R>(handlers: Effect.Effect<A, E, R>) => Effect.Effect<A, E, R | WebPushRouter>
  /** Count an error response. */
  readonly onError: (error: ApiError) => void
  /**
   * In-flight and timing around the whole request handler; with `maxInFlight` requests in hand, a
   * new one is answered 503/201 (Retry-After) at once, without being read.
   */
  readonly instrument: <E, R>(
    app: Effect.Effect<HttpServerResponse.HttpServerResponse, E, R>,
    maxInFlight: number
  ) => Effect.Effect<HttpServerResponse.HttpServerResponse, E, R | HttpServerRequest.HttpServerRequest>
}

const perKey = <H>(make: (key: string) => H) => {
  const handles = new Map<string, H>()
  return (key: string): H => {
    let handle = handles.get(key)
    if (handle === undefined) {
      handle = make(key)
      handles.set(key, handle)
    }
    return handle
  }
}

export const makeEndpointInstrumentation = (metrics: MetricsService, events: EventLogService): EndpointInstrumentation => {
  const inFlight = metrics.gauge(METRICS.inFlight.name)
  const requestTime = perKey((key): Timer => {
    const at = key.indexOf(" ")
    return metrics.timer(METRICS.requestTime.name, { route: key.slice(0, at), status: key.slice(at + 1) })
  })
  const requestError = perKey((key) => {
    const at = key.indexOf(" ")
    return metrics.counter(METRICS.requestError.name, { errno: key.slice(0, at), status: key.slice(at + 1) })
  })
  return {
    metrics,
    withRouting: (handlers) =>
      Effect.flatMap(Effect.service(WebPushRouter), (router) =>
        handlers.pipe(Effect.provideService(WebPushRouter, WebPushRouter.of(recordRouting(router, events))))),
    onError: (error) => {
      const { status, body } = toErrorResponse(error)
      requestError(`${body.errno ?? "none"} ${status}`).inc()
    },
    instrument: (app, maxInFlight) => {
      let handling = 0
      return Effect.flatMap(Effect.service(HttpServerRequest.HttpServerRequest), (request) => {
        if (handling >= maxInFlight) {
          const { status, headers, body } = toErrorResponse(new Overloaded())
          requestError(`${body.errno} ${status}`).inc()
          return Effect.succeed(HttpServerResponse.jsonUnsafe(body, { status, headers: { ...headers, connection: "close" } }))
        }
        const start = performance.now()
        handling++
        inFlight.add(1)
        return app.pipe(
          Effect.onExit((exit) =>
            Effect.sync(() => {
              handling--
              inFlight.add(-1)
              if (exit._tag === "Success") {
                requestTime(`${routeLabel(request.url)} ${exit.value.status}`).record(performance.now() - start)
              }
            })
          )
        )
      })
    }
  }
}

/** The endpoint's instrumentation over the node's `Metrics` and `EventLog`. */
export const endpointInstrumentation: Effect.Effect<EndpointInstrumentation, never, Metrics | EventLog> = Effect.gen(
  function*() {
    return makeEndpointInstrumentation(yield* Metrics, yield* EventLog)
  }
)
