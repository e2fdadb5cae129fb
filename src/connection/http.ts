/**
 * Plain `node:http` handling shared by the connection node's two ports: the boundary every request
 * runs under (`serve`) and the health routes (both ports; the public port answers nothing else
 * besides WebSocket upgrades). The router port's own routes are in `routerRoutes.ts`.
 *
 * Under the boundary a bug answers 500/999 with a request id and is logged once, never the process;
 * every error answer is the JSON of `toErrorResponse`, the same table as the endpoint's.
 */
import type { IncomingMessage, ServerResponse } from "node:http"
import { randomBytes } from "node:crypto"
import { InternalError, LogCheck, RouteNotFound, toErrorResponse } from "../domain/errors.ts"
import { sendError, sendJson } from "../platform/raw-http.ts"
import { DEFAULT_SOCKET_LIMITS, httpServerTimeouts, type SocketLimits } from "../platform/socket-limits.ts"
import { versionInfo } from "../observability/version.ts"
import type { NodeRegistryService } from "./registry.ts"

export interface HealthSource {
  /** Storage reachability for `/__heartbeat__`: "OK" or the cause. */
  readonly storageStatus: () => Promise<{ readonly ok: boolean; readonly cause?: string | undefined }>
  /** This worker's number, when the node runs as several (said by `/__heartbeat__`). */
  readonly worker?: number | undefined
  readonly logError: (message: string, fields?: Readonly<Record<string, unknown>>) => void
  /** A rejected request (status ≥ 400): one access-log line, ids left out. */
  readonly logRejected?: ((fields: Readonly<Record<string, unknown>>) => void) | undefined
}

/**
 * The bounds both ports' servers share (`platform/socket-limits.ts`): nothing or a partial request →
 * closed (408) after the client request timeout, idle keep-alive → closed; a WebSocket that upgraded
 * has `hello_timeout` to say hello (the session's own timer).
 */
export const httpPortLimits = (
  options: { readonly clientRequestTimeoutMs: number; readonly socketLimits?: Omit<SocketLimits, "requestTimeoutMs"> | undefined }
) => {
  const socketLimits: SocketLimits = { ...(options.socketLimits ?? DEFAULT_SOCKET_LIMITS), requestTimeoutMs: options.clientRequestTimeoutMs }
  const serverOptions = {
    ...httpServerTimeouts(socketLimits),
    // Node's own 408 only backs up the routes' timeout, which answers with the error JSON.
    requestTimeout: options.clientRequestTimeoutMs + 1_000
  }
  return { socketLimits, serverOptions }
}

export type HttpPortLimits = ReturnType<typeof httpPortLimits>

export const sendText = (res: ServerResponse, status: number, text: string): void => {
  res.writeHead(status, { "content-type": "text/plain", "content-length": Buffer.byteLength(text) })
  res.end(text)
}

/** A path segment, percent-decoded (one without `%` is as it is); a malformed escape is no segment (never a throw). */
export const segment = (raw: string): string | undefined => {
  if (!raw.includes("%")) return raw
  try {
    return decodeURIComponent(raw)
  } catch {
    return undefined
  }
}

// ── the boundary ────────────────────────────────────────────────────────────────────────────────

export type Handler = (req: IncomingMessage, res: ServerResponse, path: string) => void | Promise<void>

/**
 * Run a handler so that nothing it throws or rejects reaches the server: the answer is 500/999 with
 * a request id (unless already sent) and one error log line carries the id and the cause. Error
 * answers leave an access-log line.
 */
export const serve = (health: HealthSource, handler: Handler) => (req: IncomingMessage, res: ServerResponse): void => {
  const path = (req.url ?? "/").split("?", 1)[0] as string
  if (health.logRejected !== undefined) {
    const log = health.logRejected
    res.once("finish", () => {
      if (res.statusCode >= 400 && res.getHeader("x-autopush-quiet") === undefined) {
        log({ method: req.method, route: routeLabel(path), status: res.statusCode })
      }
    })
  }
  const failed = (cause: unknown) => {
    const requestId = randomBytes(8).toString("hex")
    health.logError("request failed", { request_id: requestId, method: req.method, route: routeLabel(path), cause: String(cause) })
    if (res.headersSent) return void res.destroy()
    const { status, headers, body } = toErrorResponse(new InternalError({ cause }))
    sendJson(res, status, body, { ...headers, "x-request-id": requestId })
  }
  try {
    const pending = handler(req, res, path)
    if (pending !== undefined) pending.catch(failed)
  } catch (cause) {
    failed(cause)
  }
}

/** A bounded label of a path for logs (never the uaid or a message id). */
const routeLabel = (path: string): string => {
  const first = path.split("/")[1] ?? ""
  return ["push", "notif", "metrics", "__trace__", "health", "status", "__heartbeat__", "__lbheartbeat__", "__version__", "__error__"]
      .includes(first)
    ? `/${first}`
    : "other"
}

// ── routes ──────────────────────────────────────────────────────────────────────────────────────

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
            ...(health.worker === undefined ? {} : { worker: health.worker }),
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

/** Non-upgrade requests on the public WebSocket port: health only. */
const publicHandler = (registry: NodeRegistryService, health: HealthSource): Handler => (req, res, path) => {
  req.resume()
  if (handleHealth(req, res, path, registry, health)) return
  sendError(res, new RouteNotFound())
}

/** The public port's request listener (for requests that are not WebSocket upgrades). */
export const handlePublicRequest = (registry: NodeRegistryService, health: HealthSource) =>
  serve(health, publicHandler(registry, health))
