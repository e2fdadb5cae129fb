/**
 * The router port takes only requests signed by a node of its deployment: unsigned ones are 401,
 * ones signed with another key, out of the ±60 s window of the node's clock, or for another
 * method, path, session or body 403 — each counted (`router.auth.refused{reason}`) and the
 * connection closed — and nothing reaches the client. Signed ones deliver; with
 * `router_accept_unsigned` (an upgrade in progress) unsigned ones do too, counted as such, while a
 * bad signature is still refused.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer, Redacted } from "effect"
import * as Clock from "effect/Clock"
import { Broadcasts } from "../../src/broadcast/Broadcasts.ts"
import { ConnectionNode } from "../../src/connection/node.ts"
import { EndpointCrypto, TEST_CRYPTO_KEY } from "../../src/crypto/endpoint.ts"
import { makeRouterAuth, ROUTER_AUTH_HEADER, RouterAuth } from "../../src/crypto/routerAuth.ts"
import { EventLog } from "../../src/observability/EventLog.ts"
import { METRICS } from "../../src/observability/catalog.ts"
import { Metrics } from "../../src/observability/Metrics.ts"
import { NodeClient } from "../../src/routers/NodeClient.ts"
import { layerMemory } from "../../src/storage/memory/layer.ts"
import { createActiveTables } from "../../src/storage/Storage.ts"
import { httpRequest, nodeOptions, openClient, routerDelivery, routerSignature, type TestClient } from "./client.ts"

const CHID = "eac8e1de-cddf-42d6-9919-a7b0e0f41e59"
const OTHER_KEY = "CkiBNLrHHFiXrt1nm-XGsLqqYd6c9dqgk9WJbVW2kLQ="

const nodeLayer = (auth: Layer.Layer<RouterAuth>) =>
  ConnectionNode.layer(nodeOptions, (port) => `http://127.0.0.1:${port}`).pipe(
    Layer.provideMerge(Layer.effectDiscard(createActiveTables).pipe(
      Layer.provideMerge(layerMemory({ routerTable: "router", messageTablePrefix: "message", noTableRotation: false }))
    )),
    Layer.provideMerge(Layer.mergeAll(
      Broadcasts.layerStatic(),
      EndpointCrypto.layerTest,
      EventLog.layer(),
      Metrics.layerMemory,
      NodeClient.layer({ connectTimeoutMs: 500, requestTimeoutMs: 500 })
    )),
    Layer.provideMerge(auth)
  )

/** A subscribed client on the node, and its router URL. */
const subscribed = Effect.gen(function*() {
  const node = yield* ConnectionNode
  const client = yield* Effect.acquireRelease(
    Effect.promise(() => openClient(`ws://127.0.0.1:${node.port}/`)),
    (c) => Effect.promise(() => c.close())
  )
  client.send({ messageType: "hello", use_webpush: true })
  const uaid = (yield* Effect.promise(() => client.next()))["uaid"] as string
  client.send({ messageType: "register", channelID: CHID })
  yield* Effect.promise(() => client.next())
  return { client, uaid, router: `http://127.0.0.1:${node.routerPort}` }
})

const refusedCount = (reason: string) => Effect.map(Metrics, (m) => m.value(METRICS.routerAuthRefused.name, { reason }) ?? 0)

/** The notification of `version`, within 5 s. */
const notified = (client: TestClient, version: string) =>
  Effect.promise(() => client.next((frame) => frame["messageType"] === "notification" && frame["version"] === version))

describe("router port authentication", () => {
  it.live("unsigned, wrongly keyed, stale, tampered: refused, counted, never delivered; signed: delivered", () =>
    Effect.gen(function*() {
      const { client, uaid, router } = yield* subscribed
      const path = `/push/${uaid}`
      const body = routerDelivery(CHID, "v-refused")
      const put = (headers: Record<string, string>, sentPath = path, sentBody = body) =>
        Effect.promise(() => httpRequest("PUT", `${router}${sentPath}`, sentBody, headers))

      const unsigned = yield* put({})
      assert.strictEqual(unsigned.status, 401)
      assert.strictEqual(JSON.parse(unsigned.body).message, "This request must be signed by a node of this deployment")
      assert.strictEqual(unsigned.headers["connection"], "close")
      const other = makeRouterAuth({ keys: Redacted.make([OTHER_KEY]), acceptUnsigned: false })
      assert.strictEqual((yield* put({ [ROUTER_AUTH_HEADER]: other.sign(Date.now(), "PUT", path, undefined, body) })).status, 403)
      assert.strictEqual((yield* put(routerSignature("PUT", path, body), path, `${body} `)).status, 403, "body changed")
      const otherUaid = `${uaid.slice(0, 31)}${uaid.endsWith("0") ? "1" : "0"}`
      assert.strictEqual((yield* put(routerSignature("PUT", `/push/${otherUaid}`, body), path)).status, 403, "path changed")
      assert.strictEqual((yield* put(routerSignature("PUT", path, body, "1"), path)).status, 403, "Autopush-Connected-At not signed as sent")
      const stale = makeRouterAuth({ keys: Redacted.make([TEST_CRYPTO_KEY]), acceptUnsigned: false })
        .sign(Date.now() - 120_000, "PUT", path, undefined, body)
      assert.strictEqual((yield* put({ [ROUTER_AUTH_HEADER]: stale })).status, 403, "two minutes old")
      assert.strictEqual((yield* put({ [ROUTER_AUTH_HEADER]: "t=1,v1=x" })).status, 403, "malformed")
      // Pokes and kicks are signed too.
      assert.strictEqual((yield* Effect.promise(() => httpRequest("PUT", `${router}/notif/${uaid}`))).status, 401)
      assert.strictEqual((yield* Effect.promise(() => httpRequest("DELETE", `${router}/notif/${uaid}/1`))).status, 401)
      // The operators' and health routes are not router API requests: no signature asked.
      assert.strictEqual((yield* Effect.promise(() => httpRequest("GET", `${router}/__lbheartbeat__`))).status, 200)

      assert.strictEqual(yield* refusedCount("unsigned"), 3)
      assert.strictEqual(yield* refusedCount("bad_signature"), 4)
      assert.strictEqual(yield* refusedCount("stale"), 1)
      assert.strictEqual(yield* refusedCount("malformed"), 1)
      yield* Effect.promise(() => client.quiet(300))
      assert.isFalse(client.received.some((frame) => frame["messageType"] === "notification"), "no refused request reached the client")

      const signedBody = routerDelivery(CHID, "v-signed")
      assert.strictEqual((yield* put(routerSignature("PUT", path, signedBody), path, signedBody)).status, 200)
      yield* notified(client, "v-signed")
    }).pipe(Effect.provide(nodeLayer(RouterAuth.layerTest))))

  it.live("router_accept_unsigned: unsigned requests deliver (counted as accepted_unsigned), a bad signature is still refused", () =>
    Effect.gen(function*() {
      const { client, uaid, router } = yield* subscribed
      const body = routerDelivery(CHID, "v-unsigned")
      assert.strictEqual((yield* Effect.promise(() => httpRequest("PUT", `${router}/push/${uaid}`, body))).status, 200)
      yield* notified(client, "v-unsigned")
      assert.strictEqual(yield* refusedCount("accepted_unsigned"), 1)
      const other = makeRouterAuth({ keys: Redacted.make([OTHER_KEY]), acceptUnsigned: false })
      const forged = { [ROUTER_AUTH_HEADER]: other.sign(Date.now(), "PUT", `/push/${uaid}`, undefined, body) }
      assert.strictEqual((yield* Effect.promise(() => httpRequest("PUT", `${router}/push/${uaid}`, body, forged))).status, 403)
    }).pipe(Effect.provide(nodeLayer(RouterAuth.layer({ keys: Redacted.make([TEST_CRYPTO_KEY]), acceptUnsigned: true })))))

  it.live("the window is the node's Clock: a signature made now is stale once that clock is 61 s on", () => {
    let offsetMs = 0
    const real = Clock.Clock.defaultValue()
    const shifted: Clock.Clock = Object.assign(Object.create(real) as Clock.Clock, {
      currentTimeMillisUnsafe: () => real.currentTimeMillisUnsafe() + offsetMs,
      currentTimeMillis: Effect.sync(() => real.currentTimeMillisUnsafe() + offsetMs)
    })
    return Effect.gen(function*() {
      const { uaid, router } = yield* subscribed
      const body = routerDelivery(CHID, "v-clock")
      const put = () => Effect.promise(() => httpRequest("PUT", `${router}/push/${uaid}`, body, routerSignature("PUT", `/push/${uaid}`, body)))
      assert.strictEqual((yield* put()).status, 200)
      offsetMs = 61_000
      assert.strictEqual((yield* put()).status, 403)
      offsetMs = -61_000
      assert.strictEqual((yield* put()).status, 403)
      offsetMs = 59_000
      assert.strictEqual((yield* put()).status, 200)
      assert.strictEqual(yield* refusedCount("stale"), 2)
    }).pipe(Effect.provide(nodeLayer(RouterAuth.layerTest).pipe(Layer.provide(Layer.succeed(Clock.Clock, shifted)))))
  })
})
