/**
 * Every configuration option, in one table. The table drives parsing (ini files, environment,
 * flags), `--help`, the sample ini files in `config/` and the README table; nothing else lists
 * options. Names are Mozilla autopush's (`port`, `router_port`, `crypto_key`, …); `Settings` exposes them
 * in camelCase.
 *
 * Each option has a scope: `shared` options may be set in any ini file and under any environment
 * prefix; `connection` options belong to autoconnect (`autopush_connection.ini`, `AUTOCONNECT__*`),
 * `endpoint` options to autoendpoint (`autopush_endpoint.ini`, `AUTOEND__*`).
 *
 * A value is always written as a string; its kind decodes it with a Schema codec (and encodes
 * defaults back for the docs and samples).
 */
import { isIP } from "node:net"
import { hostname as machineHostname } from "node:os"
import * as Duration from "effect/Duration"
import * as Schema from "effect/Schema"
import * as SchemaTransformation from "effect/SchemaTransformation"

export type Scope = "shared" | "connection" | "endpoint"
export type Role = "autopush" | "autoconnect" | "autoendpoint"

/** The scopes a process reads: the all-in-one reads everything. */
export const roleScopes: Readonly<Record<Role, ReadonlyArray<Scope>>> = {
  autopush: ["shared", "connection", "endpoint"],
  autoconnect: ["shared", "connection"],
  autoendpoint: ["shared", "endpoint"]
}

/** The ini file of each scope (named as Mozilla autopush's). */
export const iniFile: Readonly<Record<Scope, string>> = {
  shared: "autopush_shared.ini",
  connection: "autopush_connection.ini",
  endpoint: "autopush_endpoint.ini"
}

/** The environment prefix of each scope (autopush-rs style for the two nodes). */
export const envPrefix: Readonly<Record<Scope, string>> = {
  shared: "AUTOPUSH__",
  connection: "AUTOCONNECT__",
  endpoint: "AUTOEND__"
}

// ---------------------------------------------------------------------------------------------
// Kinds of values

export interface Kind<A> {
  /** Short type name for docs: `integer 1-65535`, `seconds`, `list`, … */
  readonly type: string
  /** Completes `"<raw>" is not …` in error messages. */
  readonly expected: string
  /** Decodes the raw string (already trimmed and unquoted, never empty); encodes defaults. */
  readonly codec: Schema.Codec<A, string>
  /** Placeholder of the value in `--help` ("" for booleans: `--human-logs` alone means true). */
  readonly metavar: string
}

const kind = <A>(type: string, expected: string, metavar: string, codec: Schema.Codec<A, string>): Kind<A> => ({
  type,
  expected,
  metavar,
  codec
})

const matching = (pattern: RegExp) => Schema.String.check(Schema.isPattern(pattern))

const text: Kind<string> = kind("string", "a non-empty string", "TEXT", Schema.String)

/** A DNS name or an IP address (IPv6 with or without brackets). */
export const host: Kind<string> = kind(
  "host",
  "a host name or IP address",
  "HOST",
  matching(/^(?:[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?|\[?[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*\]?)$/)
)

export const integer = (minimum: number, maximum = Number.MAX_SAFE_INTEGER): Kind<number> =>
  kind(
    maximum === Number.MAX_SAFE_INTEGER ? `integer ≥ ${minimum}` : `integer ${minimum}-${maximum}`,
    maximum === Number.MAX_SAFE_INTEGER
      ? `an integer of at least ${minimum}`
      : `an integer between ${minimum} and ${maximum}`,
    "N",
    matching(/^[+-]?\d{1,16}$/).pipe(
      Schema.decodeTo(Schema.Int.check(Schema.isBetween({ minimum, maximum })), SchemaTransformation.numberFromString)
    )
  )

const port: Kind<number> = integer(1, 65535)

const SECONDS = /^(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d)?$/
const UNIT_MS: Readonly<Record<string, number>> = { ms: 1, s: 1_000, m: 60_000, h: 3_600_000, d: 86_400_000 }

/** A duration: a number of seconds (fractions allowed), or with a unit suffix ms/s/m/h/d. */
export const seconds: Kind<Duration.Duration> = kind(
  "seconds",
  "a number of seconds (like 5, 0.5, 300ms, 30d)",
  "SECONDS",
  matching(SECONDS).pipe(
    Schema.decodeTo(
      Schema.Duration,
      SchemaTransformation.transform({
        decode: (s: string) => {
          const [, amount = "0", unit = "s"] = SECONDS.exec(s) ?? []
          return Duration.millis(Number(amount) * (UNIT_MS[unit] ?? 1_000))
        },
        encode: (d: Duration.Duration) => String(Duration.toSeconds(d))
      })
    )
  )
)

const TRUE = new Set(["true", "yes", "on", "1"])

export const boolean: Kind<boolean> = kind(
  "boolean",
  "a boolean (true/false, yes/no, on/off, 1/0)",
  "",
  matching(/^(?:true|false|yes|no|on|off|1|0)$/i).pipe(
    Schema.decodeTo(
      Schema.Boolean,
      SchemaTransformation.transform({ decode: (s: string) => TRUE.has(s.toLowerCase()), encode: String })
    )
  )
)

export const oneOf = <const L extends ReadonlyArray<string>>(values: L): Kind<L[number]> =>
  kind(
    values.join(" | "),
    `one of ${values.join(", ")}`,
    values.join("|"),
    Schema.String.pipe(
      Schema.decodeTo(Schema.String, SchemaTransformation.toLowerCase()),
      Schema.decodeTo(Schema.Literals(values))
    )
  )

/** How many worker processes: a number, or `auto` for the cores this process may use. */
const workerCount: Kind<number | "auto"> = kind(
  "integer 1-256 | auto",
  "an integer between 1 and 256, or auto",
  "N|auto",
  Schema.Union([oneOf(["auto"]).codec, integer(1, 256).codec])
)

/** An absolute http(s) URL; a trailing slash is dropped so paths can be appended. */
export const url: Kind<string> = kind(
  "url",
  "an http(s) URL",
  "URL",
  Schema.String.check(
    Schema.makeFilter((s: string) => URL.canParse(s) && /^https?:$/.test(new URL(s).protocol))
  ).pipe(
    Schema.decodeTo(
      Schema.String,
      SchemaTransformation.transform({ decode: (s: string) => s.replace(/\/+$/, ""), encode: (s: string) => s })
    )
  )
)

/** A PostgreSQL connection URL, libpq's form: `postgres://user:password@host:port/database?sslmode=…`. */
const postgresUrl: Kind<string> = kind(
  "url",
  "a postgres:// URL",
  "URL",
  Schema.String.check(Schema.makeFilter((s: string) => URL.canParse(s) && /^postgres(ql)?:$/.test(new URL(s).protocol) && new URL(s).hostname !== ""))
)

/** An absolute ws(s) URL, as browsers and push clients connect to it. */
const websocketUrl: Kind<string> = kind(
  "url",
  "a ws(s) URL",
  "URL",
  Schema.String.check(Schema.makeFilter((s: string) => URL.canParse(s) && /^wss?:$/.test(new URL(s).protocol)))
)

/** Strips one pair of matching surrounding quotes (docker env files keep them). */
export const unquote = (s: string): string => (/^(["']).*\1$/s.test(s) ? s.slice(1, -1).trim() : s)

/** `[a, "b"]`, `a,b` or a single item; items trimmed and unquoted, empty ones dropped. */
export const splitList = (raw: string): Array<string> => {
  const inner = raw.trim().replace(/^\[(.*)\]$/s, "$1")
  return inner.split(",").map((item) => unquote(item.trim())).filter((item) => item !== "")
}

const list = (item: Schema.Codec<string> = Schema.String, expected = "a list of strings"): Kind<ReadonlyArray<string>> =>
  kind(
    "list",
    `${expected} ([a,b] or a,b)`,
    "LIST",
    Schema.String.pipe(
      Schema.decodeTo(
        Schema.Array(item),
        SchemaTransformation.transform<ReadonlyArray<string>, string>({
          decode: splitList,
          encode: (items: ReadonlyArray<string>) => (items.length === 0 ? "" : `[${items.join(",")}]`)
        })
      )
    )
  )

/** A Fernet key: URL-safe base64 of 32 bytes, as `autokey` prints it. */
const isFernetKey = (key: string): boolean =>
  /^[A-Za-z0-9_-]{43}=?$/.test(key) && Buffer.from(key, "base64url").length === 32

export const fernetKeys: Kind<ReadonlyArray<string>> = list(
  Schema.String.check(Schema.makeFilter(isFernetKey)),
  "a list of Fernet keys (URL-safe base64 of 32 bytes, as autokey prints)"
)

const isAddressOrBlock = (entry: string): boolean => {
  const [address = "", prefix, ...rest] = entry.split("/")
  const family = isIP(address)
  if (family === 0 || rest.length > 0) return false
  if (prefix === undefined) return true
  return /^\d{1,3}$/.test(prefix) && Number(prefix) <= (family === 4 ? 32 : 128)
}

/** IP addresses and CIDR blocks (`10.0.0.1`, `10.0.0.0/8`, `fd00::/8`). */
const addressList: Kind<ReadonlyArray<string>> = list(
  Schema.String.check(Schema.makeFilter(isAddressOrBlock)),
  "a list of IP addresses or CIDR blocks (10.0.0.1, 10.0.0.0/8, fd00::/8)"
)

// ---------------------------------------------------------------------------------------------
// The table

/**
 * One option. `D` is the type of its default: `A` when it has one, `undefined` when it is unset by
 * default.
 */
export interface OptionDef<A = unknown, D = unknown> {
  readonly scope: Scope
  readonly kind: Kind<A>
  readonly default: () => D
  /** The default is computed (machine hostname): docs show `defaultText`, samples leave it empty. */
  readonly computed: boolean
  /** Docs text for a computed or unset default. */
  readonly defaultText: string | undefined
  readonly description: string
  /** Never printed: redacted in logs, not echoed in error messages. */
  readonly secret: boolean
  /** Extra environment names (autopush-rs spellings, the `CRYPTO_KEY` of autopush's Docker images, AWS names). */
  readonly env: ReadonlyArray<string>
}

interface Extra {
  readonly secret?: boolean
  readonly env?: ReadonlyArray<string>
  readonly defaultText?: string
}

function opt<A>(scope: Scope, kind: Kind<A>, dflt: A | (() => A), description: string, extra?: Extra): OptionDef<A, A>
function opt<A>(scope: Scope, kind: Kind<A>, dflt: undefined, description: string, extra?: Extra): OptionDef<A, undefined>
function opt<A>(
  scope: Scope,
  kind: Kind<A>,
  dflt: A | (() => A) | undefined,
  description: string,
  extra: Extra = {}
): OptionDef<A, A | undefined> {
  const computed = typeof dflt === "function"
  return {
    scope,
    kind,
    default: computed ? (dflt as () => A) : () => dflt,
    computed,
    defaultText: extra.defaultText,
    description,
    secret: extra.secret ?? false,
    env: extra.env ?? []
  }
}

const s = Duration.seconds

export const options = {
  // shared
  hostname: opt("shared", host, () => machineHostname(), "Name of this machine; router_url is built from it", {
    defaultText: "this machine's hostname"
  }),
  crypto_key: opt("shared", fernetKeys, [], "Fernet keys for endpoint tokens and message ids; the first encrypts, all decrypt (make one with autokey)", {
    secret: true,
    env: ["CRYPTO_KEY", "AUTOCONNECT__CRYPTO_KEY", "AUTOEND__CRYPTO_KEYS"]
  }),
  auth_keys: opt("shared", list(), [], "HMAC keys for the bridge registration secrets; the first signs, all verify", {
    secret: true,
    env: ["AUTOEND__AUTH_KEYS"]
  }),
  router_tablename: opt("shared", text, "router", "DynamoDB table of router records (uaid → node)"),
  message_tablename: opt("shared", text, "message", "DynamoDB message table name, or prefix of the monthly tables"),
  no_table_rotation: opt("shared", boolean, false, "Use one message table instead of monthly tables"),
  storage_endpoint: opt("shared", url, undefined, "DynamoDB endpoint URL (AWS, DynamoDB Local, ScyllaDB Alternator)", {
    env: ["AWS_ENDPOINT_URL_DYNAMODB"],
    defaultText: "unset (the embedded SQLite database under data_dir)"
  }),
  embedded_storage: opt("shared", boolean, false, "Let autoconnect or autoendpoint run on the embedded SQLite database under data_dir when storage_endpoint is unset: shared by the nodes of this host with the same data_dir, seen by no other host; without it such a node refuses to start. The all-in-one autopush always may"),
  storage_timeout: opt("shared", seconds, s(5), "Deadline of one storage operation (retries included): past it the operation fails — a push is answered 503 with Retry-After, a hello is closed (HandshakeTimeout once hello_timeout has passed), a session's drain retries later"),
  storage_breaker_threshold: opt("shared", integer(0, 1_000), 5, "Storage failures in a row that say the store cannot be reached (connection refused or reset, storage_timeout passed, the server shutting down or out of connections) after which a process stops sending it operations: they fail at once — pushes 503 with Retry-After, hellos closed — until one probe, let through after a back-off of 1 s doubling up to storage_breaker_max_backoff, reaches it. 0: no breaker (every operation tries the store)"),
  storage_breaker_max_backoff: opt("shared", seconds, s(30), "Longest wait between two probes of a store the storage breaker found unreachable (storage_breaker_threshold): how long a process may go on refusing storage operations after the store is back"),
  aws_region: opt("shared", text, "us-east-1", "AWS region of the DynamoDB endpoint", { env: ["AWS_REGION"] }),
  data_dir: opt("shared", text, "./data", "Directory of the embedded storage (relative to the working directory): its SQLite database autopush.sqlite (with its -wal and -shm files), or the dynalite/ directory of an earlier version, which keeps being used until it is migrated; and the generated keys, secrets.json"),
  storage_port: opt("shared", integer(0, 65_535), 0, "Port of the embedded dynalite store (on 127.0.0.1 only) that serves an earlier version's data under data_dir until it is migrated (the default SQLite database opens no port): 0 takes a free port at each start. The ready line names it; the operators' tools find it by themselves"),
  db_dsn: opt("shared", postgresUrl, undefined, "PostgreSQL to store in (postgres://user:password@host:port/database, libpq's URL form with its parameters, such as sslmode=verify-full for TLS): the store every node of a fleet without AWS shares. Set, it is used instead of storage_endpoint and the embedded database", {
    secret: true,
    env: ["AUTOCONNECT__DB_DSN", "AUTOEND__DB_DSN"],
    defaultText: "unset"
  }),
  db_pool_size: opt("shared", integer(1, 1_000), 10, "Connections to PostgreSQL (db_dsn) a process keeps at most: operations beyond them wait for one, within storage_timeout. Each worker has its own pool: the server must allow nodes × workers × db_pool_size connections (max_connections)"),
  endpoint_scheme: opt("shared", oneOf(["http", "https"]), "http", "Scheme of the public endpoint URLs", { env: ["AUTOEND__SCHEME"] }),
  endpoint_hostname: opt("shared", host, "localhost", "Host name in the public endpoint URLs", { env: ["AUTOEND__HOST"] }),
  endpoint_port: opt("shared", port, 8082, "Port of the endpoint node: where it listens and the port in endpoint URLs", { env: ["AUTOEND__PORT"] }),
  endpoint_url: opt("shared", url, undefined, "Public base URL of the endpoint node; overrides the three options above", {
    defaultText: "endpoint_scheme://endpoint_hostname[:endpoint_port]"
  }),
  websocket_url: opt("shared", websocketUrl, undefined, "Public URL of the connection nodes' WebSocket, as clients reach it (behind a TLS proxy: wss://…); shown by the web console and at start", {
    defaultText: "ws://<host the console was loaded from>:port/"
  }),
  bind_host: opt("shared", host, "0.0.0.0", "Address the public listeners bind to (WebSocket and Web Push ports)"),
  private_bind_host: opt("shared", host, undefined, "Address the private listeners bind to: the router port and the endpoint's metrics port", {
    defaultText: "127.0.0.1 for the all-in-one autopush, bind_host for a node on its own"
  }),
  statsd_host: opt("shared", host, undefined, "StatsD host for metrics", { defaultText: "unset (no StatsD)" }),
  statsd_port: opt("shared", port, 8125, "StatsD port"),
  // A person at a terminal reads lines; a pipe (journald, docker, a log shipper) gets records.
  human_logs: opt("shared", boolean, () => process.stdout.isTTY === true, "Log human-readable lines instead of MozLog JSON", {
    defaultText: "true when stdout is a terminal, false when it is piped"
  }),
  log_level: opt("shared", oneOf(["trace", "debug", "info", "warn", "error"]), "info", "Lowest level logged"),
  max_notification_ttl: opt("shared", seconds, s(2_592_000), "Largest TTL accepted; larger TTLs are capped"),
  receipt_subscription_idle: opt("shared", seconds, s(604_800), "A push receipt subscription that nobody used (a push naming it, or a GET of it) for this long is gone (404); a receipt waits this long to be collected"),
  shutdown_timeout: opt("shared", seconds, s(10), "How long a stopping node waits for work in flight"),
  client_request_timeout: opt("shared", seconds, s(10), "Time a client has to send an HTTP request's headers, and between two parts of its body (408 otherwise); a connection that sends nothing (or only part of a TLS handshake or an HTTP/2 preface) is closed after it"),
  client_idle_timeout: opt("shared", seconds, s(75), "Kept-alive HTTP/1.1 connections and HTTP/2 sessions (GOAWAY) with no request for this long are closed, on every port; longer than the 60 s of common load balancers and proxies, so that they close an idle connection first"),
  max_connections_per_address: opt("shared", integer(0), 1_000, "Connections one client address (an IPv6 /64) may hold open on a public port (endpoint, WebSocket); beyond, the connection is answered 503 and closed (over TLS: closed). 0 turns it off; the loopback and trusted_proxies are not counted"),
  workers: opt("shared", workerCount, 1, "Processes of this node, sharing its public ports (SO_REUSEPORT, Linux); auto = one per core this process may use. Each worker has its own private port: router_port (an endpoint node: metrics_port) and the next ports up, skipping the node's public ports; with embedded storage, every process opens the SQLite database under data_dir. 1 = one process"),
  event_log: opt("shared", text, undefined, "Where domain events are written: - for stdout, or a file path", {
    defaultText: "unset (not written)"
  }),
  otlp_endpoint: opt("shared", url, undefined, "OpenTelemetry collector (OTLP/HTTP) base URL: traces of accept → route → deliver → ack go to {url}/v1/traces", {
    defaultText: "unset (no tracing)"
  }),
  // connection
  port: opt("connection", port, 8080, "Port of the public WebSocket server"),
  router_port: opt("connection", port, 8081, "Port of the private router HTTP server (endpoint → connection node)"),
  router_scheme: opt("connection", oneOf(["http", "https"]), "http", "Scheme of router_url"),
  router_hostname: opt("connection", host, undefined, "Host name in router_url", { defaultText: "hostname" }),
  router_url: opt("connection", url, undefined, "URL endpoint nodes use to reach this node (stored as node_id)", {
    defaultText: "router_scheme://router_hostname:router_port"
  }),
  router_accept_unsigned: opt("shared", boolean, false, "Let a connection node's router port take requests that carry no signature (Autopush-Router-Auth, made with a key derived from crypto_key), as nodes of a version before it send: only while a deployment is being upgraded to signing nodes; a badly signed request is refused all the same. Off: unsigned requests are answered 401"),
  hello_timeout: opt("connection", seconds, s(5), "Time a new WebSocket has to send its hello", {
    env: ["AUTOCONNECT__OPEN_HANDSHAKE_TIMEOUT"]
  }),
  auto_ping_interval: opt("connection", seconds, s(300), "Idle time after which the server pings the client"),
  auto_ping_timeout: opt("connection", seconds, s(4), "Time the client has to answer a server ping"),
  min_ping_interval: opt("connection", seconds, s(45), "Clients pinging more often than this are closed with 4774"),
  msg_limit: opt("connection", integer(1), 100, "Stored messages a client may find when it says hello (its backlog), one subscription's counted up to half of it; above it the user is dropped and must re-register. A guard for many subscriptions together: one alone never resets its user, and what is pushed while the client is connected never counts"),
  client_channel_capacity: opt("connection", integer(1), 128, "Messages a connection may hold for its client, queued or sent and not acked; a further push to it is stored instead"),
  close_grace: opt("connection", seconds, s(1), "After a close frame, time before the server ends the TCP connection; the acks the client sends until then (or until it answers the close) are taken"),
  max_connections: opt("connection", integer(1), 100_000, "Open WebSockets per node; an upgrade beyond is answered 503"),
  max_message_size: opt("connection", integer(1024), 65_536, "Largest WebSocket message a client may send (bytes); a larger one closes the socket with 1009"),
  max_send_buffer: opt("connection", integer(1024), 1_048_576, "Bytes queued to a client that does not read, beyond which it is closed with 1013 (its messages stay stored)"),
  max_control_frames_per_second: opt("connection", integer(1), 10, "WebSocket ping/pong frames a client may send per second; beyond, the socket is closed with 1008"),
  megaphone_api_url: opt("connection", url, undefined, "Megaphone server the broadcast set is polled from; unset: the set kept in storage, changed through the endpoint's /v1/broadcasts", {
    defaultText: "unset (broadcasts from storage)"
  }),
  megaphone_api_token: opt("connection", text, undefined, "Bearer token sent to megaphone_api_url, when the server asks for one (unset: no Authorization header)", { secret: true, defaultText: "unset" }),
  megaphone_poll_interval: opt("connection", seconds, s(30), "How often the broadcast set is read (from megaphone or storage)"),
  max_channels_per_user: opt("shared", integer(1), 1000, "Channels one user may register; a register beyond it is answered with status 413 (on the WebSocket; 413/121 on the bridge registration API)"),
  client_commands_per_second: opt("connection", integer(1), 10, "Commands (register, unregister, nack, broadcast_subscribe) a client may send per second once its burst is spent; beyond, its commands wait"),
  client_command_burst: opt("connection", integer(1), 100, "Commands a client may send at once before client_commands_per_second applies (keep it at least that rate)"),
  client_inbox_frames: opt("connection", integer(1), 64, "Frames from one client (any kind, acks too) waiting to be handled, at which its socket stops being read until half of them are handled; the client is not closed for it"),
  client_inbox_bytes: opt("connection", integer(1024), 262_144, "Bytes of the frames from one client waiting to be handled, at which its socket stops being read until half of them are handled"),
  // endpoint
  max_data_bytes: opt("endpoint", integer(1), 4096, "Largest notification body accepted (bytes); an HPKE message (Content-Type application/webpush-message, no Content-Encoding) may have 1024 more"),
  max_stored_per_subscription: opt("endpoint", integer(0), 100, "Messages one subscription may have stored, not yet received by its client; a further push to it is answered 429 (errno 119) with Retry-After (10 s while the client is connected, 300 s while away) and nothing is written; a message replacing its Topic's stored one is always taken. 0 turns it off"),
  rate_limit_per_address: opt("endpoint", integer(0), 100, "Pushes per second one client address may send, sustained (token bucket; 0 turns it off; making and collecting receipt subscriptions, message status reads, cancels, registration API and broadcast admin calls and the log check count as pushes, taken before the request is read); beyond it 429/116 with Retry-After. A push to a subscription bound to a VAPID key, signed by that key, counts against the key instead (rate_limit_per_vapid_key); its address's pushes whose signature for the bound key fails count at this rate in a bucket of their own. Peers on the loopback are not limited by address unless listed in trusted_proxies"),
  rate_limit_burst_per_address: opt("endpoint", integer(1), 1000, "Pushes one client address may send at once after a quiet period"),
  rate_limit_per_vapid_key: opt("endpoint", integer(0), 1000, "Pushes per second one VAPID key may send, sustained, once its signature verified (token bucket; 0 turns it off); beyond it 429/116 with Retry-After. The limit of a sender that signs for the subscriptions bound to its key (which then do not count against its address): generous, since one key legitimately sends to all its subscribers. Signed pushes to other subscriptions count against their address too"),
  rate_limit_burst_per_vapid_key: opt("endpoint", integer(1), 10_000, "Pushes one VAPID key may send at once after a quiet period"),
  rate_limit_per_subscription: opt("endpoint", integer(0), 240, "Pushes per minute one subscription may be sent, sustained, whoever sends them (token bucket; 0 turns it off; Matrix gateway notifies count too); beyond it 429/116 with Retry-After. Protects one client from all its senders together"),
  rate_limit_burst_per_subscription: opt("endpoint", integer(1), 240, "Pushes one subscription may be sent at once after a quiet period"),
  trusted_proxies: opt("shared", addressList, [], "Addresses or CIDR blocks of the reverse proxies in front of the nodes: not counted by max_connections_per_address; for a push from one of them, the client address is the rightmost X-Forwarded-For entry that is not a listed proxy (never believed from anyone else)"),
  require_vapid: opt("shared", boolean, false, "Accept only pushes signed with VAPID (RFC 8292): an unsigned push is answered 401/109, whatever its endpoint, and a WebSocket register without a key is refused (status 403)"),
  connection_timeout: opt("endpoint", seconds, s(1), "Timeout of deliveries to connection nodes"),
  request_timeout: opt("endpoint", seconds, s(3), "Timeout of requests to bridges and other services"),
  console: opt("endpoint", boolean, true, "Serve the web console (a push client page and the server's status) at GET / on the endpoint's port"),
  console_token: opt("endpoint", text, undefined, "Token the web console asks for (open it as /?token=…; its JSON routes take it as Authorization: Bearer); unset: the console is public", {
    secret: true,
    defaultText: "unset (public console)"
  }),
  max_in_flight_requests: opt("endpoint", integer(1), 2_048, "HTTP requests an endpoint node handles at once; beyond, 503 with Retry-After"),
  broadcast_admin_tokens: opt("endpoint", list(), [], "Bearer tokens of the broadcast admin API (/v1/broadcasts); none: the API answers 404", { secret: true }),
  router_cache_ttl: opt("endpoint", seconds, s(60), "How long an endpoint node reuses the router record of a client, and the channels it read for it, without reading storage (0 turns it off): a connected client's for direct deliveries (the node takes a message only for the session and channels it still has, otherwise storage is read again); an offline client's for storing its messages (a push then costs the store and the read of the record that follows every store, which finds a user dropped or a client that came back)"),
  endpoint_tls_cert: opt("endpoint", text, undefined, "Certificate chain (PEM, or the path of a PEM file) of the endpoint port: with endpoint_tls_key, the port speaks HTTPS, HTTP/2 chosen by ALPN (without them: plain HTTP/1.1, and HTTP/2 with prior knowledge)", {
    defaultText: "unset (plain HTTP; TLS by a proxy in front)"
  }),
  endpoint_tls_key: opt("endpoint", text, undefined, "Private key (PEM, or the path of a PEM file) of endpoint_tls_cert", {
    secret: true,
    defaultText: "unset"
  }),
  receipt_max_wait: opt("endpoint", seconds, s(30), "Longest a GET of a receipt subscription (Accept: application/json, or HTTP/1.1) waits for a receipt before it answers an empty list; a sender's Prefer: wait=N asks for less"),
  receipt_max_hold: opt("endpoint", seconds, s(300), "Longest a GET of a receipt subscription is held open (server-sent events, HTTP/2 server push; a long poll waits at most receipt_max_wait): then a stream ends and a server-push GET is answered 204, and the client asks again"),
  receipt_max_collectors_per_subscription: opt("endpoint", integer(1), 4, "GETs of one receipt subscription held open at once on a node; beyond, 429/116 with Retry-After"),
  receipt_max_collectors_per_address: opt("endpoint", integer(1), 32, "GETs of receipt subscriptions one client address holds open at once on a node (addressed as for rate_limit_per_address); beyond, 429/116 with Retry-After"),
  receipt_subscriptions_per_address: opt("endpoint", integer(1), 100, "Receipt subscriptions (POST /receipts) one client address may make on an endpoint process: this many at once, then this many per receipt_subscription_idle (addressed as for rate_limit_per_address; the loopback is not counted); beyond, 429/116 with Retry-After"),
  receipt_max_collectors: opt("endpoint", integer(1), 1024, "GETs of receipt subscriptions held open at once on a node, all senders together (they do not count toward max_in_flight_requests); beyond, 503/201 with Retry-After"),
  router_cache_entries: opt("endpoint", integer(1), 100_000, "Router records of clients (connected or offline) an endpoint node keeps at most"),
  matrix_gateway_ttl: opt("endpoint", seconds, s(86_400), "TTL of the messages the Matrix push gateway (POST /_matrix/push/v1/notify) makes for a subscription: how long one waits for a device that is offline (capped to max_notification_ttl)"),
  bridge_stub: opt("endpoint", boolean, false, "Enable the stub bridge (router type stub, app id success or error, token success): for tests and demos of the registration API"),
  fcm_credentials: opt("endpoint", text, undefined, "FCM (HTTP v1) apps as JSON: {\"<app_id>\": {\"project_id\": \"…\", \"credential\": \"<service-account JSON, or the path of its file>\"}}", {
    secret: true,
    env: ["AUTOEND__FCM__CREDENTIALS"],
    defaultText: "unset (no FCM bridge)"
  }),
  fcm_min_ttl: opt("endpoint", seconds, s(60), "Smallest TTL given to FCM", { env: ["AUTOEND__FCM__MIN_TTL"] }),
  fcm_max_ttl: opt("endpoint", seconds, s(2_419_200), "Largest TTL given to FCM (28 days)", { env: ["AUTOEND__FCM__MAX_TTL"] }),
  fcm_timeout: opt("endpoint", seconds, s(3), "Timeout of requests to FCM and its token endpoint", { env: ["AUTOEND__FCM__TIMEOUT"] }),
  fcm_base_url: opt("endpoint", url, "https://fcm.googleapis.com", "FCM API base URL", { env: ["AUTOEND__FCM__BASE_URL"] }),
  apns_channels: opt("endpoint", text, undefined, "APNs channels as JSON: {\"<channel>\": {\"cert\": \"<PEM or path>\", \"key\": \"<PEM or path>\", \"key_id\"?, \"team_id\"?, \"topic\"?, \"sandbox\"?}}; key_id and team_id select token (p8) auth, else certificate auth", {
    secret: true,
    env: ["AUTOEND__APNS__CHANNELS"],
    defaultText: "unset (no APNs bridge)"
  }),
  apns_timeout: opt("endpoint", seconds, s(20), "Timeout of requests to APNs"),
  apns_base_url: opt("endpoint", url, undefined, "APNs base URL for every channel, instead of Apple's production or sandbox host (a proxy)", {
    defaultText: "https://api.push.apple.com, or https://api.sandbox.push.apple.com for sandbox channels"
  }),
  apns_ca: opt("endpoint", text, undefined, "Extra CA certificates (PEM, or the path of a PEM file) trusted for APNs connections", {
    defaultText: "unset (the system's CAs)"
  }),
  adm_credentials: opt("endpoint", text, undefined, "ADM profiles as JSON: {\"<profile>\": {\"client_id\": \"…\", \"client_secret\": \"…\"}}", {
    secret: true,
    env: ["AUTOEND__ADM__CREDENTIALS"],
    defaultText: "unset (no ADM bridge)"
  }),
  adm_min_ttl: opt("endpoint", seconds, s(60), "Smallest TTL (expiresAfter) given to ADM"),
  adm_max_ttl: opt("endpoint", seconds, s(2_419_200), "Largest TTL (expiresAfter) given to ADM (28 days)"),
  adm_timeout: opt("endpoint", seconds, s(3), "Timeout of requests to ADM and its token endpoint"),
  adm_base_url: opt("endpoint", url, "https://api.amazon.com", "ADM API base URL (token endpoint {url}/auth/O2/token, messages {url}/messaging/…)"),
  metrics_port: opt("endpoint", port, 8083, "Port of an endpoint node's private Prometheus listener (GET /metrics); the all-in-one serves /metrics on its router port instead")
} as const

type Options = typeof options
export type OptionName = keyof Options
type OptionValue<N extends OptionName> = Options[N] extends OptionDef<infer A, infer D> ? A | D : never

/** Options computed after merging when not set. */
type DerivedOption = "endpoint_url" | "router_url"

export const optionNames = Object.keys(options) as ReadonlyArray<OptionName>

export const isOptionName = (name: string): name is OptionName => Object.hasOwn(options, name)

export const optionsOf = (scopes: ReadonlyArray<Scope>): ReadonlyArray<OptionName> =>
  optionNames.filter((name) => scopes.includes(options[name].scope))

export const secretOptionNames = optionNames.filter((name) => options[name].secret)
/** The secret options; a test keeps this in step with the table's `secret` marks. */
export type SecretOption = RequiredSecret | "megaphone_api_token" | "broadcast_admin_tokens" | "console_token" | "fcm_credentials" | "apns_channels" | "adm_credentials" | "endpoint_tls_key" | "db_dsn"
/** The secrets a node may require at start. */
export type RequiredSecret = "crypto_key" | "auth_keys"

export const flagOf = (name: OptionName): string => `--${name.replaceAll("_", "-")}`

/** The environment variable naming the file a secret option is read from: its shortest name (an unprefixed alias when it has one) + `_FILE`. */
export const secretFileVar = (name: OptionName): string => `${[...envNamesOf(name)].sort((a, b) => a.length - b.length)[0]}_FILE`

/** What `--help` adds to a secret option: where to give it (a flag is visible to every user of the machine). */
export const secretNote = (name: OptionName): string => ` (secret: give it in a file named by ${secretFileVar(name)}, not as a flag)`

type Camel<S extends string> = S extends `${infer H}_${infer T}` ? `${H}${Capitalize<Camel<T>>}` : S
export const camel = <S extends string>(name: S): Camel<S> =>
  name.replace(/_([a-z])/g, (_, c: string) => c.toUpperCase()) as Camel<S>

export const scopeNames: ReadonlyArray<Scope> = ["shared", "connection", "endpoint"]

/** The scope whose prefix an environment name carries, if any. */
export const prefixScope = (key: string): Scope | undefined => scopeNames.find((scope) => key.startsWith(envPrefix[scope]))

/** The environment names that set an option for a role: canonical names, then aliases. */
export const envNamesOf = (name: OptionName, role: Role = "autopush"): ReadonlyArray<string> => {
  const def: OptionDef = options[name]
  const read = roleScopes[role]
  const canonical = read.filter((scope) => def.scope === "shared" || scope === def.scope)
  const aliases = def.env.filter((alias) => {
    const scope = prefixScope(alias)
    return scope === undefined || read.includes(scope)
  })
  return [...new Set([...canonical.map((scope) => envPrefix[scope] + name.toUpperCase()), ...aliases])]
}

/** The default written as it would be configured ("" when computed or unset). */
export const defaultSpelling = (name: OptionName): string => {
  const def: OptionDef = options[name]
  if (def.computed) return ""
  const value = def.default()
  return value === undefined ? "" : Schema.encodeSync(def.kind.codec as Schema.Codec<unknown, string>)(value)
}

/**
 * Typed, frozen settings: every option in camelCase (`router_port` → `routerPort`); `endpointUrl`
 * and `routerUrl` always resolved; durations as `Duration`; lists as readonly arrays; unset
 * optional options `undefined`.
 */
export type Settings = {
  readonly [N in OptionName as Camel<N>]: N extends DerivedOption ? string : OptionValue<N>
}

/** Option values keyed by option name, before derivation. */
export type OptionValues = { readonly [N in OptionName]: OptionValue<N> }
