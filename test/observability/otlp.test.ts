/**
 * OTLP traces end to end: an endpoint node and a connection node, joined by a real HTTP hop on the
 * router port, export to a local OTLP/HTTP receiver; a push that is delivered and acked makes one
 * trace whose connection-node spans are children of the endpoint's routing span.
 */
import { Broadcasts } from "../../src/broadcast/Broadcasts.ts"
import { createServer, request } from "node:http"
import type { AddressInfo } from "node:net"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer, Redacted } from "effect"
import { EndpointCrypto, TEST_CRYPTO_KEY } from "../../src/crypto/endpoint.ts"
import { ConnectionNode } from "../../src/connection/node.ts"
import { EndpointServer, boundPort } from "../../src/endpoint/server.ts"
import { observabilityLayer } from "../../src/observability/observability.ts"
import { tracingLayer } from "../../src/observability/tracing.ts"
import { NodeClient } from "../../src/routers/NodeClient.ts"
import { RouterAuth } from "../../src/crypto/routerAuth.ts"
import { layerMemory } from "../../src/storage/memory/layer.ts"
import { createActiveTables } from "../../src/storage/Storage.ts"
import { connectionNodeOptions } from "../../src/bin/app.ts"
import { makeSettings } from "../../src/config/index.ts"
import { openClient } from "../connection/client.ts"
import { options as endpointOptions } from "../endpoint/harness.ts"

interface OtlpSpan {
  readonly name: string
  readonly traceId: string
  readonly spanId: string
  readonly parentSpanId?: string
  readonly attributes?: ReadonlyArray<{ readonly key: string; readonly value: Record<string, unknown> }>
}

/** A local OTLP/HTTP receiver: every span of every `POST /v1/traces`. */
const receiver = Effect.acquireRelease(
  Effect.callback<{ readonly url: string; readonly spans: Array<OtlpSpan>; readonly bodies: Array<string>; readonly close: () => void }>((resume) => {
    const spans: Array<OtlpSpan> = []
    const bodies: Array<string> = []
    const server = createServer((req, res) => {
      const chunks: Array<Buffer> = []
      req.on("data", (c: Buffer) => chunks.push(c))
      req.on("end", () => {
        const body = Buffer.concat(chunks).toString()
        if (req.url === "/v1/traces") {
          bodies.push(body)
          const json = JSON.parse(body) as { resourceSpans: Array<{ scopeSpans: Array<{ spans: Array<OtlpSpan> }> }> }
          for (const r of json.resourceSpans) for (const s of r.scopeSpans) spans.push(...s.spans)
        }
        res.writeHead(200, { "content-type": "application/json" }).end("{}")
      })
    })
    server.listen(0, "127.0.0.1", () =>
      resume(Effect.succeed({
        url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
        spans,
        bodies,
        close: () => {
          server.closeAllConnections()
          server.close()
        }
      })))
  }),
  (r) => Effect.sync(r.close)
)

const post = (url: string, headers: Record<string, string>) =>
  new Promise<{ status: number; location: string }>((resolve, reject) => {
    const req = request(url, { method: "POST", headers }, (res) => {
      res.resume()
      res.on("end", () => resolve({ status: res.statusCode ?? 0, location: String(res.headers["location"]) }))
    })
    req.on("error", reject)
    req.end()
  })

describe("OTLP traces", () => {
  it.live("a delivered and acked push: accept → route → (router port) → deliver, ack, in one trace", () =>
    Effect.gen(function*() {
      const otlp = yield* receiver
      const storage = Layer.effectDiscard(createActiveTables).pipe(
        Layer.provideMerge(layerMemory({ routerTable: "router", messageTablePrefix: "message", noTableRotation: false }))
      )
      const connection = ConnectionNode.layer(
        { ...connectionNodeOptions(makeSettings()), port: 0, routerPort: 0, bindHost: "127.0.0.1" },
        (port) => `http://127.0.0.1:${port}`
      ).pipe(Layer.provideMerge(Layer.mergeAll(Broadcasts.layerStatic(), NodeClient.layer({ connectTimeoutMs: 500, requestTimeoutMs: 1_000 }))))
      // Separate nodes in one process: the endpoint reaches the connection node over HTTP.
      const nodes = Layer.mergeAll(connection, EndpointServer.layer({ ...endpointOptions, port: 0, bindHost: "127.0.0.1" }))
      const app = nodes.pipe(
        Layer.provideMerge(Layer.mergeAll(storage, RouterAuth.layerTest, EndpointCrypto.layer({ keys: Redacted.make([TEST_CRYPTO_KEY]), endpointUrl: "http://127.0.0.1" }))),
        Layer.provideMerge(observabilityLayer({ role: "autopush" }))
      )
      const traced = tracingLayer({ otlpEndpoint: otlp.url, serviceName: "autopush", serviceVersion: "test", exportIntervalMs: 50 })

      let token = ""
      yield* Effect.scoped(
        Effect.gen(function*() {
          const { port } = yield* ConnectionNode
          const endpointPort = yield* boundPort
          const client = yield* Effect.promise(() => openClient(`ws://127.0.0.1:${port}/`))
          client.send({ messageType: "hello", use_webpush: true })
          yield* Effect.promise(() => client.next((f) => f["messageType"] === "hello"))
          client.send({ messageType: "register", channelID: "eac8e1de-cddf-42d6-9919-a7b0e0f41e59" })
          const registered = yield* Effect.promise(() => client.next((f) => f["messageType"] === "register"))
          const path = new URL(registered["pushEndpoint"] as string).pathname
          token = path.split("/").pop() as string
          const reply = yield* Effect.promise(() => post(`http://127.0.0.1:${endpointPort}${path}`, { ttl: "60" }))
          assert.strictEqual(reply.status, 201)
          const notification = yield* Effect.promise(() => client.next((f) => f["messageType"] === "notification"))
          client.send({ messageType: "ack", updates: [{ channelID: notification["channelID"], version: notification["version"] }] })
          yield* Effect.promise(() => client.quiet(200))
          yield* Effect.promise(() => client.close())
        }).pipe(Effect.provide(app))
      ).pipe(Effect.provide(traced))
      // The tracer's scope is closed: everything is flushed.
      const named = (name: string) => {
        const found = otlp.spans.filter((s) => s.name === name)
        assert.strictEqual(found.length, 1, `one ${name} span in ${JSON.stringify(otlp.spans.map((s) => s.name))}`)
        return found[0]!
      }
      const accept = named("notification.accept")
      const route = named("notification.route")
      const deliver = named("notification.deliver")
      const ack = named("notification.ack")
      assert.strictEqual(route.parentSpanId, accept.spanId)
      for (const span of [route, deliver, ack]) assert.strictEqual(span.traceId, accept.traceId)
      assert.strictEqual(deliver.parentSpanId, route.spanId, "the connection node's span is a child of the endpoint's")
      assert.strictEqual(ack.parentSpanId, route.spanId)
      const exported = otlp.bodies.join("\n")
      assert.notInclude(exported, token, "no endpoint token leaves the service")
      assert.notInclude(exported, "/wpush/")
    }))
})
