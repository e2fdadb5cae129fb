/**
 * A session machine wired to deterministic parts: in-memory storage, the test crypto key, a
 * recording transport, recording peers and an in-memory event log. Events are fed one at a time.
 */
import { Clock, Effect, Layer } from "effect"
import { TestClock } from "effect/testing"
import { connectionNodeOptions } from "../../src/bin/app.ts"
import { makeSettings } from "../../src/config/index.ts"
import type { DomainEvent } from "../../src/domain/events.ts"
import { EndpointCrypto, decodeVapidPublicKey } from "../../src/crypto/endpoint.ts"
import { makeNodeRegistry } from "../../src/connection/registry.ts"
import { EventLog, EventLogMemory } from "../../src/observability/EventLog.ts"
import type { ClientMessage } from "../../src/protocol/messages.ts"
import {
  protocolFor,
  SessionHandle,
  type SessionEvent,
  type SessionOptions,
  type SessionPorts,
  SessionRunner
} from "../../src/protocol/session.ts"
import { layerMemory } from "../../src/storage/memory.ts"
import { Storage } from "../../src/storage/Storage.ts"

export const sessionOptions: SessionOptions = { ...connectionNodeOptions(makeSettings()), routerUrl: "http://node-a:8081" }

/** In-memory storage, the test crypto key and the in-memory event log. */
export const testParts = (noTableRotation = false) =>
  Layer.mergeAll(
    layerMemory({ routerTable: "router", messageTablePrefix: "message", noTableRotation }),
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
  readonly feed: (event: SessionEvent) => Effect.Effect<void>
  readonly frame: (message: ClientMessage) => Effect.Effect<void>
  /** Frames of a messageType sent so far. */
  readonly of: (type: string) => Array<Record<string, unknown>>
}

export interface Harness {
  readonly ports: SessionPorts
  readonly registry: ReturnType<typeof makeNodeRegistry>
  readonly pokes: Array<{ readonly kind: "notify" | "disconnect"; readonly nodeId: string; readonly uaid: string }>
  readonly events: Array<DomainEvent>
  readonly connect: () => Effect.Effect<Client>
}

/** The node's broadcasts as the harness's sessions see them; tests replace it. */
let broadcasts: ReadonlyMap<string, string> = new Map()
export const setBroadcasts = (set: ReadonlyMap<string, string>): void => {
  broadcasts = set
}

export const makeHarness = (overrides: Partial<SessionOptions> = {}) =>
  Effect.gen(function*() {
    broadcasts = new Map()
    const storage = yield* Storage
    const crypto = yield* EndpointCrypto
    const { events } = yield* EventLogMemory
    const eventLog = yield* EventLog
    yield* storage.createTables(yield* storage.activeMessageTables)
    const registry = makeNodeRegistry()
    const pokes: Harness["pokes"] = []
    const options = { ...sessionOptions, ...overrides }
    const ports: SessionPorts = {
      storage,
      events: eventLog,
      registry,
      logFrames: false,
      options,
      protocol: protocolFor(options),
      broadcasts: () => broadcasts,
      peers: {
        notify: (nodeId, uaid) => {
          pokes.push({ kind: "notify", nodeId, uaid })
          // This node's own router port would hand the poke to the live session.
          if (nodeId === ports.options.routerUrl) registry.get(uaid)?.mailbox.offer({ _tag: "CheckStorage" })
        },
        disconnect: (nodeId, uaid) => void pokes.push({ kind: "disconnect", nodeId, uaid })
      },
      endpoints: {
        makeEndpoint: (uaid, channelId, key) => {
          if (key === undefined) return crypto.makeEndpoint(uaid, channelId)
          const raw = decodeVapidPublicKey(key)
          return raw === undefined ? Effect.succeed(undefined) : crypto.makeEndpoint(uaid, channelId, raw)
        }
      }
    }
    const connect = () =>
      Effect.gen(function*() {
        // Connections are at least a millisecond apart: a uaid's newer connection must be newer.
        yield* TestClock.adjust(1)
        const sent: Sent = { frames: [], closed: undefined, pings: 0, paused: false }
        const handle = new SessionHandle(ports.options.clientChannelCapacity, Number.POSITIVE_INFINITY)
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
        /** One event and everything it causes (a close runs the whole close sequence). */
        const feed = (event: SessionEvent) => machine.feed(event)
        return {
          handle,
          machine,
          sent,
          feed,
          frame: (message: ClientMessage) => feed({ _tag: "Frame", message }),
          of: (type: string) => sent.frames.filter((f) => f["messageType"] === type)
        } satisfies Client
      })
    return { ports, registry, pokes, events, connect } satisfies Harness
  })

/** What an endpoint node does with a push, minus HTTP: deliver directly if connected here, else store and poke. */
export const pushMessage = (
  harness: Harness,
  uaid: string,
  channelId: string,
  options: { readonly ttl?: number; readonly topic?: string; readonly data?: string; readonly direct?: boolean } = {}
) =>
  Effect.gen(function*() {
    const storage = yield* Storage
    const crypto = yield* EndpointCrypto
    const nowMs = yield* Clock.currentTimeMillis
    const user = yield* storage.getUser(uaid)
    if (user?.currentMonth === undefined) return yield* Effect.die(new Error(`no user ${uaid}`))
    const version = yield* crypto.makeMessageId(
      options.topic !== undefined
        ? { kind: "topic", uaid, channelId, topic: options.topic }
        : { kind: "timestamp", uaid, channelId, sortkeyTimestamp: nowMs }
    )
    const notification = {
      channelId,
      version,
      ttl: options.ttl ?? 60,
      topic: options.topic,
      timestamp: Math.floor(nowMs / 1000),
      sortkeyTimestamp: nowMs,
      data: options.data,
      headers: options.data === undefined ? undefined : { encoding: "aes128gcm" }
    }
    const session = harness.registry.get(uaid)
    if (options.direct !== false && session !== undefined && session.mailbox.offerDelivery({ _tag: "Delivery", notification })) {
      return { notification, direct: true }
    }
    if (notification.ttl === 0) return { notification, direct: false }
    // As the endpoint: a timestamp message whose ms is taken on its channel goes to the next one.
    let stored = notification
    while ((yield* storage.saveMessage(uaid, user.currentMonth, stored)) === "taken") {
      const sortkeyTimestamp = (stored.sortkeyTimestamp as number) + 1
      stored = { ...stored, sortkeyTimestamp, version: yield* crypto.makeMessageId({ kind: "timestamp", uaid, channelId, sortkeyTimestamp }) }
    }
    session?.mailbox.offer({ _tag: "CheckStorage" })
    return { notification: stored, direct: false }
  })

/** Hand every queued mailbox event of a client to its machine (what its fiber does). */
export const pump = (client: Client) =>
  Effect.gen(function*() {
    let event = client.handle.mailbox.poll()
    while (event !== undefined && !client.machine.isClosed) {
      yield* client.feed(event)
      event = client.handle.mailbox.poll()
    }
  })
