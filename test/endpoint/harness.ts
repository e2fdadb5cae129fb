/**
 * The endpoint under test: the real HTTP server on port 0 over in-memory storage, the test crypto
 * keys, an in-memory event log and a fake connection-node client (or the real one). Helpers make
 * subscriptions, VAPID credentials and raw HTTP requests.
 */
import { randomUUID } from "node:crypto"
import * as http from "node:http"
import { Context, Effect, Layer } from "effect"
import type { HttpServer } from "effect/http"
import { exportJWK, generateKeyPair, SignJWT } from "jose"
import { EndpointCrypto, TEST_ENDPOINT_URL } from "../../src/crypto/endpoint.ts"
import type { Notification } from "../../src/domain/notification.ts"
import type { UserRecord } from "../../src/domain/user.ts"
import { defaultEndpointOptions, type EndpointOptions } from "../../src/endpoint/options.ts"
import { boundPort, EndpointServer } from "../../src/endpoint/server.ts"
import { Metrics } from "../../src/observability/Metrics.ts"
import { EventLog } from "../../src/observability/EventLog.ts"
import { NodeClient, type NodeClientService, NodeTransportError } from "../../src/routers/NodeClient.ts"
import { WebPushRouter } from "../../src/routers/webpush.ts"
import { layerMemory } from "../../src/storage/memory/layer.ts"
import { createActiveTables, Storage, StorageError, type StorageService } from "../../src/storage/Storage.ts"
import { Unavailable } from "../../src/storage/failures.ts"

export const options: EndpointOptions = {
  ...defaultEndpointOptions,
  endpointUrl: TEST_ENDPOINT_URL,
  port: 0,
  bindHost: "127.0.0.1",
  version: "1.2.3-test",
  // The health tests change the tables between requests: each reads their status afresh (the
  // cache is tested on its own, test/endpoint/cost.test.ts).
  tableStatusTtlMs: 0
}

// ── storage with injectable faults ───────────────────────────────────────────────────────────────

/** Storage operations that fail while listed: with a `StorageError`, or with a defect ("die"). */
export class StorageFaults
  extends Context.Service<StorageFaults, Map<keyof StorageService, "fail" | "die">>()("test/StorageFaults")
{}

const faultyStorage = Layer.effect(
  Storage,
  Effect.gen(function*() {
    const inner = yield* Storage
    const faults = yield* StorageFaults
    const fault = (operation: keyof StorageService) =>
      faults.get(operation) === "die"
        ? Effect.die(new Error(`injected defect in ${operation}`))
        : Effect.fail(new StorageError({ operation, reason: new Unavailable(), cause: "injected fault" }))
    const wrapped: Record<string, unknown> = {}
    for (const [name, member] of Object.entries(inner)) {
      const key = name as keyof StorageService
      wrapped[name] = typeof member === "function"
        ? (...args: Array<unknown>) => (faults.has(key) ? fault(key) : (member as (...a: Array<unknown>) => unknown)(...args))
        : Effect.suspend(() => (faults.has(key) ? fault(key) : (member as Effect.Effect<unknown>)))
    }
    return wrapped as unknown as StorageService
  })
)

/** In-memory storage with its tables created, wrapped so tests can inject faults. */
export const TestStorage = Layer.effectDiscard(createActiveTables).pipe(
  Layer.provideMerge(faultyStorage),
  Layer.provideMerge(layerMemory({ routerTable: "router", messageTablePrefix: "message", noTableRotation: false })),
  Layer.provideMerge(Layer.sync(StorageFaults, () => new Map<keyof StorageService, "fail" | "die">()))
)

/** Run `effect` with these Storage operations failing. */
export const withStorageFaults = <A, E, R>(
  operations: ReadonlyArray<keyof StorageService>,
  effect: Effect.Effect<A, E, R>,
  kind: "fail" | "die" = "fail"
) =>
  Effect.flatMap(Effect.service(StorageFaults), (faults) =>
    Effect.acquireUseRelease(
      Effect.sync(() => operations.forEach((op) => faults.set(op, kind))),
      () => effect,
      () => Effect.sync(() => faults.clear())
    ))

// ── fake connection nodes ────────────────────────────────────────────────────────────────────────

export interface NodeCall {
  readonly kind: "push" | "notify" | "disconnect"
  readonly nodeId: string
  readonly uaid: string
  readonly notification?: Notification
  /** The session a push is for (the router record's `connected_at`). */
  readonly connectedAt?: number
}

/** How a fake node answers: a status, "down" (transport failure), or a function of the call. */
export type NodeBehaviour = number | "down" | ((call: NodeCall) => Effect.Effect<number | "down">)

/** Per node id: how it answers (default 404); every call is recorded. */
export class FakeNodes extends Context.Service<FakeNodes, {
  readonly behaviour: Map<string, NodeBehaviour>
  readonly calls: Array<NodeCall>
}>()("test/FakeNodes") {}

export const FakeNodeClient = Layer.effect(
  NodeClient,
  Effect.gen(function*() {
    const fake = yield* FakeNodes
    const answer = (call: NodeCall) =>
      Effect.suspend(() => {
        fake.calls.push(call)
        const behaviour = fake.behaviour.get(call.nodeId) ?? 404
        return typeof behaviour === "function" ? behaviour(call) : Effect.succeed(behaviour)
      }).pipe(
        Effect.flatMap((outcome) =>
          outcome === "down"
            ? Effect.fail(new NodeTransportError({ nodeId: call.nodeId, reason: "error" }))
            : Effect.succeed(outcome))
      )
    return NodeClient.of({
      push: (nodeId, uaid, notification, connectedAt) =>
        answer({ kind: "push", nodeId, uaid, notification, ...(connectedAt === undefined ? {} : { connectedAt }) }),
      notify: (nodeId, uaid) => answer({ kind: "notify", nodeId, uaid }),
      disconnect: (nodeId, uaid) => answer({ kind: "disconnect", nodeId, uaid })
    } satisfies NodeClientService)
  })
).pipe(Layer.provideMerge(Layer.sync(FakeNodes, () => ({ behaviour: new Map(), calls: [] }))))

/** A fresh node id answering as `behaviour` says. */
export const fakeNode = (behaviour: NodeBehaviour) =>
  Effect.map(Effect.service(FakeNodes), (fake) => {
    const nodeId = `http://node-${randomUUID().slice(0, 8)}.test:8081`
    fake.behaviour.set(nodeId, behaviour)
    return nodeId
  })

export const nodeCalls = (uaid: string) =>
  Effect.map(Effect.service(FakeNodes), (fake) => fake.calls.filter((c) => c.uaid === uaid))

// ── the endpoint ─────────────────────────────────────────────────────────────────────────────────

/** Storage, crypto and the event log: what the endpoint needs besides its router. */
export const Shared = Layer.mergeAll(TestStorage, EndpointCrypto.layerTest, EventLog.layerMemory, Metrics.layerMemory)

/** The endpoint server (port 0) with the given node client layer. */
export const endpointWith = <ROut, E>(nodeClient: Layer.Layer<ROut, E, never>, endpointOptions: EndpointOptions = options) =>
  EndpointServer.layerServer(endpointOptions).pipe(
    Layer.provideMerge(WebPushRouter.layerWith({ maxStoredPerSubscription: endpointOptions.maxStoredPerSubscription })),
    Layer.provideMerge(nodeClient),
    Layer.provideMerge(Shared)
  )

/** The usual test endpoint: fake connection nodes. */
export const TestEndpoint = endpointWith(FakeNodeClient)

// ── subscriptions ────────────────────────────────────────────────────────────────────────────────

export interface Subscription {
  readonly uaid: string
  readonly channelId: string
  readonly endpoint: string
  /** Path of the endpoint URL (what we POST to). */
  readonly path: string
  readonly table: string
}

export interface SubscribeOptions {
  /** Bind the endpoint (v2) to this raw VAPID public key. */
  readonly key?: Uint8Array
  readonly nodeId?: string
  readonly routerType?: string
  /** The user's `currentMonth`; null for none. Default: the current table. */
  readonly currentMonth?: string | null
  /** Register the user and channel (default true). */
  readonly register?: boolean
}

export const subscribe = Effect.fnUntraced(function*(opts: SubscribeOptions = {}) {
  const storage = yield* Storage
  const crypto = yield* EndpointCrypto
  const uaid = randomUUID().replaceAll("-", "")
  const channelId = randomUUID()
  const table = yield* storage.currentMessageTable
  if (typeof opts.currentMonth === "string") yield* storage.createTables([opts.currentMonth])
  if (opts.register !== false) {
    const user: UserRecord = {
      uaid,
      routerType: opts.routerType ?? "webpush",
      routerData: {},
      connectedAt: Date.now(),
      ...(opts.nodeId !== undefined ? { nodeId: opts.nodeId } : {}),
      ...(opts.currentMonth === null ? {} : { currentMonth: opts.currentMonth ?? table })
    }
    yield* storage.registerUser(user)
    yield* storage.addChannel(uaid, opts.currentMonth ?? table, channelId)
  }
  const endpoint = yield* crypto.makeEndpoint(uaid, channelId, opts.key)
  return {
    uaid,
    channelId,
    endpoint,
    path: new URL(endpoint).pathname,
    table: typeof opts.currentMonth === "string" ? opts.currentMonth : table
  } satisfies Subscription
})

// ── VAPID ────────────────────────────────────────────────────────────────────────────────────────

export interface VapidKeys {
  /** Raw uncompressed public point. */
  readonly raw: Buffer
  /** base64url of `raw`. */
  readonly publicKey: string
  readonly sign: (claims: Record<string, unknown>, header?: { readonly alg: string }) => Promise<string>
}

export const vapidKeys = Effect.promise(async (): Promise<VapidKeys> => {
  const { privateKey, publicKey } = await generateKeyPair("ES256", { extractable: true })
  const jwk = await exportJWK(publicKey)
  const raw = Buffer.concat([
    Buffer.from([4]),
    Buffer.from(jwk.x ?? "", "base64url"),
    Buffer.from(jwk.y ?? "", "base64url")
  ])
  return {
    raw,
    publicKey: raw.toString("base64url"),
    sign: (claims) => new SignJWT(claims).setProtectedHeader({ alg: "ES256", typ: "JWT" }).sign(privateKey)
  }
})

export const nowSeconds = () => Math.floor(Date.now() / 1000)

/** Claims a valid token carries for the test endpoint. */
export const goodClaims = (): Record<string, unknown> => ({
  aud: new URL(TEST_ENDPOINT_URL).origin,
  exp: nowSeconds() + 3600,
  sub: "mailto:ops@example.com"
})

// ── raw HTTP ─────────────────────────────────────────────────────────────────────────────────────

export interface Reply {
  readonly status: number
  readonly headers: http.IncomingHttpHeaders
  readonly text: string
  readonly json: () => any
}

export interface RequestSpec {
  readonly method?: string
  readonly path: string
  readonly headers?: Readonly<Record<string, string | number | ReadonlyArray<string>>>
  readonly body?: string | Uint8Array
  /** Send the body with chunked transfer encoding (no Content-Length). */
  readonly chunked?: boolean
}

export const requestTo = (port: number, spec: RequestSpec): Effect.Effect<Reply> =>
  Effect.callback<Reply>((resume) => {
    const headers: Record<string, string | number | ReadonlyArray<string>> = { ...spec.headers }
    if (spec.body !== undefined && !spec.chunked) headers["content-length"] = Buffer.byteLength(spec.body)
    const req = http.request({
      host: "127.0.0.1",
      port,
      method: spec.method ?? "POST",
      path: spec.path,
      headers: headers as http.OutgoingHttpHeaders,
      agent: false
    }, (res) => {
      const chunks: Array<Buffer> = []
      res.on("data", (c: Buffer) => chunks.push(c))
      res.on("end", () => {
        const text = Buffer.concat(chunks).toString("utf8")
        resume(Effect.succeed({ status: res.statusCode ?? 0, headers: res.headers, text, json: () => JSON.parse(text) }))
      })
    })
    req.on("error", (e) => resume(Effect.die(e)))
    if (spec.chunked && spec.body !== undefined) {
      const body = Buffer.from(spec.body)
      const half = Math.floor(body.length / 2)
      req.write(body.subarray(0, half))
      req.end(body.subarray(half))
    } else {
      req.end(spec.body)
    }
  })

/** A request to the endpoint under test. */
export const request = (spec: RequestSpec): Effect.Effect<Reply, never, HttpServer.HttpServer> =>
  Effect.flatMap(boundPort, (port) => requestTo(port, spec))

/** POST to a subscription's endpoint with the given headers (TTL 60 unless given) and body. */
export const push = (
  sub: Pick<Subscription, "path">,
  headers: Readonly<Record<string, string | number>> = {},
  body?: string | Uint8Array
) => request({ path: sub.path, headers: { ttl: 60, ...headers }, ...(body !== undefined ? { body } : {}) })

export const messagesOf = (sub: Pick<Subscription, "uaid" | "table">) =>
  Effect.flatMap(Effect.service(Storage), (storage) =>
    Effect.all([
      storage.fetchTopicMessages(sub.uaid, sub.table, 100),
      Effect.map(storage.fetchTimestampMessages(sub.uaid, sub.table, undefined, 100), (page) => page.messages)
    ]).pipe(Effect.map(([topics, timestamps]) => [...topics, ...timestamps]), Effect.orDie))
