/**
 * A private listener for Prometheus scrapes (`GET /metrics`), apart from the endpoint node's public
 * port: a separate endpoint node opens it on `metrics_port` (bound to `private_bind_host`); the
 * all-in-one and connection nodes serve `/metrics` on their router port instead.
 */
import { createServer } from "node:http"
import * as Context from "effect/Context"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { sendError } from "../platform/raw-http.ts"
import { listen } from "../platform/listen.ts"
import { DEFAULT_SOCKET_LIMITS } from "../platform/socket-limits.ts"
import { MethodNotAllowed, RouteNotFound } from "../domain/errors.ts"
import type { StartupError } from "../platform/startup.ts"
import { answerSocketErrors } from "../platform/raw-http.ts"
import { Metrics, PROMETHEUS_CONTENT_TYPE } from "./Metrics.ts"

export class MetricsListener extends Context.Service<MetricsListener, {
  /** The bound port (useful when configured as 0). */
  readonly port: number
}>()("autopush/observability/MetricsListener") {
  static readonly layer = (options: {
    readonly port: number
    readonly host: string
    /** A request's headers must arrive within this long (408 otherwise); default 10 s. */
    readonly clientRequestTimeoutMs?: number | undefined
  }): Layer.Layer<MetricsListener, StartupError, Metrics> =>
    Layer.effect(
      MetricsListener,
      Effect.gen(function*() {
        const metrics = yield* Metrics
        const timeout = options.clientRequestTimeoutMs ?? DEFAULT_SOCKET_LIMITS.requestTimeoutMs
        const server = answerSocketErrors(createServer({
          headersTimeout: timeout,
          requestTimeout: timeout + 1_000,
          // Node checks both only this often (30 s by default).
          connectionsCheckingInterval: Math.min(1_000, timeout)
        }, (req, res) => {
          req.resume()
          const path = (req.url ?? "/").split("?", 1)[0]
          if (path !== "/metrics") return sendError(res, new RouteNotFound())
          if (req.method !== "GET" && req.method !== "HEAD") return sendError(res, new MethodNotAllowed())
          let text: string
          try {
            text = metrics.prometheus()
          } catch {
            res.writeHead(500).end()
            return
          }
          res.writeHead(200, { "content-type": PROMETHEUS_CONTENT_TYPE, "content-length": Buffer.byteLength(text) }).end(text)
        }))
        const port = yield* listen(server, options.port, options.host, "metrics_port")
        return MetricsListener.of({ port })
      })
    )
}
