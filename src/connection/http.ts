/**
 * Plain `node:http` handling for the connection node's two ports: the private router API
 * (`PUT /push/{uaid}`, `PUT /notif/{uaid}`, `DELETE /notif/{uaid}/{connected_at}`, router port only),
 * the operators' routes (`GET /metrics`, `GET /__trace__/{message_id}`, router port only) and the
 * health routes (both ports). The router API is the per-notification hot path and only hands
 * events to a session's mailbox, so it runs without an HTTP framework in between.
 */
import type { IncomingMessage, ServerResponse } from "node:http"
import { decodeTransportNotification } from "../domain/router-wire.ts"
import { type ApiError, LogCheck, MethodNotAllowed, RouteNotFound, toErrorResponse } from "../domain/errors.ts"
import { parseUaid } from "../domain/ids.ts"
import { PROMETHEUS_CONTENT_TYPE } from "../observability/Metrics.ts"
import type { RouterObservability } from "../observability/observability.ts"
import { versionInfo } from "../observability/version.ts"
import type { NodeRegistryService } from "./registry.ts"

export interface HealthSource {
  /** Storage reachability for `/__heartbeat__`: "OK" or the cause. */
  readonly storageStatus: () => Promise<{ readonly ok: boolean; readonly cause?: string | undefined }>
  readonly logError: (message: string) => void
}

const MAX_BODY = 64 * 1024

export const sendJson = (res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void => {
  const text = JSON.stringify(body)
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(text), ...headers })
  res.end(text)
}

export const sendError = (res: ServerResponse, error: ApiError): void => {
  const { status, headers, body } = toErrorResponse(error)
  sendJson(res, status, body, headers)
}

const sendText = (res: ServerResponse, status: number, text: string): void => {
  res.writeHead(status, { "content-type": "text/plain", "content-length": Buffer.byteLength(text) })
  res.end(text)
}

const readBody = (req: IncomingMessage): Promise<string | undefined> =>
  new Promise((resolve) => {
    const chunks: Array<Buffer> = []
    let size = 0
    req.on("data", (chunk: Buffer) => {
      size += chunk.length
      if (size > MAX_BODY) {
        resolve(undefined)
        req.destroy()
      } else chunks.push(chunk)
    })
    req.on("end", () => resolve(Buffer.concat(chunks).toString("utf8")))
    req.on("error", () => resolve(undefined))
  })

/** Health routes; true when the request was one of them. */
export const handleHealth = (
  req: IncomingMessage,
  res: ServerResponse,
  path: string,
  registry: NodeRegistryService,
  health: HealthSource
): boolean => {
  if (req.method !== "GET" && req.method !== "HEAD") return false
  switch (path) {
    case "/__lbheartbeat__":
      sendText(res, 200, "")
      return true
    case "/__version__":
      sendJson(res, 200, versionInfo)
      return true
    case "/status":
      sendJson(res, 200, { status: "OK", version: versionInfo.version })
      return true
    case "/health":
    case "/__heartbeat__":
      health.storageStatus().then(
        (storage) =>
          sendJson(res, storage.ok ? 200 : 503, {
            status: storage.ok ? "OK" : "ERROR",
            version: versionInfo.version,
            connections: registry.count(),
            storage: storage.ok ? { status: "OK" } : { status: "NOT OK", cause: storage.cause }
          }),
        () => sendJson(res, 503, { status: "ERROR", version: versionInfo.version, connections: registry.count() })
      )
      return true
    case "/__error__":
    case "/v1/err/crit":
      health.logError("Test Critical Message")
      sendError(res, new LogCheck())
      return true
    default:
      return false
  }
}

/**
 * `GET /metrics` (Prometheus text) and `GET /__trace__/{message_id}` (a message's lifecycle, 404
 * once it left the trace window); true when the request was one of them. Absent parts answer 404.
 */
const handleOperators = (
  req: IncomingMessage,
  res: ServerResponse,
  path: string,
  observability: RouterObservability | undefined
): boolean => {
  if (observability === undefined || (req.method !== "GET" && req.method !== "HEAD")) return false
  if (path === "/metrics" && observability.metrics !== undefined) {
    const text = observability.metrics.prometheus()
    res.writeHead(200, { "content-type": PROMETHEUS_CONTENT_TYPE, "content-length": Buffer.byteLength(text) })
    res.end(text)
    return true
  }
  const trace = observability.trace
  if (trace === undefined || !path.startsWith("/__trace__/")) return false
  const encoded = path.slice("/__trace__/".length)
  let id: string | undefined
  try {
    id = decodeURIComponent(encoded)
  } catch {
    id = undefined
  }
  const document = id === undefined || id === "" || id.includes("/") ? undefined : trace.lookup(id)
  if (document === undefined) sendError(res, new RouteNotFound())
  else sendJson(res, 200, document)
  return true
}

/**
 * Router API on the private port, with `/metrics` and `/__trace__/{message_id}` when `observability`
 * is given (see `routerObservability`).
 */
export const handleRouterRequest = (
  req: IncomingMessage,
  res: ServerResponse,
  registry: NodeRegistryService,
  health: HealthSource,
  observability?: RouterObservability
): void => {
  const path = (req.url ?? "/").split("?", 1)[0] as string
  const parts = path.split("/")
  // ["", "push"|"notif", uaid, connected_at?]
  const kind = parts[1]
  if ((kind === "push" || kind === "notif") && parts.length >= 3) {
    const uaid = parseUaid(decodeURIComponent(parts[2] as string))
    if (uaid === undefined || parts.length > 4 || (parts.length === 4 && kind !== "notif")) {
      return sendError(res, new RouteNotFound())
    }
    if (kind === "push" && parts.length === 3 && req.method === "PUT") {
      void readBody(req).then((body) => {
        const decoded = body === undefined ? undefined : decodeTransportNotification(body)
        const traceparent = req.headers["traceparent"]
        const notification = decoded === undefined || typeof traceparent !== "string" ? decoded : { ...decoded, traceparent }
        if (notification === undefined) return sendJson(res, 400, { error: "Invalid notification" })
        // Not here, or its queue is full: 404 makes the endpoint store the message instead.
        registry.deliver(uaid, notification) ? sendText(res, 200, "") : sendText(res, 404, "Client not available")
      })
      return
    }
    if (kind === "notif" && parts.length === 3 && req.method === "PUT") {
      req.resume()
      return registry.checkStorage(uaid) ? sendText(res, 200, "") : sendText(res, 404, "Client not available")
    }
    if (kind === "notif" && parts.length === 4 && req.method === "DELETE") {
      req.resume()
      const connectedAt = Number(parts[3])
      const session = registry.get(uaid)
      if (session !== undefined && session.connectedAt === connectedAt) {
        session.mailbox.offer({ _tag: "Kick", kind: "ghost" })
        return sendText(res, 200, "Terminated duplicate")
      }
      return sendText(res, 404, "Client not available")
    }
    return sendError(res, new MethodNotAllowed())
  }
  if (handleOperators(req, res, path, observability)) return
  if (handleHealth(req, res, path, registry, health)) return
  sendError(res, new RouteNotFound())
}

/** Non-upgrade requests on the public WebSocket port: health only. */
export const handlePublicRequest = (
  req: IncomingMessage,
  res: ServerResponse,
  registry: NodeRegistryService,
  health: HealthSource
): void => {
  const path = (req.url ?? "/").split("?", 1)[0] as string
  if (handleHealth(req, res, path, registry, health)) return
  sendError(res, new RouteNotFound())
}
