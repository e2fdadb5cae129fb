/**
 * The router port's request listener: the private router API (`PUT /push/{uaid}`, `PUT /notif/{uaid}`,
 * `DELETE /notif/{uaid}/{connected_at}`), the operators' routes (`GET /metrics`,
 * `GET /__trace__/{message_id}`) and the health routes. The router API is the per-notification hot
 * path and only hands events to a session's mailbox, so it runs without an HTTP framework in
 * between. Its three routes take only requests signed by a node of this deployment
 * (`crypto/routerAuth.ts`): an unsigned one is answered 401, one whose signature is malformed, out
 * of time or not good 403 (the connection is closed); what can be judged before the body (the
 * header's form and time) is, before it is read. Paths and a notification body are decoded by hand:
 * they are read on every direct delivery (the body: `domain/router-wire.ts`); a body over `MAX_BODY`
 * is answered 413 (once read to its end), one that stops arriving for `bodyTimeoutMs` 408, and the
 * connection is closed.
 */
import type { IncomingMessage, ServerResponse } from "node:http"
import { CONNECTED_AT_HEADER, decodeTransportNotification, parseConnectedAt } from "../domain/router-wire.ts"
import { ROUTER_AUTH_HEADER, type RouterAuthRefusal, type RouterAuthService } from "../crypto/routerAuth.ts"
import {
  ClientUnavailable,
  InvalidRequestBody,
  MethodNotAllowed,
  PayloadTooLarge,
  RouteNotFound,
  RouterAuthMissing,
  RouterAuthRefused
} from "../domain/errors.ts"
import { type Body, readBody, sendError, sendJson } from "../platform/raw-http.ts"
import { parseUaid } from "../domain/ids.ts"
import { PROMETHEUS_CONTENT_TYPE } from "../observability/Metrics.ts"
import type { RouterObservability } from "../observability/observability.ts"
import { handleHealth, type Handler, type HealthSource, segment, sendText, serve } from "./http.ts"
import type { NodeRegistryService } from "./registry.ts"

/** Who may use the router API: the deployment's signatures, checked on the node's clock. */
export interface RouterGuard {
  readonly auth: RouterAuthService
  /** The node's clock (ms): tests move it. */
  readonly now: () => number
  /** A refused request, or an unsigned one let through (`router_accept_unsigned`): counted, logged at debug. */
  readonly noted: (reason: RouterAuthRefusal | "accepted_unsigned", route: string) => void
}

/** Largest router-port body: a notification is at most a few KiB (data ≤ max_data_bytes, base64url). */
const MAX_BODY = 64 * 1024

const CONNECTED_AT = /^\d{1,16}$/

/** A router API path, its segments decoded: the uaid in simple hex (sent in any UUID spelling: hyphenated by the endpoint, simple by a disconnect hook). */
interface RouterPath {
  readonly kind: "push" | "notif"
  readonly uaid: string
  readonly connectedAt: string | undefined
}

/** `/push/{uaid}`, `/notif/{uaid}`, `/notif/{uaid}/{connected_at}` (`parts`: the path split at `/`) → its route, else undefined. */
const routerPath = (parts: ReadonlyArray<string>): RouterPath | undefined => {
  if (parts.length !== 3 && parts.length !== 4) return undefined
  const kind = segment(parts[1] as string)
  const rawUaid = segment(parts[2] as string)
  const connectedAt = parts.length === 4 ? segment(parts[3] as string) : undefined
  if ((kind !== "push" && kind !== "notif") || rawUaid === undefined) return undefined
  if (parts.length === 4 && (kind !== "notif" || connectedAt === undefined || !CONNECTED_AT.test(connectedAt))) return undefined
  const uaid = parseUaid(rawUaid)
  return uaid === undefined ? undefined : { kind, uaid, connectedAt }
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
  const id = segment(path.slice("/__trace__/".length))
  const document = id === undefined || id === "" || id.includes("/") ? undefined : trace.lookup(id)
  if (document === undefined) sendError(res, new RouteNotFound())
  else sendJson(res, 200, document)
  return true
}

const tooLarge = new PayloadTooLarge({ message: `The request body must be at most ${MAX_BODY} bytes` })

/** Not here, or its queue is full: 404 makes the endpoint store the message instead (a normal outcome). */
const unavailable = (res: ServerResponse): void => {
  res.setHeader("x-autopush-quiet", "1")
  sendError(res, new ClientUnavailable())
}

const accepted = (res: ServerResponse, text = ""): void => sendText(res, 200, text)

/** The signature header, when there is exactly one. */
const signatureOf = (req: IncomingMessage): string | undefined => {
  const header = req.headers[ROUTER_AUTH_HEADER]
  return typeof header === "string" ? header : undefined
}

/**
 * Whether a router API request may go on. `"headers"`: what can be judged before a push's body is
 * read; `{ body }`: the whole check (a route without a body checks an empty one). A refused request is
 * answered here and its connection closed.
 */
const authorized = (
  req: IncomingMessage,
  res: ServerResponse,
  guard: RouterGuard,
  route: "/push" | "/notif",
  stage: "headers" | { readonly body: Uint8Array | undefined }
): boolean => {
  const header = signatureOf(req)
  const refusal = stage === "headers"
    ? guard.auth.precheck(guard.now(), header)
    : guard.auth.verify(guard.now(), header, req.method ?? "", req.url ?? "/", firstHeader(req, CONNECTED_AT_HEADER), stage.body)
  if (refusal === undefined) {
    if (header === undefined && stage !== "headers") guard.noted("accepted_unsigned", route)
    return true
  }
  guard.noted(refusal, route)
  req.resume()
  sendError(res, refusal === "unsigned" ? new RouterAuthMissing() : new RouterAuthRefused(), true)
  return false
}

const firstHeader = (req: IncomingMessage, name: string): string | undefined => {
  const value = req.headers[name]
  return Array.isArray(value) ? value[0] : value
}

/** `PUT /push/{uaid}`: a notification for the uaid's session here. */
const push = (req: IncomingMessage, res: ServerResponse, uaid: string, registry: NodeRegistryService, guard: RouterGuard, bodyTimeoutMs: number) => {
  if (!authorized(req, res, guard, "/push", "headers")) return
  readBody(req, { maxBytes: MAX_BODY, tooLarge, idleMs: bodyTimeoutMs }, (body) => delivered(req, res, uaid, registry, guard, body))
}

const delivered = (req: IncomingMessage, res: ServerResponse, uaid: string, registry: NodeRegistryService, guard: RouterGuard, body: Body): void => {
  if (body._tag === "Refused") return sendError(res, body.error, true)
  if (!authorized(req, res, guard, "/push", { body: body.bytes })) return
  const decoded = decodeTransportNotification(body.bytes.toString("utf8"))
  if (decoded === undefined) return sendError(res, new InvalidRequestBody({ message: "The body is not a notification" }))
  const connectedAt = parseConnectedAt(req.headers[CONNECTED_AT_HEADER])
  if (connectedAt === "invalid") return sendError(res, new InvalidRequestBody({ message: `${CONNECTED_AT_HEADER} is not a time in ms` }))
  const traceparent = req.headers["traceparent"]
  const notification = typeof traceparent === "string" ? { ...decoded, traceparent } : decoded
  return registry.deliver(uaid, notification, connectedAt) ? accepted(res) : unavailable(res)
}

/**
 * Router API on the private port, with `/metrics` and `/__trace__/{message_id}` when `observability`
 * is given (see `routerObservability`).
 */
const routerHandler = (
  registry: NodeRegistryService,
  health: HealthSource,
  guard: RouterGuard,
  observability: RouterObservability | undefined,
  bodyTimeoutMs: number
): Handler =>
(req, res, path) => {
  const parts = path.split("/")
  if (parts[1] === "push" || parts[1] === "notif") {
    const route = routerPath(parts)
    if (route === undefined) {
      req.resume()
      return sendError(res, new RouteNotFound())
    }
    const { kind, uaid, connectedAt } = route
    if (kind === "push" && req.method === "PUT") return push(req, res, uaid, registry, guard, bodyTimeoutMs)
    req.resume()
    if (kind === "notif" && connectedAt === undefined && req.method === "PUT") {
      if (!authorized(req, res, guard, "/notif", { body: undefined })) return
      return registry.checkStorage(uaid) ? accepted(res) : unavailable(res)
    }
    if (kind === "notif" && connectedAt !== undefined && req.method === "DELETE") {
      if (!authorized(req, res, guard, "/notif", { body: undefined })) return
      const session = registry.get(uaid)
      if (session !== undefined && session.connectedAt === Number(connectedAt)) {
        session.mailbox.offerFirst({ _tag: "Kick", kind: "ghost" })
        return accepted(res, "Terminated duplicate")
      }
      return unavailable(res)
    }
    return sendError(res, new MethodNotAllowed())
  }
  req.resume()
  if (handleOperators(req, res, path, observability)) return
  if (handleHealth(req, res, path, registry, health)) return
  sendError(res, new RouteNotFound())
}

/**
 * The router port's request listener: its router API guarded by `guard`; a request body that stops
 * arriving for `bodyTimeoutMs` is answered 408.
 */
export const handleRouterRequest = (
  registry: NodeRegistryService,
  health: HealthSource,
  guard: RouterGuard,
  observability?: RouterObservability,
  bodyTimeoutMs = 10_000
) => serve(health, routerHandler(registry, health, guard, observability, bodyTimeoutMs))
