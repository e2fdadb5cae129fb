/**
 * The Matrix push gateway end to end in one process: a connection node and an endpoint node over
 * real sockets (the endpoint reaches the connection node on its router port), a `ws` push client
 * that says hello and registers (as a UnifiedPush distributor does), and a homeserver-like sender
 * POSTing notify requests with the client's push endpoint as pushkey. The client receives the
 * notification; its `data` is the notification without `devices`.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { Broadcasts } from "../../src/broadcast/Broadcasts.ts"
import { ConnectionNode } from "../../src/connection/node.ts"
import { EndpointCrypto } from "../../src/crypto/endpoint.ts"
import { boundPort, EndpointServer } from "../../src/endpoint/server.ts"
import { EventLog } from "../../src/observability/EventLog.ts"
import { Metrics } from "../../src/observability/Metrics.ts"
import { NodeClient } from "../../src/routers/NodeClient.ts"
import { RouterAuth } from "../../src/crypto/routerAuth.ts"
import { layerMemory } from "../../src/storage/memory/layer.ts"
import { createActiveTables } from "../../src/storage/Storage.ts"
import { nodeOptions, openClient, type TestClient } from "../connection/client.ts"
import { options, requestTo } from "../endpoint/harness.ts"

const storage = Layer.effectDiscard(createActiveTables).pipe(
  Layer.provideMerge(layerMemory({ routerTable: "router", messageTablePrefix: "message", noTableRotation: false }))
)

/** Both nodes, joined over HTTP as separate processes would be, on storage, keys and observability they share. */
const Nodes = Layer.mergeAll(
  ConnectionNode.layer(nodeOptions, (port) => `http://127.0.0.1:${port}`).pipe(
    Layer.provideMerge(Layer.mergeAll(Broadcasts.layerStatic(), NodeClient.layer({ connectTimeoutMs: 500, requestTimeoutMs: 1_000 })))
  ),
  EndpointServer.layer(options)
).pipe(Layer.provideMerge(Layer.mergeAll(storage, EndpointCrypto.layerTest, RouterAuth.layerTest, EventLog.layerMemory, Metrics.layerMemory)))

const CHANNEL = "5c0b6a4e-8a43-4a0e-9f1e-2f7f3c6c1d10"

/** A push client with one channel: its push endpoint is the pushkey a homeserver gets. */
const subscriber = Effect.gen(function*() {
  const { port } = yield* ConnectionNode
  const client = yield* Effect.promise(() => openClient(`ws://127.0.0.1:${port}/`))
  client.send({ messageType: "hello", use_webpush: true })
  const hello = yield* Effect.promise(() => client.next((f) => f["messageType"] === "hello"))
  client.send({ messageType: "register", channelID: CHANNEL })
  const registered = yield* Effect.promise(() => client.next((f) => f["messageType"] === "register"))
  assert.strictEqual(registered["status"], 200)
  return { client, uaid: hello["uaid"] as string, pushkey: registered["pushEndpoint"] as string }
})

const notify = (body: unknown) =>
  Effect.flatMap(boundPort, (port) =>
    requestTo(port, { method: "POST", path: "/_matrix/push/v1/notify", headers: { "content-type": "application/json" }, body: JSON.stringify(body) }))

/** The spec's example notify request for one device. */
const exampleFor = (pushkey: string, overrides: Record<string, unknown> = {}) => ({
  notification: {
    event_id: "$3957tyerfgewrf384",
    room_id: "!slw48wfj34rtnrf:example.com",
    type: "m.room.message",
    sender: "@exampleuser:matrix.org",
    sender_display_name: "Major Tom",
    room_name: "Mission Control",
    room_alias: "#exampleroom:matrix.org",
    prio: "high",
    content: { msgtype: "m.text", body: "I'm floating in a most peculiar way." },
    counts: { unread: 2, missed_calls: 1 },
    devices: [{ app_id: "org.matrix.matrixConsole.ios", pushkey, pushkey_ts: 12345678, data: {}, tweaks: { sound: "bing" } }],
    ...overrides
  }
})

const decoded = (frame: Record<string, unknown>) => JSON.parse(Buffer.from(frame["data"] as string, "base64url").toString("utf8"))

const isNotification = (frame: Record<string, unknown>) => frame["messageType"] === "notification"

const ack = (client: TestClient, frame: Record<string, unknown>) =>
  client.send({ messageType: "ack", updates: [{ channelID: frame["channelID"], version: frame["version"], code: 100 }] })

describe("Matrix push gateway, delivered over the WebSocket", () => {
  it.live("the spec's example reaches the registered client as {notification} without devices; the homeserver's retry does not", () =>
    Effect.gen(function*() {
      const { client, pushkey } = yield* subscriber
      const reply = yield* notify(exampleFor(pushkey))
      assert.strictEqual(reply.status, 200)
      assert.deepStrictEqual(reply.json(), { rejected: [] })
      const frame = yield* Effect.promise(() => client.next(isNotification))
      assert.strictEqual(frame["channelID"], CHANNEL)
      assert.deepStrictEqual(frame["headers"], {})
      const { devices: _devices, ...expected } = exampleFor(pushkey).notification
      assert.deepStrictEqual(decoded(frame), { notification: expected })
      ack(client, frame)

      // A retry of the same event (the homeserver missed our answer): 200, not pushed again.
      const retry = yield* notify(exampleFor(pushkey))
      assert.deepStrictEqual([retry.status, retry.json()], [200, { rejected: [] }])
      assert.isTrue(yield* Effect.promise(() => client.quiet(300, isNotification)))

      // The event_id_only format of the next event.
      const next = yield* notify({
        notification: {
          event_id: "$next",
          room_id: "!slw48wfj34rtnrf:example.com",
          counts: { unread: 3 },
          prio: "high",
          devices: [{ app_id: "org.unifiedpush.example", pushkey, pushkey_ts: 12345678, data: { format: "event_id_only" } }]
        }
      })
      assert.deepStrictEqual([next.status, next.json()], [200, { rejected: [] }])
      const second = yield* Effect.promise(() => client.next(isNotification))
      assert.deepStrictEqual(decoded(second), { notification: { event_id: "$next", room_id: "!slw48wfj34rtnrf:example.com", counts: { unread: 3 }, prio: "high" } })
      ack(client, second)

      // Unsubscribed: the pushkey is rejected from then on.
      client.send({ messageType: "unregister", channelID: CHANNEL })
      yield* Effect.promise(() => client.next((f) => f["messageType"] === "unregister"))
      const gone = yield* notify(exampleFor(pushkey, { event_id: "$after" }))
      assert.deepStrictEqual([gone.status, gone.json()], [200, { rejected: [pushkey] }])
      yield* Effect.promise(() => client.close())
    }).pipe(Effect.provide(Nodes)))

  it.live("prio low: a client whose minimum urgency is normal does not get it directly; it comes when the client lowers its minimum", () =>
    Effect.gen(function*() {
      const { client, pushkey } = yield* subscriber
      client.send({ messageType: "urgency", min: "normal" })
      assert.strictEqual((yield* Effect.promise(() => client.next((f) => f["messageType"] === "urgency")))["status"], 200)
      const reply = yield* notify(exampleFor(pushkey, { event_id: "$quiet", prio: "low" }))
      assert.deepStrictEqual([reply.status, reply.json()], [200, { rejected: [] }])
      assert.isTrue(yield* Effect.promise(() => client.quiet(300, isNotification)), "a low-urgency message is held")
      client.send({ messageType: "urgency", min: "very-low" })
      const held = yield* Effect.promise(() => client.next(isNotification))
      assert.strictEqual(decoded(held).notification.event_id, "$quiet")
      assert.strictEqual(decoded(held).notification.prio, "low")
      ack(client, held)
      // prio high goes through at once to a client that wants normal or more.
      client.send({ messageType: "urgency", min: "normal" })
      yield* Effect.promise(() => client.next((f) => f["messageType"] === "urgency"))
      yield* notify(exampleFor(pushkey, { event_id: "$loud" }))
      const loud = yield* Effect.promise(() => client.next(isNotification))
      assert.strictEqual(decoded(loud).notification.event_id, "$loud")
      ack(client, loud)
      yield* Effect.promise(() => client.close())
    }).pipe(Effect.provide(Nodes)))
})
