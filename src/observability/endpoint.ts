/**
 * The endpoint node's instrumentation, on when `Metrics` is provided (the observability layer):
 * - requests: `request.in_flight`, `request.time{route,status}`, `request.error{errno,status}`;
 * - routing: each routed message is recorded as `notification.routed.1` (outcome and time), from
 *   which the metrics sink makes `notification.routed` / `notification.route_time` and the trace
 *   shows the endpoint's half of a direct delivery.
 */
import * as Cause from "effect/Cause"
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as HttpServerRequest from "effect/http/HttpServerRequest"
import * as HttpServerResponse from "effect/http/HttpServerResponse"
import { type ApiError, Overloaded, toErrorResponse } from "../domain/errors.ts"
import { domainEvent, type RouteOutcome } from "../domain/events.ts"
import type { Notification } from "../domain/notification.ts"
import { type Routed, WebPushRouter, type WebPushRouterService } from "../routers/webpush.ts"
import { METRICS } from "./catalog.ts"
import { EventLog, type EventLogService } from "./EventLog.ts"
import { Metrics, type MetricsService, type Timer } from "./Metrics.ts"

/**
 * A router that records `notification.routed.1` for every message it routes (or fails to); a
 * direct attempt on a cached record that the node did not take is not an outcome (the message is
 * routed again, and recorded then).
 */
export const recordRouting = (router: WebPushRouterService, events: EventLogService): WebPushRouterService => {
  const recorded = <A extends Routed | undefined, E>(
    uaid: string,
    notification: Notification,
    routing: Effect.Effect<A, E>
  ): Effect.Effect<A, E> =>
    Effect.suspend(() => {
      const start = performance.now()
      return Effect.onExit(routing, (exit) => {
        const routed = exit._tag === "Success" ? exit.value : undefined
        const outcome: RouteOutcome | undefined = routed?.outcome ?? (exit._tag === "Failure" && Cause.hasFails(exit.cause) ? "failed" : undefined)
        if (outcome === undefined) return Effect.void
        return Effect.map(Clock.currentTimeMillis, (now) =>
          events.record(domainEvent("notification.routed.1", uaid, now, {
            channelId: notification.channelId,
            version: routed?.notification.version ?? notification.version,
            outcome,
            durationMs: Math.round((performance.now() - start) * 1000) / 1000
          })))
      })
    })
  return {
    route: (user, table, notification) => recorded(user.uaid, notification, router.route(user, table, notification)),
    routeDirect: (user, notification) => recorded(user.uaid, notification, router.routeDirect(user, notification))
  }
}

/** Coarse route of a request path (a bounded label). */
export const routeLabel = (url: string): string =>
  url.startsWith("/wpush/") ? "push"
  : url.startsWith("/m/") ? "cancel"
  : url.startsWith("/v1/err") ? "health"
  : url.startsWith("/v1/broadcasts") ? "broadcasts"
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
  let handling = 0
  const overloaded = toErrorResponse(new Overloaded())
  const begin = (maxInFlight: number): number | undefined => {
    if (handling >= maxInFlight) {
      requestError(`${overloaded.body.errno} ${overloaded.status}`).inc()
      return undefined
    }
    handling++
    inFlight.add(1)
    return performance.now()
  }
  const end = (start: number, url: string, status: number | undefined): void => {
    handling--
    inFlight.add(-1)
    if (status !== undefined) requestTime(`${routeLabel(url)} ${status}`).record(performance.now() - start)
  }
  return {
    metrics,
    withRouting: (handlers) =>
      Effect.flatMap(Effect.service(WebPushRouter), (router) =>
        handlers.pipe(Effect.provideService(WebPushRouter, WebPushRouter.of(recordRouting(router, events))))),
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
      })
  }
}

/** The endpoint's instrumentation over the node's `Metrics` and `EventLog`. */
export const endpointInstrumentation: Effect.Effect<EndpointInstrumentation, never, Metrics | EventLog> = Effect.gen(
  function*() {
    return makeEndpointInstrumentation(yield* Metrics, yield* EventLog)
  }
)
