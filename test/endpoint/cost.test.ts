/**
 * Hostile input costs bounded work. Every route of the endpoint port gets the most expensive
 * requests of its size limits (`abusive.ts`: the longest header each protocol allows made of a run
 * of one character, unicode, repeated headers, registration bodies of many keys or deep nesting),
 * over HTTP/1.1 and HTTP/2, while another client pushes: each answer comes within `BOUND_MS`, and so
 * does each of the other client's pushes. (The bound is generous for a loaded machine; before the
 * header parsing was made linear, one such push took seconds. `bench:abuse` prints the real figures.)
 *
 * And the health routes cost the store one table check per few seconds, however often asked.
 */
import { assert, describe, it, layer } from "@effect/vitest"
import * as http from "node:http"
import { Effect, Layer, Logger, Redacted } from "effect"
import { TestClock } from "effect/testing"
import { EndpointCrypto } from "../../src/crypto/endpoint.ts"
import { encryptionOf, isHpkeMessage, parseParams, stripHeaderValue, ttlOf } from "../../src/endpoint/headers.ts"
import { clientAddress, trustedProxies } from "../../src/endpoint/rateLimits.ts"
import { boundPort, EndpointServer } from "../../src/endpoint/server.ts"
import { parseVapid } from "../../src/endpoint/vapid.ts"
import { decodeVapidPublicKey } from "../../src/crypto/endpoint.ts"
import { EventLog } from "../../src/observability/EventLog.ts"
import { Metrics } from "../../src/observability/Metrics.ts"
import { WebPushRouter } from "../../src/routers/webpush.ts"
import { layerMemory } from "../../src/storage/memory/layer.ts"
import { mapStorageOperations, Storage, StorageError } from "../../src/storage/Storage.ts"
import { Unavailable } from "../../src/storage/failures.ts"
import { cachedTableStatus, TABLE_STATUS_TTL_MS } from "../../src/storage/tableKeeper.ts"
import { HEADER_ROOM, PROTOCOLS, refusedAsTooLarge, ROUTE_ABUSES, send, type Targets } from "./abusive.ts"
import { endpointWith, FakeNodeClient, fakeNode, options, subscribe, TestStorage } from "./harness.ts"

/** No request may hold the node longer than this (the service's goal is 100 ms; the machine running tests is loaded). */
const BOUND_MS = 500

const AUTH_KEY = "k".repeat(43) + "="

const Abused = endpointWith(FakeNodeClient, {
  ...options,
  authKeys: Redacted.make([AUTH_KEY]),
  bridges: { stub: true },
  broadcastAdminTokens: [Redacted.make("admin-token")],
  // The loopback as a trusted proxy: X-Forwarded-For is read (the rates are high enough to refuse nothing).
  rateLimits: { perAddress: { perSecond: 1e6, burst: 1e6 }, perVapidKey: { perSecond: 0, burst: 1 }, perSubscription: { perSecond: 0, burst: 1 }, trustedProxies: ["127.0.0.1"] }
}).pipe(Layer.provide(Logger.layer([])))

/** Pushes to `path` one after another until `stop` is called: their times (ms). */
const victim = (port: number, path: string) => {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 })
  const times: Array<number> = []
  let running = true
  const pushOne = () =>
    new Promise<void>((resolve) => {
      const started = performance.now()
      const req = http.request({ host: "127.0.0.1", port, method: "POST", path, agent, headers: { ttl: "60", "content-encoding": "aes128gcm", "content-length": 16 } }, (res) => {
        res.resume()
        res.on("end", () => {
          if (res.statusCode === 201) times.push(performance.now() - started)
          resolve()
        })
      })
      req.on("error", () => resolve())
      req.end(Buffer.alloc(16, 7))
    })
  const loop = (async () => {
    while (running) await pushOne()
  })()
  return {
    stop: async (): Promise<ReadonlyArray<number>> => {
      running = false
      await loop
      agent.destroy()
      return times
    }
  }
}

/** A push answered 201: its message id. */
const pushedMessageId = (port: number, path: string) =>
  new Promise<string>((resolve, reject) => {
    const req = http.request({ host: "127.0.0.1", port, method: "POST", path, headers: { ttl: "60", "content-length": 0 } }, (res) => {
      res.resume()
      res.on("end", () => resolve(new URL(String(res.headers.location)).pathname.slice("/m/".length)))
    })
    req.on("error", reject)
    req.end()
  })

/** A bridged user made through the registration API. */
const registered = (port: number) =>
  new Promise<{ uaid: string; secret: string }>((resolve, reject) => {
    const body = JSON.stringify({ token: "abcdefghijk" })
    const req = http.request({ host: "127.0.0.1", port, method: "POST", path: "/v1/stub/app/registration", headers: { "content-type": "application/json", "content-length": body.length } }, (res) => {
      let text = ""
      res.on("data", (chunk: Buffer) => void (text += chunk.toString()))
      res.on("end", () => {
        const json = JSON.parse(text) as { uaid: string; secret: string }
        resolve({ uaid: json.uaid, secret: json.secret })
      })
    })
    req.on("error", reject)
    req.end(body)
  })

describe("the cost of hostile input", () => {
  it("header parsing is linear: a whole HTTP/2 header list of the worst character for each parser", () => {
    const room = HEADER_ROOM["HTTP/2"]
    const cases: ReadonlyArray<readonly [string, () => unknown]> = [
      ["Encryption padding strip, a run of base64url", () => stripHeaderValue("a".repeat(room))],
      ["Encryption, a run of = between values", () => stripHeaderValue(`a${"=".repeat(room)}b`)],
      ["parameter values, a run of spaces", () => parseParams(`dh=x${" ".repeat(room)}x`)],
      ["parameter values, a run of quotes", () => parseParams(`dh=x${"\"".repeat(room)}x`)],
      ["the encryption rule", () => encryptionOf({ "content-encoding": "aesgcm", encryption: `salt=${"a".repeat(room)}`, "crypto-key": `dh=${" ".repeat(room)}x` }, true)],
      ["the HPKE content type, a run of spaces", () => isHpkeMessage({ "content-type": `application/webpush-message${" ".repeat(room)}x` })],
      ["a VAPID key, a run of =", () => decodeVapidPublicKey(`${"=".repeat(room)}x`)],
      ["VAPID credentials, draft form", () => parseVapid({ authorization: "webpush a.b.c", "crypto-key": `p256ecdsa=x${" ".repeat(room)}x` })],
      ["TTL, a run of digits", () => ttlOf({ ttl: "9".repeat(room) }, 60)],
      ["TTL, a run of leading zeros", () => ttlOf({ ttl: `${"0".repeat(room)}60` }, 100)],
      ["X-Forwarded-For, a run of trusted hops", () => clientAddress("127.0.0.1", "10.0.0.1,".repeat(room / 9), trustedProxies(["127.0.0.1", "10.0.0.0/8"]))]
    ]
    for (const [name, parse] of cases) {
      const started = performance.now()
      parse()
      const ms = performance.now() - started
      assert.isBelow(ms, BOUND_MS, `${name}: ${ms.toFixed(1)} ms`)
    }
    // What linear parsing keeps: the same answers.
    assert.strictEqual(stripHeaderValue("salt=\"abc==\";rs=4096,dh=xyz="), "salt=abc;rs=4096,dh=xyz")
    assert.deepStrictEqual(parseParams(" dh = \" x \" ;a=b"), [["dh", "x"], ["a", "b"]])
    assert.deepStrictEqual(ttlOf({ ttl: "0000060" }, 100), ttlOf({ ttl: "60" }, 100))
    assert.strictEqual(ttlOf({ ttl: `1${"0".repeat(19)}` }, 100)._tag, "Failure")
    assert.strictEqual(ttlOf({ ttl: "-00000000000000000000001" }, 100)._tag, "Failure")
  })

  layer(Abused, { excludeTestServices: true })((it) => {
    for (const protocol of PROTOCOLS) {
      it.effect(`every route's most expensive requests over ${protocol} are answered within ${BOUND_MS} ms, and another client's pushes keep theirs`, () =>
        Effect.gen(function*() {
          const port = yield* boundPort
          const mine = yield* subscribe({ nodeId: yield* fakeNode(200) })
          const others = yield* subscribe({ nodeId: yield* fakeNode(200) })
          const targets: Targets = {
            pushPath: mine.path,
            messageId: yield* Effect.promise(() => pushedMessageId(port, mine.path)),
            bridged: yield* Effect.promise(() => registered(port))
          }
          const problems: Array<string> = []
          for (const abuse of ROUTE_ABUSES) {
            const request = abuse.request(HEADER_ROOM[protocol], protocol, targets)
            const pushes = victim(port, others.path)
            const answers = []
            for (let i = 0; i < 2; i++) answers.push(yield* Effect.promise(() => send(port, protocol, request)))
            const times = yield* Effect.promise(() => pushes.stop())
            const label = `${abuse.route}, ${abuse.name}`
            for (const answer of answers) {
              if (refusedAsTooLarge(answer.status)) problems.push(`${label}: refused as too large (${answer.status}): not at the limit`)
              if (answer.ms >= BOUND_MS) problems.push(`${label}: answered ${answer.status} in ${answer.ms.toFixed(0)} ms`)
            }
            const worst = Math.max(0, ...times)
            if (worst >= BOUND_MS) problems.push(`${label}: another client's push took ${worst.toFixed(0)} ms`)
          }
          assert.deepStrictEqual(problems, [])
        }))
    }
  })
})

describe("the health routes' storage status", () => {
  /** Memory storage counting its table checks, failing them while `failing`. */
  const counting = () => {
    const state = { checks: 0, failing: false }
    const layer = Layer.effect(
      Storage,
      Effect.map(Storage, (inner) =>
        mapStorageOperations(inner, (name) => (operation) =>
          name === "checkTables"
            ? Effect.suspend(() => {
              state.checks++
              return state.failing ? Effect.fail(new StorageError({ operation: name, reason: new Unavailable(), cause: "down" })) as never : operation
            })
            : operation))
    )
    return { state, layer }
  }

  it.effect("is read once per TABLE_STATUS_TTL_MS for the whole process, its failure too, and asked at once it is read once", () => {
    const { state, layer: storage } = counting()
    return Effect.gen(function*() {
      const store = yield* Storage
      // Two nodes of one process (the all-in-one's endpoint and connection node) ask the same storage.
      const endpointNode = cachedTableStatus(store)
      const connectionNode = cachedTableStatus(store)
      yield* Effect.all(Array.from({ length: 50 }, (_, i) => (i % 2 === 0 ? endpointNode : connectionNode)), { concurrency: "unbounded" })
      assert.strictEqual(state.checks, 1)
      yield* TestClock.adjust(TABLE_STATUS_TTL_MS - 1)
      yield* connectionNode
      assert.strictEqual(state.checks, 1)
      yield* TestClock.adjust(1)
      state.failing = true
      assert.strictEqual((yield* Effect.exit(endpointNode))._tag, "Failure")
      assert.strictEqual((yield* Effect.exit(connectionNode))._tag, "Failure")
      assert.strictEqual(state.checks, 2, "a failure is reused as well")
      state.failing = false
      yield* TestClock.adjust(TABLE_STATUS_TTL_MS)
      assert.isAbove((yield* endpointNode).length, 0)
      assert.strictEqual(state.checks, 3)
      assert.strictEqual(cachedTableStatus(store, 0), store.checkTables, "0: read every time")
    }).pipe(Effect.provide(storage.pipe(Layer.provideMerge(layerMemory({ routerTable: "router", messageTablePrefix: "message", noTableRotation: false })))))
  })

  describe("over HTTP", () => {
    const { state, layer: storage } = counting()
    const Counted = EndpointServer.layerServer({ ...options, tableStatusTtlMs: undefined }).pipe(
      Layer.provideMerge(WebPushRouter.layer),
      Layer.provideMerge(FakeNodeClient),
      Layer.provideMerge(Layer.mergeAll(storage.pipe(Layer.provideMerge(TestStorage)), EndpointCrypto.layerTest, EventLog.layerMemory, Metrics.layerMemory))
    )
    layer(Counted, { excludeTestServices: true })((it) => {
      it.effect("a flood of /__heartbeat__ costs the store one table check per 5 s", () =>
        Effect.gen(function*() {
          const port = yield* boundPort
          const started = performance.now()
          const before = state.checks
          let ok = 0
          for (let round = 0; round < 6; round++) {
            const answers = yield* Effect.promise(() =>
              Promise.all(Array.from({ length: 50 }, () => send(port, round % 2 === 0 ? "HTTP/1.1" : "HTTP/2", { method: "GET", path: "/__heartbeat__", headers: {} }))))
            ok += answers.filter((answer) => answer.status === 200).length
          }
          assert.strictEqual(ok, 300)
          const allowed = 1 + Math.floor((performance.now() - started) / TABLE_STATUS_TTL_MS)
          assert.isAtMost(state.checks - before, allowed, `${state.checks - before} table checks for 300 requests`)
        }))
    })
  })
})
