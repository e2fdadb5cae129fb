/**
 * A session machine wired to deterministic parts: in-memory storage, the test crypto key, a
 * recording transport, recording peers and an in-memory event log. Events are fed one at a time.
 *
 * Time passes as in the world: every storage operation takes time on the `TestClock` (half before
 * it reaches storage, half after), so a command's result arrives later than the command, and what
 * a session wrote is older than the step that reads it back. Pushes go through the endpoint's own
 * router (`WebPushRouter`) to this node's registry, with the checks of the router port.
 */
import { Clock, Effect, Layer } from "effect"
import { TestClock } from "effect/testing"
import { connectionNodeOptions } from "../../src/bin/app.ts"
import { makeSettings } from "../../src/config/index.ts"
import type { DomainEvent } from "../../src/domain/events.ts"
import { Broadcasts } from "../../src/broadcast/Broadcasts.ts"
import { EndpointCrypto } from "../../src/crypto/endpoint.ts"
import { sessionPorts } from "../../src/connection/sessions.ts"
import { type PeerCall, PeerNodes } from "../../src/connection/peers.ts"
import { makeNodeRegistry, NodeRegistry } from "../../src/connection/registry.ts"
import { EventLog, EventLogMemory } from "../../src/observability/EventLog.ts"
import type { MailboxInput } from "../../src/protocol/inputs.ts"
import type { ClientMessage } from "../../src/protocol/messages.ts"
import {
  SessionHandle,
  type SessionOptions,
  type SessionPorts,
  SessionRunner
} from "../../src/protocol/session.ts"
import { layerMemory } from "../../src/storage/memory/layer.ts"
import { mapStorageOperations, Storage } from "../../src/storage/Storage.ts"
import type { Notification, Urgency } from "../../src/domain/notification.ts"
import { NodeClient, NodeTransportError } from "../../src/routers/NodeClient.ts"
import { WebPushRouter, type WebPushRouterService } from "../../src/routers/webpush.ts"

export const sessionOptions: SessionOptions = { ...connectionNodeOptions(makeSettings()), routerUrl: "http://node-a:8081" }

/** Time one storage operation takes by default (ms, on the TestClock). */
export const STORAGE_LATENCY_MS = 4

/** Storage whose every operation takes `latency()` ms of TestClock time. */
export const withStorageLatency = (latency: () => number) =>
  Layer.effect(
    Storage,
    Effect.map(Storage, (inner) =>
      mapStorageOperations(inner, () => (operation) =>
        Effect.suspend(() => {
          const ms = latency()
          const before = Math.floor(ms / 2)
          return TestClock.adjust(before).pipe(Effect.andThen(operation), Effect.tap(() => TestClock.adjust(ms - before)))
        })))
  )

/** In-memory storage (taking `latency()` ms an operation), the test crypto key and the in-memory event log. */
export const testParts = (noTableRotation = false, latency: () => number = () => STORAGE_LATENCY_MS) =>
  Layer.mergeAll(
    withStorageLatency(latency).pipe(Layer.provide(layerMemory({ routerTable: "router", messageTablePrefix: "message", noTableRotation }))),
    EndpointCrypto.layerTest,
    EventLog.layerMemory
  )

export const TestParts = testParts()

export interface Sent {
  readonly frames: Array<Record<string, unknown>>
  closed: { readonly code: number; readonly reason: string } | undefined
  pings: number
  /** Whether the session has paused reading the socket. */
  paused: boolean
}

export interface Client {
  readonly handle: SessionHandle
  readonly machine: SessionRunner
  readonly sent: Sent
  /** Feed one event at the Clock's now. */
  readonly feed: (input: MailboxInput) => Effect.Effect<void>
  readonly frame: (message: ClientMessage) => Effect.Effect<void>
  /** The versions the client acked, in order (what it sent on the wire). */
  readonly acked: Array<string>
  /** Frames of a messageType sent so far. */
  readonly of: (type: string) => Array<Record<string, unknown>>
}

export interface Harness {
  readonly ports: SessionPorts
  readonly registry: ReturnType<typeof makeNodeRegistry>
  readonly pokes: Array<PeerCall>
  /** Deliveries refused by a session's full queue, as the registry reports them. */
  readonly queueFull: { count: number }
  readonly events: Array<DomainEvent>
  readonly connect: () => Effect.Effect<Client>
  /** The endpoint's router, delivering to this node. */
  readonly router: WebPushRouterService
  /** This node as the router reaches it: `takesDirect` false refuses every delivery. */
  readonly node: { takesDirect: boolean }
}

/** The node's broadcasts as the harness's sessions see them; tests replace it. */
let broadcasts: ReadonlyMap<string, string> = new Map()
export const setBroadcasts = (set: ReadonlyMap<string, string>): void => {
  broadcasts = set
}

/** `answersClose` (default true): a client answers our close frame at once (see `feed`). */
export const makeHarness = (overrides: Partial<SessionOptions> = {}, answersClose = true) =>
  Effect.gen(function*() {
    broadcasts = new Map()
    const storage = yield* Storage
    const { events } = yield* EventLogMemory
    yield* storage.createTables(yield* storage.activeMessageTables)
    const queueFull = { count: 0 }
    const registry = makeNodeRegistry(() => void queueFull.count++)
    const pokes: Array<PeerCall> = []
    const options = { ...sessionOptions, ...overrides }
    // The node's own services, with this registry, the broadcasts tests set, and peers that record.
    const ports = yield* sessionPorts(options, false).pipe(Effect.provide(Layer.mergeAll(
      Layer.succeed(NodeRegistry, registry),
      Layer.succeed(Broadcasts, Broadcasts.of({ current: () => broadcasts })),
      PeerNodes.layerTest((call) => {
        pokes.push(call)
        // This node's own router port would hand the poke to the live session.
        if (call.kind === "notify" && call.nodeId === options.routerUrl) registry.get(call.uaid)?.mailbox.offer({ _tag: "CheckStorage" })
      })
    )))
    // This node's router port as the endpoint's router reaches it; any other node is gone.
    const node = { takesDirect: true }
    const here = options.routerUrl
    const gone = (nodeId: string) => Effect.fail(new NodeTransportError({ nodeId, reason: "error" }))
    const nodeClient = NodeClient.of({
      push: (nodeId, uaid, notification, connectedAt) =>
        nodeId !== here ? gone(nodeId) : Effect.sync(() => node.takesDirect && registry.deliver(uaid, notification, connectedAt) ? 200 : 404),
      notify: (nodeId, uaid) => nodeId !== here ? gone(nodeId) : Effect.sync(() => registry.checkStorage(uaid) ? 200 : 404),
      disconnect: (nodeId) => gone(nodeId)
    })
    const router = yield* Effect.provide(Effect.service(WebPushRouter), WebPushRouter.layer.pipe(Layer.provide(Layer.succeed(NodeClient, nodeClient))))
    const connect = () =>
      Effect.gen(function*() {
        // Connections are at least a millisecond apart: a uaid's newer connection must be newer.
        yield* TestClock.adjust(1)
        const sent: Sent = { frames: [], closed: undefined, pings: 0, paused: false }
        const handle = new SessionHandle(ports.options.clientChannelCapacity, Number.POSITIVE_INFINITY, {
          frames: ports.options.inboxFrames,
          bytes: ports.options.inboxBytes
        })
        registry.track(handle)
        const machine = new SessionRunner(ports, {
          sendText: (text) => void sent.frames.push(JSON.parse(text) as Record<string, unknown>),
          sendClose: (code, reason) => {
            sent.closed = { code, reason }
          },
          sendPing: () => void sent.pings++,
          pause: () => {
            sent.paused = true
          },
          resume: () => {
            sent.paused = false
          }
        }, handle, yield* Clock.currentTimeMillis)
        /**
         * One event and everything it causes (a close runs the whole close sequence: the client
         * answers our close frame at once, as the transport's end of the socket does after the
         * close grace; `answersClose: false` leaves it waiting, for the acks of that moment).
         */
        const feed = (input: MailboxInput): Effect.Effect<void> =>
          Effect.andThen(machine.feed(input), () =>
            answersClose && machine.phase._tag === "Closing" && machine.phase.stage._tag === "Answering"
              ? machine.feed({ _tag: "SocketClosed" })
              : Effect.void)
        const acked: Array<string> = []
        return {
          handle,
          machine,
          sent,
          feed,
          acked,
          frame: (message: ClientMessage) => {
            if (message.messageType === "ack") acked.push(...message.updates.map((u) => u.version))
            return feed({ _tag: "Frame", message })
          },
          of: (type: string) => sent.frames.filter((f) => f["messageType"] === type)
        } satisfies Client
      })
    return { ports, registry, pokes, queueFull, events, connect, router, node } satisfies Harness
  })

/**
 * What an endpoint node does with a push, minus HTTP: the endpoint's router with this node as the
 * only connection node (reached as the all-in-one reaches its own, with the router port's checks:
 * the session connected at the record's `connected_at`, the channel not unregistered, room in its
 * queue). `direct: false`: the node refuses the delivery (as a full queue would), so it is stored.
 */
export const pushMessage = (
  harness: Harness,
  uaid: string,
  channelId: string,
  options: {
    readonly ttl?: number
    readonly topic?: string
    readonly data?: string
    readonly direct?: boolean
    readonly urgency?: Urgency
    /** A receipt subscription (as a push with `Push-Receipt` has). */
    readonly receipt?: string
  } = {}
) =>
  Effect.gen(function*() {
    const storage = yield* Storage
    const crypto = yield* EndpointCrypto
    const nowMs = yield* Clock.currentTimeMillis
    const user = yield* storage.getUser(uaid)
    if (user?.currentMonth === undefined) return yield* Effect.die(new Error(`no user ${uaid}`))
    const version = yield* crypto.makeMessageId(
      options.topic !== undefined
        ? { kind: "topic", uaid, channelId, topic: options.topic, receipt: options.receipt }
        : { kind: "timestamp", uaid, channelId, sortkeyTimestamp: nowMs, receipt: options.receipt }
    )
    const notification: Notification = {
      channelId,
      version,
      ttl: options.ttl ?? 60,
      topic: options.topic,
      timestamp: Math.floor(nowMs / 1000),
      sortkeyTimestamp: nowMs,
      data: options.data,
      headers: options.data === undefined ? undefined : { encoding: "aes128gcm" },
      urgency: options.urgency,
      ...(options.receipt === undefined ? {} : { receipt: options.receipt })
    }
    harness.node.takesDirect = options.direct !== false
    const routed = yield* harness.router.route(user, user.currentMonth, notification).pipe(Effect.orDie)
    return { notification: routed.notification, direct: routed.outcome === "direct" }
  })

/** Hand every queued mailbox input of a client to its machine (what its fiber does). */
export const pump = (client: Client) =>
  Effect.gen(function*() {
    let event = client.handle.mailbox.poll()
    while (event !== undefined && !client.machine.isClosed) {
      yield* client.feed(event)
      event = client.handle.mailbox.poll()
    }
  })
