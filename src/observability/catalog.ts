/**
 * Every metric this service emits: name (statsd/DogStatsD name, after the `{role}.` prefix), kind,
 * tags and meaning. The names follow autopush-rs where it has one, so its dashboards keep working. The README's
 * metrics table is made from this list; Prometheus names are derived by `prometheusName`.
 */

export type MetricKind = "counter" | "gauge" | "timer"

interface MetricInfo {
  readonly name: string
  readonly kind: MetricKind
  readonly tags: Readonly<Record<string, string>>
  /** Which node emits it: connection, endpoint, or both. */
  readonly node: "connection" | "endpoint" | "both"
  readonly help: string
}

const m = (
  name: string,
  kind: MetricKind,
  node: MetricInfo["node"],
  help: string,
  tags: Readonly<Record<string, string>> = {}
): MetricInfo => ({ name, kind, tags, node, help })

export const METRICS = {
  // ── connection node (domain events of the session machine) ──
  hello: m("ua.command.hello", "counter", "connection", "Hello commands answered", {
    uaid: "new / existing / reassigned (a claimed uaid that could not be resumed)"
  }),
  register: m("ua.command.register", "counter", "connection", "Channels registered"),
  unregister: m("ua.command.unregister", "counter", "connection", "Channels unregistered", {
    code: "200 / 201 / 202 / 203 (the client's reason) / none / other"
  }),
  ack: m("ua.command.ack", "counter", "connection", "Messages acknowledged by clients", {
    source: "direct / stored",
    code: "100 delivered / 101 decryption error / 102 not delivered / other"
  }),
  refused: m("ua.command.refused", "counter", "connection", "Registers and unregisters answered with an error status at a limit", {
    command: "register / unregister",
    reason: "too_many_channels (413, max_channels_per_user) / busy (503, 32 commands already wait while the user's messages move to this month's table)"
  }),
  deliveryQueueFull: m("ua.delivery.queue_full", "counter", "connection", "Deliveries refused because the connection held client_channel_capacity messages already, queued or sent and not acked (the endpoint stores them; the client reads them from storage)"),
  routerAuthRefused: m("router.auth.refused", "counter", "connection", "Requests between nodes refused on the router port for their signature (401 unsigned, 403 otherwise); unsigned ones let through by router_accept_unsigned are counted as accepted_unsigned", {
    reason: "unsigned / malformed / stale (outside ±60 s) / bad_signature (another key, or the method, path or body changed) / accepted_unsigned"
  }),
  nack: m("ua.command.nack", "counter", "connection", "Negative acknowledgements", { code: "301 / 302 / 303 / 0" }),
  urgency: m("ua.command.urgency", "counter", "connection", "Minimum urgencies set by clients (RFC 8030 §5.3)", {
    min: "very-low / low / normal / high"
  }),
  sent: m("ua.notification.sent", "counter", "connection", "Notifications sent to clients", { source: "direct / stored" }),
  retrieved: m("notification.message.retrieved", "counter", "connection", "Stored notifications sent to clients"),
  expiration: m("ua.expiration", "counter", "connection", "Users dropped; their next hello gets a new uaid", {
    reason: "too_many_messages / stale_month"
  }),
  migrated: m("ua.month.migrated", "counter", "connection", "Users moved to the current month's message table"),
  closed: m("ua.connection.closed", "counter", "connection", "WebSockets closed by the server", {
    code: "close code",
    reason: "close reason (Ghost, HandshakeTimeout, PongTimeout, Shutdown, ...)"
  }),
  broadcastDelivered: m("ua.broadcast.delivered", "counter", "connection", "Broadcast updates sent to clients", {
    reason: "hello / subscribe / change"
  }),
  megaphoneOk: m("megaphone.updater.ok", "counter", "connection", "Polls of the broadcast source (megaphone or storage) that brought a set"),
  megaphoneError: m("megaphone.updater.error", "counter", "connection", "Polls of the broadcast source that failed (the last good set stays in force)", {
    reason: "unreachable / timeout / status / too_large / not_json / invalid / storage"
  }),
  connections: m("ua.connections", "gauge", "connection", "Identified sessions (after hello) on this node"),
  sockets: m("ua.sockets", "gauge", "connection", "Open WebSockets on this node, identified or not"),
  paused: m("ua.connection.paused", "counter", "connection", "Times a client's socket stopped being read (back-pressure; it is read again later, the client is not closed)", {
    reason: "inbox (client_inbox_frames / client_inbox_bytes waiting) / commands (commands waiting for client_commands_per_second)"
  }),
  receiptWritesQueued: m("notification.receipt.writes.queued", "gauge", "connection", "Receipt status writes waiting on this node (at most 10,000)"),
  receiptWritesDropped: m("notification.receipt.writes.dropped", "counter", "connection", "Receipt status writes dropped because 10,000 were waiting already (storage slow or not answering)"),
  // ── both ──
  stored: m("notification.message.stored", "counter", "both", "Notifications written to storage", {
    reason: "offline (endpoint: client not connected) / disconnect (connection node: unacked at disconnect)"
  }),
  expired: m("notification.message.expired", "counter", "both", "Notifications dropped for their TTL (TTL 0 not delivered, or expired before delivery)"),
  deleted: m("notification.message.deleted", "counter", "endpoint", "Notifications cancelled by the sender (DELETE /m/{id})"),
  storageTime: m("storage.time", "timer", "both", "Storage operations (when storage is wrapped by timedStorage)", {
    operation: "getUser / saveMessage / fetchTimestampMessages / ...",
    outcome: "ok / error"
  }),
  storageBreakerOpen: m("storage.breaker.open", "gauge", "both", "1 while the storage breaker is open (the store could not be reached: storage operations fail at once, one probe at a time reaches it), else 0"),
  storageBreakerOpened: m("storage.breaker.opened", "counter", "both", "Times the storage breaker opened (storage_breaker_threshold unreachable failures in a row)"),
  // ── endpoint node ──
  received: m("notification.received", "counter", "endpoint", "Notifications accepted (valid POST /wpush/...)"),
  routed: m("notification.routed", "counter", "endpoint", "Accepted notifications by routing outcome (refused: its subscription had max_stored_per_subscription stored, 429/119)", {
    outcome: "direct / stored / dropped / bridged / failed / refused"
  }),
  routeTime: m("notification.route_time", "timer", "endpoint", "Time to route an accepted notification", {
    outcome: "direct / stored / dropped / bridged / failed / refused"
  }),
  bridgeSent: m("notification.bridge.sent", "counter", "endpoint", "Notifications a bridge's platform accepted", {
    platform: "fcm / apns / adm / stub"
  }),
  bridgeError: m("notification.bridge.error", "counter", "endpoint", "Notifications a bridge's platform did not take", {
    platform: "fcm / apns / adm / stub",
    reason: "not_configured / auth / connection / timeout / upstream / rate_limited / unavailable / recipient_gone / too_large"
  }),
  receiptRequested: m("notification.receipt.requested", "counter", "endpoint", "Notifications accepted with Push-Receipt (RFC 8030 §5.1)"),
  receipt: m("notification.receipt", "counter", "both", "Outcomes recorded for notifications sent with a receipt (the first of each message)", {
    outcome: "acknowledged / rejected / expired / deleted / unsubscribed / bridged"
  }),
  receiptCollectors: m("notification.receipt.collectors", "gauge", "endpoint", "GETs of receipt subscriptions held open (collectors) on this node"),
  receiptCollectorsRefused: m("notification.receipt.collectors.refused", "counter", "endpoint", "GETs of receipt subscriptions refused at a collector cap", {
    limit: "subscription / address (429/116) / node (503/201)"
  }),
  receiptCollectorsEnded: m("notification.receipt.collectors.ended", "counter", "endpoint", "Collectors ended by the service: streams (server-sent events, HTTP/2 server push) at receipt_max_hold, or any collector still busy 5 s after it", {
    reason: "max_hold (the stream ends, a server-push GET is answered 204) / stalled (storage or the client did not finish in time: 503/201, or the stream is cut)"
  }),
  matrixNotify: m("matrix.notify", "counter", "endpoint", "Devices of the Matrix push gateway's notify requests (POST /_matrix/push/v1/notify), by what became of each", {
    outcome: "delivered (accepted by the push path: sent, stored or bridged) / rejected (not ours, or a push would be 404/410/401: named in `rejected`) / duplicate (the same event_id already sent to that pushkey within 10 min) / failed (not pushed: a transient failure, answered with an error so that the homeserver retries, or a message that cannot fit)"
  }),
  senderWarning: m("notification.sender.warning", "counter", "endpoint", "Accepted pushes another push service would refuse, by why (the answer carries Autopush-Warning; the console lists them per VAPID key)", {
    kind: "vapid-sub-local / vapid-sub-missing / vapid-long-lived / vapid-draft-scheme / aesgcm"
  }),
  rateLimited: m("notification.rate_limited", "counter", "endpoint", "Requests answered 429/116 at a rate limit (pushes, and the other routes' requests at their address's), by the limit", {
    limit: "address (rate_limit_per_address) / vapid_key (rate_limit_per_vapid_key) / subscription (rate_limit_per_subscription) / bad_signature (pushes from that address claiming their subscription's key whose signature failed, at rate_limit_per_address)"
  }),
  inFlight: m("request.in_flight", "gauge", "endpoint", "HTTP requests being handled"),
  requestTime: m("request.time", "timer", "endpoint", "HTTP requests handled", {
    route: "push / message / receipts / registration / broadcasts / matrix / health / metrics / other",
    status: "HTTP status"
  }),
  requestError: m("request.error", "counter", "endpoint", "Error responses by errno", {
    errno: "the error JSON's errno (none when null)",
    status: "HTTP status"
  }),
  // ── the listening ports (every node) ──
  netConnections: m("net.connections", "gauge", "both", "Open TCP connections of a listening port (WebSockets, HTTP/1.1 and HTTP/2 connections, not yet identified ones too)", {
    port: "endpoint / websocket / router"
  }),
  netRefused: m("net.connection.refused", "counter", "both", "Connections refused when opened (HTTP 503 Too many connections, or closed)", {
    port: "endpoint / websocket",
    reason: "per_address (max_connections_per_address) / max_connections (WebSocket upgrades)"
  }),
  netTimeout: m("net.connection.timeout", "counter", "both", "Connections closed by the server for their silence", {
    port: "endpoint / websocket / router",
    phase: "request (nothing, or not a whole first request, within client_request_timeout) / idle (no request for client_idle_timeout)"
  }),
  // ── the process (every node) ──
  buildInfo: m("build_info", "gauge", "both", "Always 1; its tags say what runs", {
    version: "the package version",
    commit: "the git commit (or unknown)",
    node: "the Node.js version"
  }),
  residentMemory: m("process.resident_memory_bytes", "gauge", "both", "Resident set size of the process (bytes)"),
  heapUsed: m("process.heap_used_bytes", "gauge", "both", "V8 heap in use (bytes)"),
  cpu: m("process.cpu_seconds", "gauge", "both", "CPU time used since start, user and system (seconds; rate() is the cores in use)"),
  uptime: m("process.uptime_seconds", "gauge", "both", "Seconds since the process started"),
  openSockets: m("process.open_sockets", "gauge", "both", "Open TCP sockets of the process (clients, storage, peers), listeners not counted"),
  eventLoopDelay: m("nodejs.eventloop_delay_p99_ms", "gauge", "both", "99th percentile of the event-loop delay since the previous reading (ms): high, the process is busy and every answer waits"),
  gc: m("nodejs.gc", "timer", "both", "Garbage-collection pauses (ms)", { kind: "minor / major / incremental / weakcb" }),
  // ── the event log itself ──
  eventLogDropped: m("event_log.dropped", "counter", "both", "Event-log lines dropped because the file could not keep up")
} as const satisfies Readonly<Record<string, MetricInfo>>

const byName: ReadonlyMap<string, MetricInfo> = new Map(Object.values(METRICS).map((info) => [info.name, info]))

export const metricInfo = (name: string): MetricInfo | undefined => byName.get(name)

/** Prometheus metric name rules: `[a-zA-Z_:][a-zA-Z0-9_:]*`. */
const sanitize = (name: string): string => {
  const s = name.replace(/[^a-zA-Z0-9_:]/g, "_")
  return /^[0-9]/.test(s) ? `_${s}` : s
}

/**
 * The Prometheus family name: dots become underscores; counters end in `_total`; timers are
 * histograms in milliseconds (`_milliseconds`, with `_bucket`, `_sum`, `_count`).
 */
export const prometheusName = (name: string, kind: MetricKind): string => {
  const base = sanitize(name)
  return kind === "counter" ? `${base}_total` : kind === "timer" ? `${base}_milliseconds` : base
}
