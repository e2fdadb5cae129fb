/**
 * What every entrypoint shares: read the configuration, pick storage (the embedded SQLite database
 * unless a DynamoDB endpoint is configured), make sure the secrets exist, and build the node layers from the
 * settings. The `bin/` files only choose a role and call `runRole`.
 */
import * as NodeRuntime from "@effect/platform-node/NodeRuntime"
import * as Clock from "effect/Clock"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Logger from "effect/Logger"
import * as Redacted from "effect/Redacted"
import { bridgeOptionsOf } from "../bridges/Bridges.ts"
import { randomBytes } from "node:crypto"
import { homedir } from "node:os"
import { ConnectionNode, type ConnectionNodeOptions } from "../connection/node.ts"
import { changedSettings, type ConfigError, type HelpRequested, loadSettingsAndFiles, requireSecrets } from "../config/index.ts"
import type { Role, Settings } from "../config/index.ts"
import { EndpointCrypto } from "../crypto/endpoint.ts"
import { RouterAuth } from "../crypto/routerAuth.ts"
import { generateFernetKey } from "../crypto/fernet.ts"
import type { EndpointOptions } from "../endpoint/options.ts"
import { EndpointServer, nodeClientOptions } from "../endpoint/server.ts"
import { endpointTlsOf } from "../endpoint/tls.ts"
import { NodeRegistry } from "../connection/registry.ts"
import { NodeClient } from "../routers/NodeClient.ts"
import type { EventLog } from "../observability/EventLog.ts"
import type { Metrics } from "../observability/Metrics.ts"
import { EventLogOpenError } from "../observability/eventLogFile.ts"
import { observabilityLayer } from "../observability/observability.ts"
import { storageBreaker } from "../observability/storageBreaker.ts"
import { timedStorage } from "../observability/timedStorage.ts"
import { tracingLayer } from "../observability/tracing.ts"
import { versionInfo } from "../observability/version.ts"
import { loggingLayer } from "../observability/logging.ts"
import { MetricsListener } from "../observability/metricsListener.ts"
import { layerDynamo } from "../storage/dynamo/layer.ts"
import { announceEmbedded, EmbeddedDataError, startDynalite } from "../storage/dynalite/embedded.ts"
import { superviseWorkers, WorkerStartError } from "../workers/supervisor.ts"
import { tellSupervisor, WORKER, workerCountOf, workerPorts } from "../workers/worker.ts"
import { stopWhenSupervisorIsGone } from "../workers/supervisorGone.ts"
import { stopTeardown } from "../platform/teardown.ts"
import {
  embeddedDataDir,
  embeddedSecretsFile,
  embeddedSqliteFile,
  MIGRATE_EMBEDDED,
  postgresOptionsOf,
  readEmbeddedSecrets,
  type SecretsFileError,
  storageDescription,
  storageOptionsOf,
  usesEmbeddedSqlite,
  usesStoreServer,
  writeEmbeddedSecrets
} from "../tools/storage.ts"
import { layerPostgres } from "../storage/postgres/layer.ts"
import { postgresFailure } from "../storage/postgres/pool.ts"
import { layerSqlite } from "../storage/sqlite/layer.ts"
import { databaseFiles, makeDataPrivate, markDatabaseStarted, refuseLostDatabase, startedMarkerOf } from "../storage/sqlite/data.ts"
import { failureText, type Storage, StorageError } from "../storage/Storage.ts"
import { layerTableKeeper } from "../storage/tableKeeper.ts"
import * as HttpServerError from "effect/http/HttpServerError"
import { Broadcasts, megaphoneSource, storageSource } from "../broadcast/Broadcasts.ts"
import { listenFailure } from "../platform/listen.ts"
import { StartupError } from "../platform/startup.ts"
import { isPrivateBind, LOOPBACK } from "../platform/addresses.ts"

const ms = (d: Duration.Duration): number => Duration.toMillis(d)

/** Idle time and the per-address cap of the listening ports; the loopback and the trusted proxies are not capped. */
const socketLimitsOf = (settings: Settings) => ({
  idleTimeoutMs: ms(settings.clientIdleTimeout),
  maxPerAddress: settings.maxConnectionsPerAddress,
  exempt: [...LOOPBACK, ...settings.trustedProxies]
})

/**
 * Storage from settings: PostgreSQL (`db_dsn`), the dynalite store this process runs for an
 * earlier version's data (`embedded`, its endpoint) or the one a worker's supervisor runs for it, else the embedded SQLite
 * database under `data_dir` (every process of the host opens the file itself: workers, separate
 * nodes), or the configured DynamoDB endpoint; its tables kept present.
 */
const storageLayer = (settings: Settings, embedded: string | undefined): Layer.Layer<Storage, StorageError> => {
  if (settings.dbDsn !== undefined) return layerTableKeeper.pipe(Layer.provideMerge(layerPostgres(postgresOptionsOf(settings, settings.dbDsn))))
  const options = storageOptionsOf(settings)
  const local = embedded ?? WORKER?.storageEndpoint
  if (settings.storageEndpoint === undefined && local === undefined) {
    return layerTableKeeper.pipe(Layer.provideMerge(layerSqlite({ ...options, path: embeddedSqliteFile(settings) })))
  }
  return layerTableKeeper.pipe(
    Layer.provideMerge(layerDynamo({
      ...options,
      ...(local === undefined ? { endpoint: settings.storageEndpoint, region: settings.awsRegion } : { endpoint: local, region: "local" })
    }))
  )
}

/** Whether this process serves an earlier version's dynalite data under `data_dir` (not yet migrated to SQLite). */
const runsDynalite = (settings: Settings): boolean => !usesStoreServer(settings) && !usesEmbeddedSqlite(settings)

/**
 * The embedded store (dynalite) under `data_dir`, on 127.0.0.1 and `storage_port`, for the scope,
 * announced beside its data for the operators' tools: its endpoint URL.
 */
const startEmbeddedStore = (settings: Settings) =>
  Effect.gen(function*() {
    const endpoint = yield* startDynalite(embeddedDataDir(settings), { host: EMBEDDED_STORE_HOST, port: settings.storagePort, option: "storage_port" })
    yield* announceEmbedded(embeddedDataDir(settings), endpoint)
    return endpoint
  })

/** The embedded store listens on the loopback only: nothing but this machine's processes use it. */
const EMBEDDED_STORE_HOST = "127.0.0.1"

/**
 * Why a node could not start, as one line naming the option to change; undefined for what is not a
 * start-up failure of ours (a bug: it keeps its stack).
 */
const startupFailure = (settings: Settings, error: unknown): string | undefined => {
  if (error instanceof StartupError || error instanceof EventLogOpenError) return error.message
  if (error instanceof StorageError) {
    if (error.cause instanceof StartupError) return error.cause.message
    if (error.cause instanceof EmbeddedDataError) {
      return `${error.cause.message} (option data_dir${error.cause.inUse ? ": stop the other process, or give this one another data_dir" : ""})`
    }
    if (settings.dbDsn !== undefined) return `${storageDescription(settings)} cannot be used (option db_dsn): ${postgresFailure(error)}`
    return settings.storageEndpoint === undefined
      ? `the embedded storage (${storageDescription(settings)}) did not start (option data_dir): ${failureText(error)}`
      : `DynamoDB at ${settings.storageEndpoint} cannot be used (option storage_endpoint): ${failureText(error)}`
  }
  if (error instanceof HttpServerError.ServeError) return listenFailure("endpoint_port", settings.bindHost, settings.endpointPort, error.cause).message
  return undefined
}

/**
 * Secrets of the embedded all-in-one: generated once and kept beside its data (mode 0600), so that
 * `npm start` needs no configuration and endpoints stay valid across restarts.
 */
const embeddedSecrets = (settings: Settings) =>
  Effect.gen(function*() {
    const path = embeddedSecretsFile(settings)
    const failed = (error: SecretsFileError) => new StartupError({ message: error.message })
    const stored = yield* Effect.mapError(readEmbeddedSecrets(path), failed)
    const secrets = {
      crypto_key: settings.cryptoKey.length > 0 ? [...settings.cryptoKey] : stored?.crypto_key ?? [generateFernetKey()],
      auth_keys: settings.authKeys.length > 0 ? [...settings.authKeys] : stored?.auth_keys ?? [randomBytes(32).toString("base64url")]
    }
    if (stored === undefined && (settings.cryptoKey.length === 0 || settings.authKeys.length === 0)) {
      yield* Effect.mapError(writeEmbeddedSecrets(path, secrets), failed)
    }
    return { ...settings, cryptoKey: secrets.crypto_key, authKeys: secrets.auth_keys } satisfies Settings
  })

/**
 * The embedded data directory, before any process of the node opens it: made private (said once in
 * the log when it was open to others), and a database that lost its contents refused
 * (`sqlite/data.ts`).
 */
const embeddedDataChecked = (settings: Settings) =>
  Effect.gen(function*() {
    if (usesStoreServer(settings)) return
    const database = usesEmbeddedSqlite(settings) ? embeddedSqliteFile(settings) : undefined
    const files = [...(database === undefined ? [] : [...databaseFiles(database), startedMarkerOf(database)]), embeddedSecretsFile(settings)]
    const opened = yield* makeDataPrivate(settings.dataDir, files)
    if (opened.length > 0) {
      yield* Effect.logWarning(
        "the embedded data was open to other users of this machine (it holds every client's uaid, and the keys): made private, " +
          "the directory mode 0700 and its files 0600"
      ).pipe(Effect.annotateLogs({ paths: opened }))
    }
    if (database !== undefined) yield* refuseLostDatabase(database)
  })

/**
 * Once a node runs on the embedded database (its tables made), the database is recorded as used
 * (`sqlite/data.ts`): a start that later finds it lost is refused. A failure to record it is logged;
 * the node runs on.
 */
const markEmbeddedDatabase = (settings: Settings) =>
  usesEmbeddedSqlite(settings)
    ? Clock.currentTimeMillis.pipe(
      Effect.flatMap((now) => markDatabaseStarted(embeddedSqliteFile(settings), new Date(now))),
      Effect.catchTag("StartupError", (error) => Effect.logWarning(error.message))
    )
    : Effect.void

/** The settings a role runs with, secrets checked (or, embedded all-in-one, provided), and the ini files read. */
const settingsFor = (role: Role, argv: ReadonlyArray<string>) =>
  Effect.gen(function*() {
    const { settings, files, given } = yield* loadSettingsAndFiles({ role, argv, env: process.env, cwd: process.cwd(), home: homedir() })
    if (settings.dbDsn !== undefined && settings.storageEndpoint !== undefined) {
      return yield* new StartupError({ message: "db_dsn and storage_endpoint are both set: a node stores in PostgreSQL or in DynamoDB, set one (option db_dsn)" })
    }
    if (role === "autopush" && !usesStoreServer(settings)) return { settings: yield* embeddedSecrets(settings), files }
    if (!usesStoreServer(settings) && !settings.embeddedStorage) {
      // A node on its own with a store of its own cannot work with its peers: say so instead.
      return yield* new StartupError({
        message: "no storage_endpoint: the connection and endpoint nodes must share one store. Run `npm run storage -- --host <private address>` " +
          "(or use DynamoDB) and set storage_endpoint=http://<its host>:8000 on every node, or PostgreSQL: db_dsn=postgres://<user>:<password>@<host>/<database> on every node; or, for nodes on one host, set embedded_storage=true " +
          "and the same data_dir on each (they share its SQLite database)"
      })
    }
    yield* requireSecrets(settings, role === "autoconnect" ? ["crypto_key"] : ["crypto_key", "auth_keys"])
    if (role === "autoconnect" && !given.has("endpoint_url") && !given.has("endpoint_hostname")) {
      // Its own default (localhost) would be wrong on every other machine: endpoints that cannot be pushed to.
      return yield* new StartupError({
        message: `no endpoint_url: a connection node hands out the endpoint nodes' URLs in every subscription, and only you know them. ` +
          `Set endpoint_url to the URL app servers reach the endpoint nodes at (--endpoint-url https://push.example.com, or AUTOPUSH__ENDPOINT_URL), the same on every node`
      })
    }
    return { settings, files }
  })

/**
 * The WebSocket URL clients use: as configured, else what the connection port speaks, plain `ws://`,
 * on the endpoint URL's host. The endpoint's own TLS (`endpoint_tls_cert`) is the endpoint port's
 * only; `wss://` needs a TLS proxy in front of the connection port, and `websocket_url` naming it.
 */
const publicWebsocketUrl = (settings: Settings): string =>
  settings.websocketUrl ?? `ws://${new URL(settings.endpointUrl).hostname}:${settings.port}/`

/** Whether the console is served and who may open it: said at start, so nobody serves it unknowingly. */
const consoleReadyPart = (settings: Settings, endpoint: string): string =>
  !settings.console
    ? "web console off"
    : settings.consoleToken === undefined
    ? `web console ${endpoint}/ (public)`
    : `web console ${endpoint}/?token=… (console_token required)`

/**
 * The WebSocket URL the console of an endpoint node on its own gives its push client: as configured,
 * else the connection port on the host the page was loaded from (right only when a connection
 * node runs there).
 */
const consoleWebsocketPart = (settings: Settings): string =>
  settings.websocketUrl === undefined
    ? `its push client connects to ws://<the host it was loaded from>:${settings.port}/ (set websocket_url)`
    : `its push client connects to ${settings.websocketUrl}`

/** A port a node listens on, as the ready line names it. */
interface Listening {
  readonly what: string
  readonly host: string
  /** One per worker for the private ports of a node run as several. */
  readonly ports: ReadonlyArray<number>
  /** Meant for this machine or the nodes' private network only. */
  readonly private: boolean
}

/**
 * Every port a node opens (run as `workers`, its workers' too) with its bind address, and the
 * embedded store's (`store`: its endpoint) when this process runs it.
 */
export const listeningPorts = (role: Role, settings: Settings, workers: number, store: string | undefined): ReadonlyArray<Listening> => {
  const privatePorts = workers === 1 ? [role === "autoendpoint" ? settings.metricsPort : settings.routerPort] : workerPorts(role, settings, workers)
  const storeUrl = store === undefined ? undefined : new URL(store)
  return [
    ...(role === "autoendpoint" ? [] : [{ what: "WebSocket", host: settings.bindHost, ports: [settings.port], private: false }]),
    ...(role === "autoconnect" ? [] : [{ what: "Web Push API", host: settings.bindHost, ports: [settings.endpointPort], private: false }]),
    { what: role === "autoendpoint" ? "metrics" : "router", host: privateBindHost(settings, role), ports: privatePorts, private: true },
    ...(storeUrl === undefined ? [] : [{ what: "embedded storage", host: storeUrl.hostname, ports: [Number(storeUrl.port)], private: true }])
  ]
}

/** Whether a node opens the embedded SQLite database (the all-in-one, or a node allowed `embedded_storage`) rather than a dynalite `store` or DynamoDB. */
const opensSqlite = (role: Role, settings: Settings, store: string | undefined): boolean =>
  store === undefined && settings.storageEndpoint === undefined && (role === "autopush" || settings.embeddedStorage) && usesEmbeddedSqlite(settings)

/** `router on 127.0.0.1:8081 (private)`; a private port bound to an address that is not private says so. */
const listeningText = (listening: Listening): string => {
  const host = listening.host.includes(":") && !listening.host.startsWith("[") ? `[${listening.host}]` : listening.host
  const where = `${listening.what} on ${host}:${listening.ports.join(", ")}`
  if (!listening.private) return where
  if (isPrivateBind(listening.host)) return `${where} (private)`
  const why = listening.host === "0.0.0.0" || listening.host === "::" ? "every interface" : "not a private address"
  return `${where} (${why}, NOT private: keep it off the internet or set private_bind_host)`
}

/**
 * The store a node uses, as its ready line names it: the database server (PostgreSQL's host, port
 * and database, never its user or password; DynamoDB's endpoint) or the SQLite file. An earlier
 * version's dynalite store is named with the ports instead.
 */
const storageReadyPart = (role: Role, settings: Settings, store: string | undefined): ReadonlyArray<string> =>
  usesStoreServer(settings)
    ? [`storage ${storageDescription(settings)}`]
    : opensSqlite(role, settings, store)
    ? [`storage ${embeddedSqliteFile(settings)} (SQLite, no port)`]
    : []

/**
 * The one line that says a node is up: the URLs to use, and every port it listens on. `workers`:
 * the processes a supervisor started; `store`: the embedded store this process runs.
 */
export const readyLine = (role: Role, settings: Settings, options: { readonly workers?: number; readonly store?: string | undefined } = {}): string => {
  const workers = options.workers ?? 1
  const endpoint = settings.endpointUrl.replace(/\/+$/, "")
  const parts = [
    ...(role === "autoendpoint" ? [] : [`WebSocket ${publicWebsocketUrl(settings)}`]),
    ...(role === "autoconnect" ? [`endpoints ${endpoint}/wpush/…`, `router URL ${settings.routerUrl}`] : [`Web Push API ${endpoint}/wpush/…`]),
    ...(role === "autoconnect" ? [] : [consoleReadyPart(settings, endpoint)]),
    ...(role === "autoendpoint" && settings.console ? [consoleWebsocketPart(settings)] : []),
    ...(workers === 1 ? [] : [`${workers} workers`]),
    ...storageReadyPart(role, settings, options.store),
    `listening: ${listeningPorts(role, settings, workers, options.store).map(listeningText).join(", ")}`
  ]
  return `ready: ${parts.join(" · ")}`
}

const cryptoLayer = (settings: Settings) =>
  Layer.mergeAll(
    EndpointCrypto.layer({ keys: Redacted.make(settings.cryptoKey), endpointUrl: settings.endpointUrl }),
    RouterAuth.layer({ keys: Redacted.make(settings.cryptoKey), acceptUnsigned: settings.routerAcceptUnsigned })
  )

/** Where private listeners bind: as configured, else loopback for the all-in-one (nothing else needs them), `bind_host` for a node on its own. */
const privateBindHost = (settings: Settings, role: Role): string =>
  settings.privateBindHost ?? (role === "autopush" ? "127.0.0.1" : settings.bindHost)

/** The connection node's options from the settings. */
export const connectionNodeOptions = (settings: Settings, role: Role = "autoconnect"): Omit<ConnectionNodeOptions, "routerUrl"> => ({
  port: settings.port,
  routerPort: settings.routerPort,
  bindHost: settings.bindHost,
  routerBindHost: privateBindHost(settings, role),
  helloTimeoutMs: ms(settings.helloTimeout),
  autoPingIntervalMs: ms(settings.autoPingInterval),
  autoPingTimeoutMs: ms(settings.autoPingTimeout),
  minPingIntervalMs: ms(settings.minPingInterval),
  msgLimit: settings.msgLimit,
  clientChannelCapacity: settings.clientChannelCapacity,
  inboxFrames: settings.clientInboxFrames,
  inboxBytes: settings.clientInboxBytes,
  messageTablePrefix: settings.messageTablename,
  noTableRotation: settings.noTableRotation,
  // Stored messages per page: 25 is what one BatchWriteItem deletes once the page is acked; autopush's
  // 10 halved the drain rate on embedded storage (bench:stored 1,062 vs 2,015 msg/s).
  pageSize: 25,
  maxChannels: settings.maxChannelsPerUser,
  commandsPerSecond: settings.clientCommandsPerSecond,
  commandBurst: settings.clientCommandBurst,
  storageRetryMs: 250,
  storageRetryMaxMs: 30_000,
  saveRetryForMs: 300_000,
  requireVapid: settings.requireVapid,
  closeGraceMs: ms(settings.closeGrace),
  tickMs: 1_000,
  peerTimeoutMs: ms(settings.connectionTimeout),
  maxMessageBytes: settings.maxMessageSize,
  maxConnections: settings.maxConnections,
  maxSendBufferBytes: settings.maxSendBuffer,
  maxControlFramesPerSecond: settings.maxControlFramesPerSecond,
  clientRequestTimeoutMs: ms(settings.clientRequestTimeout),
  socketLimits: socketLimitsOf(settings),
  shutdownTimeoutMs: ms(settings.shutdownTimeout),
  worker: WORKER?.index,
  receiptRetentionSeconds: Math.floor(Duration.toSeconds(settings.receiptSubscriptionIdle)),
  storageName: storageDescription(settings)
})

/** The client connection nodes reach each other with (pokes, stale-session kicks). */
const peerClientLayer = (settings: Settings) =>
  NodeClient.layer({ connectTimeoutMs: ms(settings.connectionTimeout), requestTimeoutMs: ms(settings.connectionTimeout) })

/** A megaphone answer taking longer than this is a failed poll (the last good set stays). */
const MEGAPHONE_TIMEOUT_MS = 5_000

/** The broadcast set: polled from megaphone when configured, else from storage. */
const broadcastsLayer = (settings: Settings) => {
  const interval = ms(settings.megaphonePollInterval)
  return settings.megaphoneApiUrl !== undefined
    ? Broadcasts.layerPolling(
      megaphoneSource({ url: settings.megaphoneApiUrl, token: settings.megaphoneApiToken === undefined ? undefined : Redacted.make(settings.megaphoneApiToken), timeoutMs: MEGAPHONE_TIMEOUT_MS }),
      interval,
      "megaphone"
    )
    : Layer.unwrap(Effect.map(storageSource, (source) => Broadcasts.layerPolling(source, interval, "storage")))
}

export const connectionLayer = (settings: Settings, role: Role = "autoconnect") =>
  ConnectionNode.layer(connectionNodeOptions(settings, role), () => settings.routerUrl).pipe(
    Layer.provide(peerClientLayer(settings)),
    Layer.provide(broadcastsLayer(settings))
  )

/** The endpoint node's options; the bridge options are read (files, JSON) here, failing with a line naming the option. */
const endpointOptions = (settings: Settings): Effect.Effect<EndpointOptions, StartupError> =>
  Effect.zipWith(endpointTlsOf(settings.endpointTlsCert, settings.endpointTlsKey), bridgeOptionsOf({
    stub: settings.bridgeStub,
    fcmCredentials: settings.fcmCredentials,
    fcmMinTtl: Math.floor(Duration.toSeconds(settings.fcmMinTtl)),
    fcmMaxTtl: Math.floor(Duration.toSeconds(settings.fcmMaxTtl)),
    fcmTimeoutMs: ms(settings.fcmTimeout),
    fcmBaseUrl: settings.fcmBaseUrl,
    apnsChannels: settings.apnsChannels,
    apnsTimeoutMs: ms(settings.apnsTimeout),
    apnsBaseUrl: settings.apnsBaseUrl,
    apnsCa: settings.apnsCa,
    admCredentials: settings.admCredentials,
    admMinTtl: Math.floor(Duration.toSeconds(settings.admMinTtl)),
    admMaxTtl: Math.floor(Duration.toSeconds(settings.admMaxTtl)),
    admTimeoutMs: ms(settings.admTimeout),
    admBaseUrl: settings.admBaseUrl
  }), (tls, bridges) => ({
    endpointUrl: settings.endpointUrl,
    tls,
    port: settings.endpointPort,
    bindHost: settings.bindHost,
    worker: WORKER?.index,
    maxDataBytes: settings.maxDataBytes,
    maxStoredPerSubscription: settings.maxStoredPerSubscription,
    requireVapid: settings.requireVapid,
    rateLimits: {
      perAddress: { perSecond: settings.rateLimitPerAddress, burst: settings.rateLimitBurstPerAddress },
      perVapidKey: { perSecond: settings.rateLimitPerVapidKey, burst: settings.rateLimitBurstPerVapidKey },
      perSubscription: { perSecond: settings.rateLimitPerSubscription / 60, burst: settings.rateLimitBurstPerSubscription },
      trustedProxies: settings.trustedProxies
    },
    maxNotificationTtl: Math.floor(Duration.toSeconds(settings.maxNotificationTtl)),
    matrixGatewayTtl: Math.floor(Duration.toSeconds(settings.matrixGatewayTtl)),
    connectionTimeoutMs: ms(settings.connectionTimeout),
    requestTimeoutMs: ms(settings.requestTimeout),
    shutdownTimeoutMs: ms(settings.shutdownTimeout),
    clientRequestTimeoutMs: ms(settings.clientRequestTimeout),
    socketLimits: socketLimitsOf(settings),
    maxInFlightRequests: settings.maxInFlightRequests,
    routerCache: { ttlMs: ms(settings.routerCacheTtl), entries: settings.routerCacheEntries },
    receipts: {
      idleSeconds: Math.floor(Duration.toSeconds(settings.receiptSubscriptionIdle)),
      maxWaitMs: ms(settings.receiptMaxWait),
      maxHoldMs: ms(settings.receiptMaxHold),
      maxCollectorsPerSubscription: settings.receiptMaxCollectorsPerSubscription,
      maxCollectorsPerAddress: settings.receiptMaxCollectorsPerAddress,
      subscriptionsPerAddress: settings.receiptSubscriptionsPerAddress,
      maxCollectors: settings.receiptMaxCollectors
    },
    broadcastAdminTokens: settings.broadcastAdminTokens.map((token) => Redacted.make(token)),
    storageName: storageDescription(settings),
    version: versionInfo.version,
    build: versionInfo,
    authKeys: Redacted.make(settings.authKeys),
    maxChannelsPerUser: settings.maxChannelsPerUser,
    bridges,
    console: settings.console
      ? {
        websocketUrl: settings.websocketUrl,
        websocketPort: settings.port,
        endpointUrl: settings.endpointUrl,
        maxDataBytes: settings.maxDataBytes,
        token: settings.consoleToken === undefined ? undefined : Redacted.make(settings.consoleToken),
        version: versionInfo.version,
        commit: versionInfo.commit
      }
      : undefined
  }))

const logEndpointListening = (settings: Settings) => <A, E, R>(layer: Layer.Layer<A, E, R>) =>
  layer.pipe(
    Layer.tap(() =>
      Effect.logInfo("endpoint node listening").pipe(
        Effect.annotateLogs({ port: settings.endpointPort, endpointUrl: settings.endpointUrl })
      )
    )
  )

/** A separate endpoint node: the public API, and `/metrics` on its private listener. */
export const endpointLayer = (settings: Settings) =>
  Layer.unwrap(Effect.map(endpointOptions(settings), EndpointServer.layer)).pipe(
    Layer.provideMerge(MetricsListener.layer({
      port: settings.metricsPort,
      host: privateBindHost(settings, "autoendpoint"),
      clientRequestTimeoutMs: ms(settings.clientRequestTimeout)
    })),
    logEndpointListening(settings)
  )

/**
 * Both nodes in one process. The endpoint hands deliveries for this process's own connection node
 * over directly instead of through a loopback request to its router port.
 */
export const allInOneLayer = (settings: Settings) => Layer.unwrap(Effect.map(endpointOptions(settings), (options) => {
  const local = Effect.gen(function*() {
    const node = yield* ConnectionNode
    const registry = yield* NodeRegistry
    return { nodeId: node.routerUrl, push: registry.deliver, notify: registry.checkStorage }
  })
  const endpoint = EndpointServer.layerWith(options, NodeClient.layerWithLocal(nodeClientOptions(options), local)).pipe(
    logEndpointListening(settings)
  )
  return endpoint.pipe(Layer.provideMerge(connectionLayer(settings, "autopush")))
}))

/** The storage breaker of every backend, from the settings: operations refused at once while the store cannot be reached. */
const breakerOf = (settings: Settings) =>
  storageBreaker({ threshold: settings.storageBreakerThreshold, maxBackoffMs: ms(settings.storageBreakerMaxBackoff) })

/**
 * A role's node layers with what they run on: the given storage (behind the breaker, timed), the crypto keys, one
 * observability instance (metrics, event log, trace), shared by both nodes of the all-in-one, and
 * the tracer (OTLP, or tracing off).
 */
export const withServices = <SE>(role: Role, settings: Settings, storage: Layer.Layer<Storage, SE>) =>
<A, E>(nodes: Layer.Layer<A, E, Storage | EndpointCrypto | RouterAuth | EventLog | Metrics>) =>
  nodes.pipe(
    Layer.provide(Layer.mergeAll(timedStorage.pipe(Layer.provide(breakerOf(settings)), Layer.provide(storage)), cryptoLayer(settings))),
    Layer.provideMerge(
      observabilityLayer({ role, statsdHost: settings.statsdHost, statsdPort: settings.statsdPort, eventLog: settings.eventLog, worker: WORKER?.index })
    ),
    Layer.provide(tracingLayer({ otlpEndpoint: settings.otlpEndpoint, serviceName: role, serviceVersion: versionInfo.version }))
  )

/**
 * A node that cannot start: one line on stderr (it names the option to change), exit code 1. A
 * worker hands the line to its supervisor, which prints it once for all the workers.
 */
const refuse = (role: Role, line: string) =>
  Effect.sync(() => {
    if (WORKER === undefined || !tellSupervisor({ type: "failed", line })) process.stderr.write(`${role}: ${line}\n`)
    process.exitCode = 1
  })

/**
 * Run a role's layers until SIGINT/SIGTERM. A configuration error or a failure to start prints one
 * line and exits 1; `--help` exits 0.
 */
export const runRole = <A, E>(
  role: Role,
  nodes: (settings: Settings) => Layer.Layer<A, E, Storage | EndpointCrypto | RouterAuth | EventLog | Metrics>
) => {
  const launch = ({ settings, files }: { readonly settings: Settings; readonly files: ReadonlyArray<string> }) => {
    const logging = loggingLayer({ human: settings.humanLogs, level: settings.logLevel, role, hostname: settings.hostname, worker: WORKER?.index })
    const workers = WORKER === undefined ? workerCountOf(settings.workers) : 1
    const run: Effect.Effect<void, unknown> = WORKER !== undefined
      ? runWorker(withServices(role, settings, storageLayer(settings, undefined))(nodes(settings)))
      : workers > 1
      ? superviseNode(role, settings, workers)
      : Effect.scoped(Effect.gen(function*() {
        const store = runsDynalite(settings) ? yield* startEmbeddedStore(settings) : undefined
        return yield* Layer.launch(Layer.tap(
          withServices(role, settings, storageLayer(settings, store))(nodes(settings)),
          () => Effect.andThen(markEmbeddedDatabase(settings), Effect.logInfo(readyLine(role, settings, { store })))
        ))
      }))
    return Effect.gen(function*() {
      if (WORKER === undefined) {
        yield* Effect.logInfo("starting").pipe(Effect.annotateLogs({
          role,
          config_files: files.length > 0 ? files : "none found (defaults, environment and flags)",
          settings_changed: changedSettings(settings)
        }))
        if (usesEmbeddedSqlite(settings)) {
          yield* Effect.logInfo("embedded storage (SQLite); keys of this node are kept beside it").pipe(
            Effect.annotateLogs({ data: embeddedSqliteFile(settings), secrets: embeddedSecretsFile(settings) })
          )
        } else if (!usesStoreServer(settings)) {
          yield* Effect.logWarning(
            `embedded storage (dynalite): ${embeddedDataDir(settings)} holds the data of an earlier version, and keeps running on it. ` +
              `To move it to SQLite (the default, faster): ${MIGRATE_EMBEDDED}`
          ).pipe(Effect.annotateLogs({ data: embeddedDataDir(settings), secrets: embeddedSecretsFile(settings) }))
        }
        yield* Effect.forkChild(stopWhenPackageManagerIsGone(role))
      }
      // The workers find the data directory as their supervisor left it.
      const prepared = WORKER === undefined ? embeddedDataChecked(settings) : Effect.void
      return yield* Effect.andThen(prepared, run).pipe(
        Effect.catch((error) => {
          if (error instanceof WorkerStartError) return refuse(role, error.line)
          const failure = startupFailure(settings, error)
          return failure === undefined ? Effect.fail(error) : refuse(role, `cannot start: ${failure}`)
        })
      )
    }).pipe(Effect.provide(logging))
  }
  const program = settingsFor(role, process.argv.slice(2)).pipe(
    Effect.matchEffect({
      onFailure: (error: ConfigError | HelpRequested | StartupError) =>
        error._tag === "HelpRequested"
          ? Effect.sync(() => void process.stdout.write(`${error.text}\n`))
          : refuse(role, error._tag === "StartupError" ? `cannot start: ${error.message}` : `configuration error: ${error.message}`),
      onSuccess: launch
    })
  )
  NodeRuntime.runMain(program, { teardown: stopTeardown })
}

/**
 * A node as `workers` processes, supervised until SIGINT/SIGTERM, which stops them all. Each opens
 * the embedded SQLite database itself; dynalite data of an earlier version is served to them by a
 * dynalite this process runs.
 */
const superviseNode = (role: Role, settings: Settings, workers: number) =>
  Effect.scoped(Effect.gen(function*() {
    let storageEndpoint: string | undefined
    if (runsDynalite(settings)) storageEndpoint = yield* startEmbeddedStore(settings)
    yield* superviseWorkers({ role, settings, count: workers, argv: process.argv.slice(2), storageEndpoint })
    yield* markEmbeddedDatabase(settings)
    yield* Effect.logInfo(readyLine(role, settings, { workers, store: storageEndpoint }))
    return yield* Effect.never
  }))

/**
 * A worker's node: it tells its supervisor once it is ready, and stops when the supervisor is gone,
 * rather than live on as an orphan holding a share of the ports (`stopWhenSupervisorIsGone`).
 */
const runWorker = <A, E>(app: Layer.Layer<A, E>) =>
  Effect.gen(function*() {
    const loggers = yield* Logger.CurrentLoggers
    const gone = stopWhenSupervisorIsGone(WORKER?.storageEndpoint !== undefined, loggers)
    // The channel alone must not keep a worker alive: one that could not start has to exit.
    process.channel?.unref()
    return yield* Layer.launch(Layer.tap(app, () =>
      Effect.sync(() => tellSupervisor({ type: "ready" })).pipe(Effect.andThen(Effect.logInfo("worker ready"))))).pipe(
        Effect.provideService(Logger.CurrentLoggers, gone.loggers)
      )
  })

/**
 * The npm (or npx, yarn, pnpm) process that started this server, when one did: its pid, taken at
 * start. A package manager running a script says so in the environment it gives it
 * (`npm_lifecycle_event`, `npm_execpath`); a server started with `node` directly, by a shell, `nohup`,
 * init, systemd or Docker has no such parent.
 */
const packageManagerParent = (env: NodeJS.ProcessEnv, ppid: number): number | undefined =>
  ppid > 1 && (env["npm_lifecycle_event"] !== undefined || env["npm_execpath"] !== undefined) ? ppid : undefined

const PARENT_AT_START = packageManagerParent(process.env, process.ppid)

/**
 * A server run by `npm start` whose npm goes away (npm killed) stops as on SIGTERM, saying why in
 * one line, rather than live on as an orphan holding its ports and data. Any other parent may go
 * away: `nohup node bin/autopush.js &` outlives the shell that started it.
 */
const stopWhenPackageManagerIsGone = (role: Role) =>
  Effect.gen(function*() {
    const parent = PARENT_AT_START
    if (parent === undefined) return
    while (process.ppid === parent) yield* Effect.sleep("1 second")
    yield* Effect.logWarning(
      `stopping: the npm process that started this ${role} (pid ${parent}) is gone. ` +
        "To keep a server running on its own, start it without npm: `node bin/" + role + ".js` (with nohup, or under a service manager)"
    )
    process.kill(process.pid, "SIGTERM")
  })
