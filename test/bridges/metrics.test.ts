/**
 * Bridge outcomes as metrics (`notification.bridge.sent{platform}`, `.error{platform,reason}`,
 * `notification.routed{outcome=bridged}`) and in the message trace, folded from the domain events.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Effect, Layer, Logger, Redacted } from "effect"
import { EndpointCrypto } from "../../src/crypto/endpoint.ts"
import { EndpointServer } from "../../src/endpoint/server.ts"
import { MessageTrace } from "../../src/observability/MessageTrace.ts"
import { Metrics } from "../../src/observability/Metrics.ts"
import { observabilityLayerMemory } from "../../src/observability/observability.ts"
import { WebPushRouter } from "../../src/routers/webpush.ts"
import { FakeNodeClient, options, push, TestStorage } from "../endpoint/harness.ts"
import { AUTH_KEY, pathOf, register } from "./harness.ts"

const Observed = EndpointServer.layerServer({ ...options, authKeys: Redacted.make([AUTH_KEY]), bridges: { stub: true } }).pipe(
  Layer.provideMerge(WebPushRouter.layer),
  Layer.provideMerge(FakeNodeClient),
  Layer.provideMerge(Layer.mergeAll(TestStorage, EndpointCrypto.layerTest, observabilityLayerMemory())),
  Layer.provide(Logger.layer([]))
)

describe("bridge metrics", () => {
  layer(Observed, { excludeTestServices: true })((it) => {
    it.effect("sent and error counters by platform and reason; routed outcome bridged; trace state bridged", () =>
      Effect.gen(function*() {
        const metrics = yield* Metrics
        const ok = yield* register("stub", "success", { token: "success" })
        const failing = yield* register("stub", "error", { token: "success" })
        const sent = yield* push({ path: pathOf(ok.endpoint) }, { urgency: "low" })
        assert.strictEqual(sent.status, 201)
        assert.strictEqual((yield* push({ path: pathOf(failing.endpoint) })).status, 502)
        assert.strictEqual(metrics.value("notification.bridge.sent", { platform: "stub" }), 1)
        assert.strictEqual(metrics.value("notification.bridge.error", { platform: "stub", reason: "upstream" }), 1)
        assert.strictEqual(metrics.value("notification.routed", { outcome: "bridged" }), 1)
        assert.strictEqual(metrics.value("notification.routed", { outcome: "failed" }), 1)
        const trace = (yield* MessageTrace).lookup((sent.headers["location"] ?? "").split("/m/")[1] ?? "")
        assert.strictEqual(trace?.state, "bridged")
        assert.deepInclude(trace?.events.find((e) => e.type === "notification.accepted.1")?.data, { urgency: "low" })
      }))
  })
})
