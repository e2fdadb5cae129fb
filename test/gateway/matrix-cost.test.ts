/**
 * What a hostile notify request costs: bodies up to the 64 KiB limit built to make the gateway work
 * hardest (thousands of small fields, deep nesting, long runs of one character, escapes and
 * unicode, as many devices as it takes, one subscription under many spellings), each sent to the
 * endpoint's real HTTP server. Each is answered within a bound far above what it takes (the machine
 * running the tests is shared; the bench `bench:abuse` prints the real figures), the event loop is
 * never held that long meanwhile (every other client of the node waits on it), and no subscription
 * is pushed more than once per request.
 */
import { monitorEventLoopDelay } from "node:perf_hooks"
import { assert, describe, layer } from "@effect/vitest"
import { Effect } from "effect"
import { TEST_ENDPOINT_URL } from "../../src/crypto/endpoint.ts"
import { MAX_DEVICES, MAX_NESTING, MAX_NOTIFY_BYTES } from "../../src/gateway/matrixRequest.ts"
import { messagesOf, request, subscribe, type Subscription, TestEndpoint } from "../endpoint/harness.ts"

/** Each request's answer must come within this (ms); it takes a few ms to tens of ms. */
const BOUND_MS = 1_000

/** `parts` joined by commas, as many as fit in `bytes` with `open` and `close` around them. */
const filled = (open: string, close: string, part: (i: number) => string, bytes = MAX_NOTIFY_BYTES): string => {
  const parts: Array<string> = []
  let size = Buffer.byteLength(open) + Buffer.byteLength(close)
  for (let i = 0; ; i++) {
    const next = part(i)
    const cost = Buffer.byteLength(next) + (parts.length > 0 ? 1 : 0)
    if (size + cost > bytes) break
    parts.push(next)
    size += cost
  }
  return `${open}${parts.join(",")}${close}`
}

/** JSON string text (without its quotes) of `unit` repeated, at most `bytes` bytes of it. */
const run = (unit: string, bytes: number): string => {
  const escaped = JSON.stringify(unit).slice(1, -1)
  return escaped.repeat(Math.floor(bytes / Buffer.byteLength(escaped)))
}

const device = (pushkey: string) => ({ app_id: "a", pushkey })

/** The notify request's body at most 64 KiB: `notification` with the device of `sub` and `fields`. */
const bodyWith = (sub: Subscription, fields: string): string => `{"notification":{"devices":[${JSON.stringify(device(sub.endpoint))}],"event_id":"$e",${fields}}}`

const timed = (body: string) =>
  Effect.gen(function*() {
    assert.isAtMost(Buffer.byteLength(body), MAX_NOTIFY_BYTES, body.slice(0, 120))
    const started = performance.now()
    const reply = yield* request({ method: "POST", path: "/_matrix/push/v1/notify", headers: { "content-type": "application/json" }, body })
    return { status: reply.status, json: reply.json(), ms: performance.now() - started }
  })

const storedCount = (sub: Subscription) => Effect.map(messagesOf(sub), (messages) => messages.length)

describe("Matrix push gateway: hostile input costs bounded work", () => {
  layer(TestEndpoint, { excludeTestServices: true })((it) => {
    it.effect(`every body built for cost is answered within ${BOUND_MS} ms, the event loop never held that long, and pushed at most once`, () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        const token = sub.path.split("/").pop()
        const lag = monitorEventLoopDelay({ resolution: 10 })
        lag.enable()
        const cases: ReadonlyArray<readonly [string, string, number, number]> = [
          // name, body, expected status, pushes of `sub` it adds
          ["thousands of small fields", filled(`{"notification":{"devices":[${JSON.stringify(device(sub.endpoint))}],"event_id":"$fields",`, "}}", (i) => `"f${i}":1`), 200, 1],
          ["thousands of small fields in content", bodyWith(sub, filled(`"content":{`, "}", (i) => `"${i}":[]`, MAX_NOTIFY_BYTES - 300)).replace("$e", "$content"), 200, 1],
          ["a long run of one character", bodyWith(sub, `"content":{"body":"${run("a", MAX_NOTIFY_BYTES - 400)}"}`).replace("$e", "$run"), 200, 1],
          ["escapes that grow when written out", bodyWith(sub, `"content":{"body":"${run("\u0000", MAX_NOTIFY_BYTES - 400)}"}`).replace("$e", "$escapes"), 200, 1],
          ["unicode, astral and lone surrogates", bodyWith(sub, `"content":{"body":"${run("😀\ud800é", MAX_NOTIFY_BYTES - 400)}"}`).replace("$e", "$unicode"), 200, 1],
          ["an event_id of one long run (too large to push: not pushed)", `{"notification":{"devices":[${JSON.stringify(device(sub.endpoint))}],"event_id":"${run("$", MAX_NOTIFY_BYTES - 400)}"}}`, 200, 0],
          ["nesting at the limit", bodyWith(sub, `"content":{"x":${"[".repeat(MAX_NESTING - 3)}${"]".repeat(MAX_NESTING - 3)}}`).replace("$e", "$nested"), 200, 1],
          ["nesting as deep as the body allows", `{"notification":{"devices":[],"content":{"x":${"[".repeat(32_000)}${"]".repeat(32_000)}}}}`, 400, 0],
          ["duplicate keys", bodyWith(sub, filled("", "", () => `"k":"v"`, MAX_NOTIFY_BYTES - 300)).replace("$e", "$dupes"), 200, 1],
          ["a pushkey of one long run", `{"notification":{"devices":[${JSON.stringify(device(`https://h/wpush/v1/${run("a", MAX_NOTIFY_BYTES - 200)}`))}]}}`, 200, 0],
          ["a pushkey of path segments", `{"notification":{"devices":[${JSON.stringify(device(`https://h/${run("x/../", MAX_NOTIFY_BYTES - 300)}wpush/v1/${token}`))}],"event_id":"$segments"}}`, 200, 1],
          ["the most devices, all long foreign pushkeys", JSON.stringify({ notification: { devices: Array.from({ length: MAX_DEVICES }, (_, i) => device(`https://h${i}/wpush/v1/${"b".repeat(850)}`)) } }), 200, 0],
          [
            "one subscription under the most spellings, padded to the limit",
            JSON.stringify({ notification: { event_id: "$spellings", devices: Array.from({ length: MAX_DEVICES }, (_, i) => device(`${TEST_ENDPOINT_URL}/wpush/v1/${token}?${i}=${"q".repeat(800)}`)) } }),
            200,
            1
          ],
          ["more devices than taken", JSON.stringify({ notification: { devices: Array.from({ length: 2_000 }, () => device("k")) } }), 413, 0]
        ]
        let expected = 0
        for (const [name, body, status, pushes] of cases) {
          const reply = yield* timed(body)
          expected += pushes
          assert.strictEqual(reply.status, status, `${name}: ${JSON.stringify(reply.json)}`)
          assert.isBelow(reply.ms, BOUND_MS, name)
          assert.strictEqual(yield* storedCount(sub), expected, name)
        }
        lag.disable()
        assert.isBelow(lag.max / 1e6, BOUND_MS, "the event loop's longest delay (ms)")
      }))

    it.effect(`${MAX_DEVICES} subscriptions of ours in one request: each pushed once, within ${BOUND_MS} ms`, () =>
      Effect.gen(function*() {
        const subs = yield* Effect.forEach(Array.from({ length: MAX_DEVICES }), () => subscribe())
        const reply = yield* timed(JSON.stringify({ notification: { event_id: "$fan-out", devices: subs.map((sub) => device(sub.endpoint)) } }))
        assert.deepStrictEqual([reply.status, reply.json], [200, { rejected: [] }])
        assert.isBelow(reply.ms, BOUND_MS)
        for (const sub of subs) assert.strictEqual(yield* storedCount(sub), 1)
      }))
  })
})
