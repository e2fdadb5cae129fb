/** The broadcast admin API on the endpoint node: bearer tokens, validation, the set in storage. */
import { assert, describe, layer } from "@effect/vitest"
import { Effect, Redacted } from "effect"
import { MORE_INFO } from "../../src/domain/errors.ts"
import { endpointWith, FakeNodeClient, options, request, TestEndpoint } from "./harness.ts"

const TOKEN = "admin-token-1"
const withTokens = endpointWith(FakeNodeClient, { ...options, broadcastAdminTokens: [Redacted.make("other"), Redacted.make(TOKEN)] })
const auth = { authorization: `Bearer ${TOKEN}` }
const body = (text: string) => JSON.parse(text) as unknown
const errorJson = (code: number, errno: number | null, error: string, message: string) => ({ code, errno, error, message, more_info: MORE_INFO })

describe("broadcast admin API", () => {
  layer(TestEndpoint, { excludeTestServices: true })((it) => {
    it.effect("without broadcast_admin_tokens the API does not exist", () =>
      Effect.gen(function*() {
        const reply = yield* request({ method: "GET", path: "/v1/broadcasts", headers: auth })
        assert.strictEqual(reply.status, 404)
        assert.deepStrictEqual(body(reply.text), errorJson(404, null, "Not Found", "Not Found"))
      }))
  })

  layer(withTokens, { excludeTestServices: true })((it) => {
    it.effect("a wrong or missing token is 401/109", () =>
      Effect.gen(function*() {
        for (const headers of [{}, { authorization: "Bearer nope" }, { authorization: TOKEN }, { authorization: `Basic ${TOKEN}` }]) {
          const reply = yield* request({ method: "GET", path: "/v1/broadcasts", headers })
          assert.strictEqual(reply.status, 401)
          assert.deepStrictEqual(body(reply.text), errorJson(401, 109, "Unauthorized", "Invalid broadcast admin token"))
        }
        const put = yield* request({ method: "PUT", path: "/v1/broadcasts/a", headers: { authorization: "Bearer nope" }, body: "{\"version\":\"1\"}" })
        assert.strictEqual(put.status, 401)
      }))

    it.effect("PUT sets a version (ids with / raw or encoded), GET lists, DELETE removes; an unknown id is 404", () =>
      Effect.gen(function*() {
        const put = (path: string, version: string) => request({ method: "PUT", path, headers: auth, body: JSON.stringify({ version }) })
        assert.strictEqual((yield* put("/v1/broadcasts/remote-settings/monitor_changes", "\"1700000000000\"")).status, 200)
        const second = yield* put("/v1/broadcasts/test%2Fbroadcast", "v1")
        assert.strictEqual(second.status, 200)
        assert.deepStrictEqual(body(second.text), { broadcasts: { "remote-settings/monitor_changes": "\"1700000000000\"", "test/broadcast": "v1" } })
        yield* put("/v1/broadcasts/test/broadcast", "v2")
        const listed = yield* request({ method: "GET", path: "/v1/broadcasts", headers: auth })
        assert.deepStrictEqual(body(listed.text), { broadcasts: { "remote-settings/monitor_changes": "\"1700000000000\"", "test/broadcast": "v2" } })
        const removed = yield* request({ method: "DELETE", path: "/v1/broadcasts/test/broadcast", headers: auth })
        assert.deepStrictEqual(body(removed.text), { broadcasts: { "remote-settings/monitor_changes": "\"1700000000000\"" } })
        const again = yield* request({ method: "DELETE", path: "/v1/broadcasts/test/broadcast", headers: auth })
        assert.strictEqual(again.status, 404)
        assert.deepStrictEqual(body(again.text), errorJson(404, null, "Not Found", "Broadcast not found"))
      }))

    it.effect("bad ids and versions are 400 with what is allowed", () =>
      Effect.gen(function*() {
        const cases: Array<[string, string]> = [
          ["/v1/broadcasts/has%20space", "{\"version\":\"1\"}"],
          [`/v1/broadcasts/${"a".repeat(129)}`, "{\"version\":\"1\"}"],
          ["/v1/broadcasts/ok", "{\"version\":\"with space\"}"],
          ["/v1/broadcasts/ok", "{\"version\":1}"],
          ["/v1/broadcasts/ok", "not json"],
          ["/v1/broadcasts/ok", JSON.stringify({ version: "v".repeat(129) })]
        ]
        for (const [path, text] of cases) {
          const reply = yield* request({ method: "PUT", path, headers: auth, body: text })
          assert.strictEqual(reply.status, 400, `${path} ${text}`)
          assert.strictEqual((body(reply.text) as { errno: unknown }).errno, null)
        }
        // A path that is not valid percent-encoding names no route, as everywhere on this port.
        assert.strictEqual((yield* request({ method: "PUT", path: "/v1/broadcasts/%E0%A4%A", headers: auth, body: "{\"version\":\"1\"}" })).status, 404)
        const big = yield* request({ method: "PUT", path: "/v1/broadcasts/ok", headers: auth, body: JSON.stringify({ version: "1", pad: "x".repeat(10_000) }) })
        assert.strictEqual(big.status, 400)
        assert.strictEqual((yield* request({ method: "POST", path: "/v1/broadcasts/ok", headers: auth })).status, 405)
      }))
  })
})
