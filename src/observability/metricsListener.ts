/**
 * A private listener for Prometheus scrapes (`GET /metrics`), apart from the endpoint node's public
 * port: a separate endpoint node opens it on `metrics_port` (bound to `private_bind_host`); the
 * all-in-one and connection nodes serve `/metrics` on their router port instead.
 */
import { createServer } from "node:http"
import type { AddressInfo } from "node:net"
import { Context, Effect, Layer } from "effect"
import { listenFailure, MethodNotAllowed, RouteNotFound, type StartupError, toErrorResponse } from "../domain/errors.ts"
import { Metrics, PROMETHEUS_CONTENT_TYPE } from "./Metrics.ts"

export class MetricsListener extends Context.Service<MetricsListener, {
  /** The bound port (useful when configured as 0). */
  readonly port: number
}>()("autopush/observability/MetricsListener") {
  static readonly layer = (options: { readonly port: number; readonly host: string }): Layer.Layer<MetricsListener, StartupError, Metrics> =>
    Layer.effect(
      MetricsListener,
      Effect.gen(function*() {
        const metrics = yield* Metrics
        const server = createServer((req, res) => {
          req.resume()
          const path = (req.url ?? "/").split("?", 1)[0]
          const refuse = (error: RouteNotFound | MethodNotAllowed) => {
            const { status, headers, body } = toErrorResponse(error)
            res.writeHead(status, { ...headers, "content-type": "application/json" }).end(JSON.stringify(body))
          }
          if (path !== "/metrics") return refuse(new RouteNotFound())
          if (req.method !== "GET" && req.method !== "HEAD") return refuse(new MethodNotAllowed())
          let text: string
          try {
            text = metrics.prometheus()
          } catch {
            res.writeHead(500).end()
            return
          }
          res.writeHead(200, { "content-type": PROMETHEUS_CONTENT_TYPE, "content-length": Buffer.byteLength(text) }).end(text)
        })
        const port = yield* Effect.acquireRelease(
          Effect.callback<number, StartupError>((resume) => {
            const failed = (cause: Error) => resume(Effect.fail(listenFailure("metrics_port", options.host, options.port, cause)))
            server.once("error", failed)
            server.listen(options.port, options.host, () => {
              server.off("error", failed)
              resume(Effect.succeed((server.address() as AddressInfo).port))
            })
          }),
          () =>
            Effect.callback<void>((resume) => {
              server.close(() => resume(Effect.void))
              server.closeAllConnections()
            })
        )
        return MetricsListener.of({ port })
      })
    )
}
