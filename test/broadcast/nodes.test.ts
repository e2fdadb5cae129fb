/**
 * Broadcasts end to end, in one process: two connection nodes and an endpoint node over one
 * dynalite server. An operator changes a broadcast through the endpoint's admin API; every client
 * that follows it, on either node, gets the new version at its next keepalive, and a client that
 * is up to date gets nothing.
 */
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, assert, describe, it } from "@effect/vitest"
import { Context, Effect, Layer, Redacted } from "effect"
import { Broadcasts, storageSource } from "../../src/broadcast/Broadcasts.ts"
import { ConnectionNode } from "../../src/connection/node.ts"
import { EndpointCrypto } from "../../src/crypto/endpoint.ts"
import { boundPort, EndpointServer } from "../../src/endpoint/server.ts"
import { EventLog } from "../../src/observability/EventLog.ts"
import { Metrics } from "../../src/observability/Metrics.ts"
import { NodeClient } from "../../src/routers/NodeClient.ts"
import { RouterAuth } from "../../src/crypto/routerAuth.ts"
import { layerDynamo } from "../../src/storage/dynamo/layer.ts"
import { startDynalite } from "../../src/storage/dynalite/embedded.ts"
import { createActiveTables } from "../../src/storage/Storage.ts"
import { httpRequest, nodeOptions, openClient } from "../connection/client.ts"
import { options as endpointOptions } from "../endpoint/harness.ts"

const dataDir = mkdtempSync(join(tmpdir(), "autopush-broadcast-"))
afterAll(() => rmSync(dataDir, { recursive: true, force: true }))

const TOKEN = "operator-token"
const ID = "remote-settings/monitor_changes"

describe("broadcasts across nodes", () => {
  it.live("an admin change reaches the followers on both connection nodes at their next keepalive", () =>
    Effect.gen(function*() {
      const endpoint = yield* startDynalite(dataDir)
      const storage = Layer.effectDiscard(createActiveTables).pipe(
        Layer.provideMerge(layerDynamo({ endpoint, region: "local", routerTable: "router", messageTablePrefix: "message", noTableRotation: false }))
      )
      const shared = Layer.mergeAll(EndpointCrypto.layerTest, EventLog.layer(), Metrics.layerMemory, NodeClient.layer({ connectTimeoutMs: 500, requestTimeoutMs: 500 }).pipe(Layer.provideMerge(RouterAuth.layerTest)))
      const connectionNode = ConnectionNode.layer({ ...nodeOptions, autoPingIntervalMs: 300 }, (port) => `http://127.0.0.1:${port}`).pipe(
        Layer.provide(Layer.unwrap(Effect.map(storageSource, (source) => Broadcasts.layerPolling(source, 100, "storage")))),
        Layer.provideMerge(storage),
        Layer.provideMerge(shared)
      )
      const portOf = (context: Context.Context<ConnectionNode>) => Context.get(context, ConnectionNode).port
      const [a, b] = [portOf(yield* Layer.build(connectionNode)), portOf(yield* Layer.build(connectionNode))]
      const admin = yield* Layer.build(EndpointServer.layer({ ...endpointOptions, broadcastAdminTokens: [Redacted.make(TOKEN)] }).pipe(
        Layer.provideMerge(storage),
        Layer.provideMerge(shared)
      ))
      const adminUrl = `http://127.0.0.1:${yield* boundPort.pipe(Effect.provide(admin))}/v1/broadcasts/${ID}`
      const put = (version: string) =>
        Effect.promise(() => httpRequest("PUT", adminUrl, JSON.stringify({ version }), { authorization: `Bearer ${TOKEN}`, "content-type": "application/json" }))

      assert.strictEqual((yield* put("v1")).status, 200)
      yield* Effect.sleep(300) // both nodes have read it

      // Followers on each node, one already up to date, one that follows nothing.
      const hello = (port: number, broadcasts: Record<string, string>) =>
        Effect.promise(async () => {
          const client = await openClient(`ws://127.0.0.1:${port}/`)
          client.send({ messageType: "hello", use_webpush: true, broadcasts })
          return { client, reply: await client.next((m) => m["messageType"] === "hello") }
        })
      const onA = yield* hello(a, { [ID]: "v0", "no/such": "v0" })
      assert.deepStrictEqual(onA.reply["broadcasts"], { [ID]: "v1", errors: { "no/such": "Broadcast not found" } })
      const onB = yield* hello(b, { [ID]: "v1" })
      assert.deepStrictEqual(onB.reply["broadcasts"], {})
      const none = yield* hello(b, {})

      assert.strictEqual((yield* put("v2")).status, 200)
      const change = (client: typeof onA.client) => Effect.promise(() => client.next((m) => m["messageType"] === "broadcast", 3_000))
      assert.deepStrictEqual((yield* change(onA.client))["broadcasts"], { [ID]: "v2" })
      assert.deepStrictEqual((yield* change(onB.client))["broadcasts"], { [ID]: "v2" })
      // Up to date now: nothing more; the one that follows nothing never hears of it.
      assert.isTrue(yield* Effect.promise(() => onA.client.quiet(800, (m) => m["messageType"] === "broadcast")))
      assert.isTrue(yield* Effect.promise(() => none.client.quiet(100, (m) => m["messageType"] === "broadcast")))
      for (const client of [onA.client, onB.client, none.client]) yield* Effect.promise(() => client.close())
    }).pipe(Effect.scoped), 30_000)
})
