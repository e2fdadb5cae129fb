import type * as Redacted from "effect/Redacted"
import type { BridgeOptions } from "../bridges/Bridges.ts"
import type { RouterCacheOptions } from "./routerCache.ts"
import type { ConsoleOptions } from "../console/console.ts"
import { DEFAULT_SOCKET_LIMITS, type SocketLimits } from "../platform/socket-limits.ts"
import type { RateLimitOptions } from "./rateLimits.ts"

/** Push receipts: how long subscriptions live, how long and how many `GET`s of them are held. */
export interface ReceiptOptions {
  /** A receipt subscription not used for this long is gone (s; default 7 days). */
  readonly idleSeconds?: number | undefined
  /** Longest a `GET` of a subscription with no receipts waits for one (ms; default 30 s). */
  readonly maxWaitMs?: number | undefined
  /** Longest a `GET` of a subscription is held: a stream, or a long poll's wait (ms; default 300 s). */
  readonly maxHoldMs?: number | undefined
  /** `GET`s of one subscription held at once on this node (default 4). */
  readonly maxCollectorsPerSubscription?: number | undefined
  /** `GET`s of subscriptions one client address holds at once on this node (default 32). */
  readonly maxCollectorsPerAddress?: number | undefined
  /** `GET`s of subscriptions held at once on this node, all senders (default 1024). */
  readonly maxCollectors?: number | undefined
  /** Receipt subscriptions one client address makes on this process: this many at once, then this many per `idleSeconds` (default 100). */
  readonly subscriptionsPerAddress?: number | undefined
}

/**
 * What the endpoint node needs to know, as a plain object: the configuration module maps its
 * settings onto this (the endpoint does not read configuration itself).
 */
export interface EndpointOptions {
  /** Public base URL of the endpoint nodes (`Location` prefix, VAPID `aud`), no trailing slash. */
  readonly endpointUrl: string
  /** Certificate and key (PEM) of the endpoint port: HTTPS, with HTTP/2 by ALPN; undefined: plain HTTP (and h2c). */
  readonly tls?: { readonly cert: string; readonly key: string } | undefined
  /** Port to listen on; 0 picks a free one (read it back with `boundPort`). */
  readonly port: number
  /** Interface to bind; undefined binds all. */
  readonly bindHost?: string | undefined
  /** This process's number when the node runs as several workers: the port is shared with the others (SO_REUSEPORT); `/__heartbeat__` says which. */
  readonly worker?: number | undefined
  /** Largest notification body accepted, in bytes (413/104 above). */
  readonly maxDataBytes: number
  /** Messages one subscription may have stored (429/119 beyond; 0: no bound; default 100). */
  readonly maxStoredPerSubscription?: number | undefined
  /** Accept only pushes signed with VAPID (401/109 otherwise); default: unsigned pushes to v1 endpoints are taken. */
  readonly requireVapid?: boolean | undefined
  /** Larger TTLs are capped to this (seconds). */
  readonly maxNotificationTtl: number
  /** TTL of the messages the Matrix push gateway makes (seconds, capped to `maxNotificationTtl`; default 1 day). */
  readonly matrixGatewayTtl?: number | undefined
  /** Connect timeout of deliveries to connection nodes (ms). */
  readonly connectionTimeoutMs: number
  /** Whole-request timeout of deliveries to connection nodes (ms). */
  readonly requestTimeoutMs: number
  /** On shutdown, how long requests in flight get to finish (ms; default 10 s). */
  readonly shutdownTimeoutMs?: number | undefined
  /** Reported by `/status`, `/__version__` and the health documents. */
  readonly version: string
  /** A request body that stops arriving for this long is answered 408 (ms; default 10 s). */
  readonly clientRequestTimeoutMs?: number | undefined
  /** Idle time of kept-alive connections, and open connections per client address (default: `DEFAULT_SOCKET_LIMITS`). */
  readonly socketLimits?: Omit<SocketLimits, "requestTimeoutMs"> | undefined
  /** Requests handled at once; beyond, 503 with Retry-After (default: no limit). */
  readonly maxInFlightRequests?: number | undefined
  /** Bearer tokens of the broadcast admin API; none: the API answers 404. */
  readonly broadcastAdminTokens?: ReadonlyArray<Redacted.Redacted<string>> | undefined
  /** Router records of connected clients reused for direct deliveries (default: off). */
  readonly routerCache?: RouterCacheOptions | undefined
  /** Channels one bridged user may have (`max_channels_per_user`); beyond it, 413/121 (default 1000, as that option's). */
  readonly maxChannelsPerUser?: number | undefined
  /** Keys of the bridge registration secrets: the first issues, all verify (none: registration fails 500). */
  readonly authKeys?: Redacted.Redacted<ReadonlyArray<string>> | undefined
  /** The bridges (FCM, APNs, ADM, stub) this node routes bridged users through; none by default. */
  readonly bridges?: BridgeOptions | undefined
  /** Per-sender limits of the push route (429/116); undefined: none. */
  readonly rateLimits?: RateLimitOptions | undefined
  /** Push receipts: idle time of receipt subscriptions, longest wait of a `GET` (defaults: 7 days, 30 s). */
  readonly receipts?: ReceiptOptions | undefined
  /** The web console at `GET /`; undefined: not served. */
  readonly console?: ConsoleOptions | undefined
  /** How `/__heartbeat__` and `/health` name the store when it fails (`PostgreSQL at db:5432/autopush`; default "storage"). */
  readonly storageName?: string | undefined
  /** How long `/__heartbeat__` and `/health` reuse the tables' status (ms; default `TABLE_STATUS_TTL_MS`, 5 s; 0: read it on every request). */
  readonly tableStatusTtlMs?: number | undefined
  /** `/__version__` extras (Dockerflow `version.json`). */
  readonly build?: { readonly commit?: string; readonly build?: string; readonly source?: string } | undefined
}

export const defaultEndpointOptions: EndpointOptions = {
  endpointUrl: "http://localhost:8082",
  port: 8082,
  maxDataBytes: 4096,
  maxNotificationTtl: 2_592_000,
  connectionTimeoutMs: 1000,
  requestTimeoutMs: 3000,
  version: "0.0.0"
}

/** `scheme://host[:port]` of the endpoint URL: what a VAPID `aud` must name. */
export const endpointOrigin = (endpointUrl: string): string => new URL(endpointUrl).origin

/** The endpoint URL without trailing slashes (prefix of `Location`). */
export const endpointBase = (endpointUrl: string): string => endpointUrl.replace(/\/+$/, "")

/** How long a request's headers or body may take to arrive (`clientRequestTimeoutMs`, else the default). */
export const clientRequestTimeoutOf = (options: Pick<EndpointOptions, "clientRequestTimeoutMs">): number =>
  options.clientRequestTimeoutMs ?? DEFAULT_SOCKET_LIMITS.requestTimeoutMs
