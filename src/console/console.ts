/**
 * The web console: `GET /` on the endpoint's public port serves a page that is itself a push client
 * of this service (src/console/static/), a browser check at `/console/demo/` (the browser's own
 * Push API and service worker, to see whether its push service is this server), plus two small JSON
 * routes the console reads — `config.json` (the
 * WebSocket URL to connect to) and `status.json` (version, uptime, connected clients, notifications
 * received so far, and the VAPID keys whose pushes another push service would refuse, with why). Files are read once at start and served with a strict Content-Security-Policy:
 * scripts and styles only from this origin (no inline script), connections only to this origin,
 * the WebSocket and the endpoint origin (where the page's pushes go, and its push receipts come
 * from: the endpoint's own API, which the console token does not guard). Nothing secret is in any
 * of it; with `console_token` the page and its JSON routes ask for the token.
 */
import { readFileSync } from "node:fs"
import * as Effect from "effect/Effect"
import * as HttpRouter from "effect/http/HttpRouter"
import * as HttpServerRequest from "effect/http/HttpServerRequest"
import * as HttpServerResponse from "effect/http/HttpServerResponse"
import * as Redacted from "effect/Redacted"
import { constantTimeEqual } from "../crypto/secrets.ts"
import { InvalidAuth } from "../domain/errors.ts"
import { bearerToken } from "../platform/raw-http.ts"
import { Metrics } from "../observability/Metrics.ts"

export interface ConsoleOptions {
  /** The public WebSocket URL; undefined: `ws://<host the page was loaded from>:<websocketPort>/`. */
  readonly websocketUrl?: string | undefined
  /** The connection node's public port, for the derived URL. */
  readonly websocketPort: number
  /** Public base URL of the endpoint (pushes are sent there). */
  readonly endpointUrl: string
  /** The largest push body the endpoint accepts (`max_data_bytes`): the send form keeps under it. */
  readonly maxDataBytes: number
  /** Set: the page and its JSON routes ask for it (`?token=` or `Authorization: Bearer`). */
  readonly token?: Redacted.Redacted<string> | undefined
  readonly version: string
  readonly commit: string
}

/** A VAPID key (null: unsigned pushes) whose pushes got sender warnings: how many of each, and when last. */
export interface SenderReport {
  readonly vapidKey: string | null
  readonly warnings: Readonly<Record<string, number>>
  /** ISO 8601 */
  readonly lastSeen: string
}

/** Sender warnings the status lists at most (the most recent first). */
const SENDERS_SHOWN = 20

const FILES = {
  "index.html": "text/html; charset=utf-8",
  "app.js": "text/javascript; charset=utf-8",
  "webpush.js": "text/javascript; charset=utf-8",
  "receipts.js": "text/javascript; charset=utf-8",
  "checks.js": "text/javascript; charset=utf-8",
  "style.css": "text/css; charset=utf-8",
  "demo.html": "text/html; charset=utf-8",
  "demo.js": "text/javascript; charset=utf-8",
  "demo-sw.js": "text/javascript; charset=utf-8"
} as const

type FileName = keyof typeof FILES

const load = (): ReadonlyMap<FileName, Uint8Array> =>
  new Map((Object.keys(FILES) as Array<FileName>).map((name) => [name, readFileSync(new URL(`./static/${name}`, import.meta.url))]))

/** The host name the browser used (the `Host` header without port), else the endpoint URL's. */
const requestHost = (request: HttpServerRequest.HttpServerRequest, endpointUrl: string): string => {
  const host = request.headers["host"]
  if (host !== undefined && URL.canParse(`http://${host}`)) return new URL(`http://${host}`).hostname
  return new URL(endpointUrl).hostname
}

/**
 * The WebSocket the page connects to: as configured, else the connection port on the page's host,
 * as plain `ws://` (what that port speaks, even when the endpoint has TLS of its own).
 */
const websocketUrlFor = (options: ConsoleOptions, host: string): string =>
  options.websocketUrl ?? `ws://${host}:${options.websocketPort}/`

/** The Content-Security-Policy of every console response. */
const contentSecurityPolicy = (websocketUrl: string, endpointUrl: string): string =>
  [
    "default-src 'none'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self'",
    "worker-src 'self'",
    `connect-src 'self' ${new URL(websocketUrl).origin} ${new URL(endpointUrl).origin}`,
    "base-uri 'none'",
    "form-action 'none'",
    "frame-ancestors 'none'"
  ].join("; ")

/** The console's routes (all GET), to add to the endpoint's router. */
export const makeConsoleRoutes = Effect.fnUntraced(function*(
  options: ConsoleOptions,
  senders: () => ReadonlyArray<SenderReport> = () => []
) {
  const metrics = yield* Metrics
  const files = load()
  const headersFor = (request: HttpServerRequest.HttpServerRequest) => {
    const websocketUrl = websocketUrlFor(options, requestHost(request, options.endpointUrl))
    return {
      websocketUrl,
      headers: {
        "content-security-policy": contentSecurityPolicy(websocketUrl, options.endpointUrl),
        "x-content-type-options": "nosniff",
        "referrer-policy": "no-referrer",
        "cache-control": "no-cache"
      }
    }
  }
  const file = (name: FileName) =>
    Effect.map(HttpServerRequest.HttpServerRequest, (request) =>
      HttpServerResponse.uint8Array(files.get(name) ?? new Uint8Array(), { contentType: FILES[name], headers: headersFor(request).headers }))

  const config = Effect.map(HttpServerRequest.HttpServerRequest, (request) => {
    const { websocketUrl, headers } = headersFor(request)
    return HttpServerResponse.jsonUnsafe({ websocketUrl, endpointUrl: options.endpointUrl, maxDataBytes: options.maxDataBytes }, { headers })
  })

  /** Sums of a metric's series; null when this process has none (a separate endpoint node has no connections). */
  const total = (name: string): number | null => {
    const series = metrics.snapshot().filter((s) => s.name === name)
    return series.length === 0 ? null : series.reduce((sum, s) => sum + s.value, 0)
  }
  const status = Effect.map(HttpServerRequest.HttpServerRequest, (request) =>
    HttpServerResponse.jsonUnsafe({
      version: options.version,
      commit: options.commit,
      uptime: Math.round(process.uptime()),
      connections: total("ua.connections"),
      notifications: total("notification.received") ?? 0,
      senderWarnings: senders().slice(0, SENDERS_SHOWN)
    }, { headers: headersFor(request).headers }))

  /**
   * With a token, the page and its JSON routes answer only to it (the scripts and the stylesheet are
   * the same for everyone and hold nothing of this server). The page passes its own `?token=` on.
   */
  const guarded = <A, E, R>(route: Effect.Effect<A, E, R>): Effect.Effect<A, E | InvalidAuth, R | HttpServerRequest.HttpServerRequest> => {
    const token = options.token
    if (token === undefined) return route
    return Effect.flatMap(HttpServerRequest.HttpServerRequest, (request): Effect.Effect<A, E | InvalidAuth, R> => {
      const offered = bearerToken(request.headers["authorization"]) ?? new URL(request.url, "http://console").searchParams.get("token") ?? ""
      return constantTimeEqual(Redacted.value(token), offered)
        ? route
        : Effect.fail(new InvalidAuth({ message: "Invalid console token: open the console as /?token=<console_token>" }))
    })
  }

  return [
    HttpRouter.route("GET", "/", guarded(file("index.html"))),
    HttpRouter.route("GET", "/console/app.js", file("app.js")),
    HttpRouter.route("GET", "/console/webpush.js", file("webpush.js")),
    HttpRouter.route("GET", "/console/receipts.js", file("receipts.js")),
    HttpRouter.route("GET", "/console/checks.js", file("checks.js")),
    HttpRouter.route("GET", "/console/style.css", file("style.css")),
    // The browser check: the browser's own Push API, its service worker scoped to /console/demo/.
    HttpRouter.route("GET", "/console/demo/", file("demo.html")),
    HttpRouter.route("GET", "/console/demo.js", file("demo.js")),
    HttpRouter.route("GET", "/console/demo-sw.js", file("demo-sw.js")),
    HttpRouter.route("GET", "/console/config.json", guarded(config)),
    HttpRouter.route("GET", "/console/status.json", guarded(status)),
    // What every browser asks for with the page: no icon (204, remembered a day), not a 404 per page load.
    HttpRouter.route("GET", "/favicon.ico", Effect.succeed(HttpServerResponse.empty({ status: 204, headers: { "cache-control": "max-age=86400" } })))
  ]
})
