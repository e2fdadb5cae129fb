/**
 * The endpoint's side of push receipts, over in-memory storage with injectable faults: the status
 * row of a push with a receipt is written before the message goes anywhere, so a storage failure
 * then is a 503 with nothing sent (the sender's retry is not a duplicate); a failure after the
 * message went leaves the answer 202; what the endpoint decided (stored, expired, deleted) is folded
 * from the events it records into the row before it answers.
 */
import { assert, describe, it, layer } from "@effect/vitest"
import { EventEmitter } from "node:events"
import * as http from "node:http"
import * as http2 from "node:http2"
import { Context, Deferred, Effect, Fiber, Layer } from "effect"
import { EndpointCrypto } from "../../src/crypto/endpoint.ts"
import type { ReceiptOptions } from "../../src/endpoint/options.ts"
import { makeCollector } from "../../src/endpoint/receiptCollector.ts"
import type { StatusDocument } from "../../src/endpoint/receiptStatus.ts"
import type { MessageStatus } from "../../src/domain/receipt.ts"
import { boundPort, EndpointServer } from "../../src/endpoint/server.ts"
import { METRICS } from "../../src/observability/catalog.ts"
import { EventLogMemory } from "../../src/observability/EventLog.ts"
import { Metrics } from "../../src/observability/Metrics.ts"
import { WebPushRouter } from "../../src/routers/webpush.ts"
import { Storage, type StorageService } from "../../src/storage/Storage.ts"
import {
  endpointWith,
  fakeNode,
  FakeNodeClient,
  messagesOf,
  nodeCalls,
  options,
  push,
  request,
  Shared,
  subscribe,
  TestEndpoint,
  withStorageFaults
} from "./harness.ts"

const headers = { ttl: 60, "content-encoding": "aes128gcm" }
const BODY = "x"

const receiptSubscription = Effect.map(request({ method: "POST", path: "/receipts" }), (reply) => {
  assert.strictEqual(reply.status, 201)
  return String(reply.headers["location"])
})

describe("push receipts at the endpoint", () => {
  layer(TestEndpoint, { excludeTestServices: true })((it) => {
    it.effect("the status row is written before the message goes: accepted, with its deadline", () =>
      Effect.gen(function*() {
        const node = yield* fakeNode(200)
        const sub = yield* subscribe({ nodeId: node })
        const receipts = yield* receiptSubscription
        const reply = yield* push(sub, { ...headers, "push-receipt": receipts }, BODY)
        assert.strictEqual(reply.status, 202)
        const messageId = String(reply.headers["location"]).split("/m/")[1] as string
        const ids = yield* (yield* EndpointCrypto).parseMessageId(messageId)
        const status = yield* (yield* Storage).getMessageStatus(ids.receipt as string, messageId)
        assert.isDefined(status?.acceptedAt)
        assert.strictEqual(status?.deadline, (Math.floor((status?.acceptedAt ?? 0) / 1000) + 60) * 1000)
      }))

    it.effect("storage failing as the row is written: 503, and nothing sent or stored", () =>
      Effect.gen(function*() {
        const node = yield* fakeNode(200)
        const sub = yield* subscribe({ nodeId: node })
        const receipts = yield* receiptSubscription
        const reply = yield* withStorageFaults(["openMessageStatus"], push(sub, { ...headers, "push-receipt": receipts }, BODY))
        assert.deepStrictEqual([reply.status, JSON.parse(reply.text).errno], [503, 201])
        assert.deepStrictEqual(yield* nodeCalls(sub.uaid), [])
        assert.deepStrictEqual(yield* messagesOf(sub), [])
      }))

    it.effect("what the endpoint decided is in the row when it answers: the fold of the events it records (stored, expired at once, deleted)", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        const receipts = yield* receiptSubscription
        const subscription = receipts.split("/receipts/")[1] as string
        const storage = yield* Storage
        const messageOf = (reply: { readonly headers: Readonly<Record<string, unknown>> }) => String(reply.headers["location"]).split("/m/")[1] as string
        const rowOf = (messageId: string) => storage.getMessageStatus(subscription, messageId)
        const stored = messageOf(yield* push(sub, { ...headers, "push-receipt": receipts }, BODY))
        assert.isDefined((yield* rowOf(stored))?.storedAt)
        assert.isUndefined((yield* rowOf(stored))?.outcome)
        const dropped = messageOf(yield* push(sub, { ...headers, ttl: 0, "push-receipt": receipts }, BODY))
        assert.strictEqual((yield* rowOf(dropped))?.outcome, "expired")
        assert.strictEqual((yield* request({ method: "DELETE", path: `/m/${stored}` })).status, 204)
        assert.strictEqual((yield* rowOf(stored))?.outcome, "deleted")
        const named = (yield* EventLogMemory).events.filter((e) => "version" in e.data && [stored, dropped].includes(e.data.version))
        assert.deepStrictEqual(
          named.filter((e) => e.type !== "notification.routed.1").map((e) => [e.type, (e.data as { readonly receipt?: string }).receipt]),
          [
            ["notification.accepted.1", subscription],
            ["notification.stored.1", subscription],
            ["notification.accepted.1", subscription],
            ["notification.expired.1", subscription],
            ["notification.receipt.1", subscription],
            ["notification.deleted.1", subscription],
            ["notification.receipt.1", subscription]
          ]
        )
      }))
  })
})

// ── held collectors: their caps, their longest hold, and a storage that never answers ─────────────

/** Storage calls counted by operation; the operations listed in `hang` never answer while listed. */
class StorageProbe extends Context.Service<StorageProbe, {
  readonly calls: Map<string, number>
  readonly hang: Set<string>
}>()("test/StorageProbe") {}

const probedStorage = Layer.effect(
  Storage,
  Effect.gen(function*() {
    const inner = yield* Storage
    const probe = yield* StorageProbe
    const wrapped: Record<string, unknown> = {}
    for (const [name, member] of Object.entries(inner)) {
      const counted = (run: () => Effect.Effect<unknown, unknown>) =>
        Effect.suspend(() => {
          probe.calls.set(name, (probe.calls.get(name) ?? 0) + 1)
          return probe.hang.has(name) ? Effect.never : run()
        })
      wrapped[name] = typeof member === "function"
        ? (...args: Array<unknown>) => counted(() => (member as (...a: Array<unknown>) => Effect.Effect<unknown, unknown>)(...args))
        : counted(() => member as Effect.Effect<unknown, unknown>)
    }
    return wrapped as unknown as StorageService
  })
)

/** Every receipt operation of storage: what a black-holed receipt table stops answering. */
const RECEIPT_OPERATIONS = ["createReceiptSubscription", "touchReceiptSubscription", "readReceiptSubscription", "openMessageStatus", "updateMessageStatus", "getMessageStatus", "deleteMessageStatuses"]

/** The test endpoint behind a listed proxy (so `X-Forwarded-For` names the client), with these receipt options. */
const collectorEndpoint = (receipts: ReceiptOptions) =>
  EndpointServer.layerServer({
    ...options,
    receipts,
    rateLimits: { perAddress: { perSecond: 100, burst: 1000 }, perVapidKey: { perSecond: 0, burst: 1 }, perSubscription: { perSecond: 0, burst: 1 }, trustedProxies: ["127.0.0.1"] }
  }).pipe(
    Layer.provideMerge(WebPushRouter.layer),
    Layer.provideMerge(FakeNodeClient),
    Layer.provideMerge(probedStorage),
    Layer.provideMerge(Layer.sync(StorageProbe, () => ({ calls: new Map<string, number>(), hang: new Set<string>() }))),
    Layer.provideMerge(Shared)
  )

interface Collector {
  readonly status: number
  readonly headers: http.IncomingHttpHeaders
  /** The whole body, once the answer ended (or the connection closed). */
  readonly body: Promise<string>
  readonly close: () => void
}

/** A `GET` of a receipt subscription from `address`, settled once its answer's head came. */
const openCollector = (port: number, path: string, address: string, headers: Readonly<Record<string, string>> = { accept: "text/event-stream" }) =>
  new Promise<Collector>((resolve, reject) => {
    const req = http.request({ host: "127.0.0.1", port, path, method: "GET", headers: { ...headers, "x-forwarded-for": address }, agent: false }, (res) => {
      let text = ""
      res.setEncoding("utf8")
      res.on("data", (chunk: string) => void (text += chunk))
      const body = new Promise<string>((done) => {
        res.on("end", () => done(text))
        res.on("close", () => done(text))
      })
      resolve({ status: res.statusCode ?? 0, headers: res.headers, body, close: () => req.destroy() })
    })
    req.on("error", reject)
    req.end()
  })

const receiptPath = Effect.map(request({ method: "POST", path: "/receipts" }), (reply) => new URL(String(reply.headers["location"])).pathname)

const settled = (check: () => boolean, ms: number) =>
  Effect.gen(function*() {
    const end = Date.now() + ms
    while (!check() && Date.now() < end) yield* Effect.sleep("20 millis")
    return check()
  })

const percentile = (values: ReadonlyArray<number>, p: number) => [...values].sort((a, b) => a - b)[Math.min(values.length - 1, Math.floor(values.length * p))] ?? 0

describe("held collectors of receipt subscriptions", () => {
  layer(collectorEndpoint({}), { excludeTestServices: true })((it) => {
    it.effect("300 collectors of one subscription from one address: 4 held, the rest 429/116 with Retry-After; storage read by the 4 only", () =>
      Effect.gen(function*() {
        const port = yield* boundPort
        const probe = yield* StorageProbe
        const metrics = yield* Metrics
        const path = yield* receiptPath
        probe.calls.clear()
        const all = yield* Effect.promise(() => Promise.all(Array.from({ length: 300 }, () => openCollector(port, path, "198.51.100.7"))))
        const held = all.filter((c) => c.status === 200)
        const refused = all.filter((c) => c.status !== 200)
        assert.strictEqual(held.length, 4)
        assert.deepStrictEqual([...new Set(refused.map((c) => c.status))], [429])
        const answer = JSON.parse(yield* Effect.promise(() => refused[0]!.body)) as { errno: number; message: string }
        assert.strictEqual(answer.errno, 116)
        assert.match(answer.message, /^Too many open receipt collectors for this receipt subscription, retry after \d+ s$/)
        const retryAfter = Number(refused[0]!.headers["retry-after"])
        assert.isTrue(retryAfter >= 1 && retryAfter <= 300, `Retry-After ${retryAfter}`)
        assert.strictEqual(metrics.value(METRICS.receiptCollectors.name), 4)
        assert.strictEqual(metrics.value(METRICS.receiptCollectorsRefused.name, { limit: "subscription" }), 296)
        // Storage: only the held ones read, once a second each.
        const readsAt = probe.calls.get("readReceiptSubscription") ?? 0
        yield* Effect.sleep("3 seconds")
        const reads = (probe.calls.get("readReceiptSubscription") ?? 0) - readsAt
        assert.isTrue(reads >= 8 && reads <= 16, `${reads} reads in 3 s by 4 collectors`)
        console.log(`collectors: 300 on one subscription from one address: 4 held, 296 refused 429; ${readsAt + reads} subscription reads in ~3 s (all storage calls: ${[...probe.calls.values()].reduce((a, b) => a + b, 0)})`)
        // The held ones leave: their places are free again.
        held.forEach((c) => c.close())
        assert.isTrue(yield* settled(() => metrics.value(METRICS.receiptCollectors.name) === 0, 2_000))
        const again = yield* Effect.promise(() => openCollector(port, path, "198.51.100.7"))
        assert.strictEqual(again.status, 200)
        again.close()
      }))

    it.effect("one address holds 32 collectors at most, over any subscriptions; another address is not affected", () =>
      Effect.gen(function*() {
        const port = yield* boundPort
        const metrics = yield* Metrics
        const paths = yield* Effect.forEach(Array.from({ length: 40 }), () => receiptPath)
        const all = yield* Effect.promise(() => Promise.all(paths.map((path) => openCollector(port, path, "203.0.113.40"))))
        assert.strictEqual(all.filter((c) => c.status === 200).length, 32)
        const refused = all.filter((c) => c.status !== 200)
        assert.deepStrictEqual(refused.map((c) => c.status), Array<number>(8).fill(429))
        assert.match((JSON.parse(yield* Effect.promise(() => refused[0]!.body)) as { message: string }).message, /for this address, retry after/)
        assert.isDefined(refused[0]!.headers["retry-after"])
        assert.strictEqual(metrics.value(METRICS.receiptCollectorsRefused.name, { limit: "address" }), 8)
        const other = yield* Effect.promise(() => openCollector(port, paths[39]!, "203.0.113.41"))
        assert.strictEqual(other.status, 200, "another address")
        for (const c of [...all, other]) c.close()
        assert.isTrue(yield* settled(() => metrics.value(METRICS.receiptCollectors.name) === 0, 2_000))
      }))
  })

  layer(collectorEndpoint({ maxHoldMs: 1_500, maxCollectors: 3 }), { excludeTestServices: true })((it) => {
    it.effect("the node's cap: 503/201 beyond it; at the longest hold a stream ends (no `gone`), a long poll answers [], an HTTP/2 GET 204", () =>
      Effect.gen(function*() {
        const port = yield* boundPort
        const metrics = yield* Metrics
        const path = yield* receiptPath
        const start = Date.now()
        const stream = yield* Effect.promise(() => openCollector(port, path, "198.51.100.1"))
        // A long poll's head comes with its answer: not awaited here.
        const polling = openCollector(port, path, "198.51.100.2", { accept: "application/json", prefer: "wait=10" })
        const h2 = http2.connect(`http://127.0.0.1:${port}`)
        const pushStatus = new Promise<number>((resolve, reject) => {
          const req = h2.request({ ":method": "GET", ":path": path, "x-forwarded-for": "198.51.100.3" })
          req.on("response", (headers) => resolve(Number(headers[":status"])))
          req.on("error", reject)
          req.end()
        })
        yield* Effect.sleep("200 millis")
        assert.strictEqual(metrics.value(METRICS.receiptCollectors.name), 3)
        const otherPath = yield* receiptPath
        const over = yield* Effect.promise(() => openCollector(port, otherPath, "198.51.100.4"))
        assert.strictEqual(over.status, 503)
        assert.strictEqual((JSON.parse(yield* Effect.promise(() => over.body)) as { errno: number }).errno, 201)
        assert.isDefined(over.headers["retry-after"])
        assert.strictEqual(metrics.value(METRICS.receiptCollectorsRefused.name, { limit: "node" }), 1)
        // The longest hold (1.5 s) is over: each ends as when the server stops.
        assert.strictEqual(stream.status, 200)
        const events = yield* Effect.promise(() => stream.body)
        const streamMs = Date.now() - start
        assert.notInclude(events, "event: gone")
        const poll = yield* Effect.promise(() => polling)
        assert.strictEqual(poll.status, 200)
        assert.deepStrictEqual(JSON.parse(yield* Effect.promise(() => poll.body)), { receipts: [] })
        assert.strictEqual(yield* Effect.promise(() => pushStatus), 204)
        h2.close()
        assert.isTrue(streamMs >= 1_400 && streamMs < 3_000, `the stream ended after ${streamMs} ms`)
        assert.isTrue(yield* settled(() => metrics.value(METRICS.receiptCollectors.name) === 0, 1_000))
        assert.strictEqual(metrics.value(METRICS.receiptCollectorsEnded.name, { reason: "max_hold" }), 2, "the two streams (a long poll just answers)")
      }))
  })

  layer(collectorEndpoint({ maxHoldMs: 1_000 }), { excludeTestServices: true })((it) => {
    it.effect("receipt storage never answers: 300 collectors hold 4 places, which end 503 after the hold and its grace; other senders' pushes stay fast; then idle", () =>
      Effect.gen(function*() {
        const port = yield* boundPort
        const probe = yield* StorageProbe
        const metrics = yield* Metrics
        const node = yield* fakeNode(200)
        const sub = yield* subscribe({ nodeId: node })
        const path = yield* receiptPath
        // Warmed up: the first push of a process is slow by itself.
        assert.strictEqual((yield* push(sub, { "x-forwarded-for": "203.0.113.9" })).status, 201)
        for (const operation of RECEIPT_OPERATIONS) probe.hang.add(operation)
        probe.calls.clear()
        const start = Date.now()
        const abuse = Promise.all(Array.from({ length: 300 }, () => openCollector(port, path, "198.51.100.66")))
        // A well-behaved sender pushes meanwhile (no receipt, another address).
        const latencies: Array<number> = []
        for (let i = 0; i < 50; i++) {
          const t0 = performance.now()
          const reply = yield* push(sub, { "x-forwarded-for": "203.0.113.9" })
          latencies.push(performance.now() - t0)
          assert.strictEqual(reply.status, 201)
          yield* Effect.sleep("40 millis")
        }
        assert.strictEqual(metrics.value(METRICS.receiptCollectors.name), 4)
        assert.strictEqual(probe.calls.get("readReceiptSubscription"), 4, "each held collector is stuck on its first read")
        const all = yield* Effect.promise(() => abuse)
        const endedMs = Date.now() - start
        assert.strictEqual(all.filter((c) => c.status === 429).length, 296)
        const stuck = all.filter((c) => c.status !== 429)
        assert.deepStrictEqual(stuck.map((c) => c.status), [503, 503, 503, 503])
        assert.strictEqual((JSON.parse(yield* Effect.promise(() => stuck[0]!.body)) as { errno: number }).errno, 201)
        assert.isTrue(endedMs < 1_000 + 5_000 + 1_500, `the stuck collectors ended after ${endedMs} ms`)
        assert.strictEqual(metrics.value(METRICS.receiptCollectorsEnded.name, { reason: "stalled" }), 4)
        // The abuser is gone: nothing held, nothing polling.
        assert.isTrue(yield* settled(() => metrics.value(METRICS.receiptCollectors.name) === 0, 1_000))
        const calls = [...probe.calls.values()].reduce((a, b) => a + b, 0)
        yield* Effect.sleep("2 seconds")
        assert.strictEqual([...probe.calls.values()].reduce((a, b) => a + b, 0), calls, "idle: no storage calls")
        probe.hang.clear()
        const p50 = percentile(latencies, 0.5)
        const max = Math.max(...latencies)
        assert.isBelow(percentile(latencies, 0.95), 1_000, `push latency p95 with 300 collectors on a black hole`)
        console.log(`black hole: 300 collectors → 4 held (ended 503 after ${endedMs} ms), 296 refused; pushes of another sender meanwhile: p50 ${p50.toFixed(1)} ms, max ${max.toFixed(1)} ms (first three: ${latencies.slice(0, 3).map((l) => l.toFixed(0)).join(", ")} ms)`)
      }))
  })
})

describe("receipt subscriptions one address makes", () => {
  /** `POST /receipts` from `address` (through the listed proxy): its answer's status. */
  const made = (address: string) =>
    Effect.map(request({ method: "POST", path: "/receipts", headers: { "x-forwarded-for": address } }), (reply) => reply.status)

  layer(collectorEndpoint({ subscriptionsPerAddress: 3, idleSeconds: 60 }), { excludeTestServices: true })((it) => {
    it.effect("3 at once, then 3 per idle time: the 4th is 429/116 with Retry-After (a third of the idle time), before storage; another address is not affected", () =>
      Effect.gen(function*() {
        const probe = yield* StorageProbe
        probe.calls.clear()
        const first = yield* Effect.forEach([1, 2, 3], () => made("198.51.100.20"))
        assert.deepStrictEqual(first, [201, 201, 201])
        const beyond = yield* request({ method: "POST", path: "/receipts", headers: { "x-forwarded-for": "198.51.100.20" } })
        assert.strictEqual(beyond.status, 429)
        assert.strictEqual(beyond.json().errno, 116)
        assert.match(beyond.json().message, /^Too many receipt subscriptions made from this address, retry after 20 s \(one subscription serves any number of pushes\)$/)
        assert.strictEqual(beyond.headers["retry-after"], "20")
        assert.strictEqual(probe.calls.get("createReceiptSubscription"), 3, "the refused one touched no storage")
        // The same /64 is the same address; another is not affected.
        assert.strictEqual(yield* made("2001:db8::1"), 201)
        assert.deepStrictEqual(yield* Effect.forEach([1, 2, 3], () => made("2001:db8::2")), [201, 201, 429])
        assert.strictEqual(yield* made("198.51.100.21"), 201)
      }))
  })

  layer(endpointWith(FakeNodeClient, { ...options, receipts: { subscriptionsPerAddress: 1 } }), { excludeTestServices: true })((it) => {
    it.effect("the loopback (this machine, not a listed proxy) is not counted", () =>
      Effect.gen(function*() {
        const replies = yield* Effect.forEach([1, 2, 3], () => request({ method: "POST", path: "/receipts" }))
        assert.deepStrictEqual(replies.map((r) => r.status), [201, 201, 201])
      }))
  })
})

describe("a JSON collection: receipts removed only once the answer went out", () => {
  /** A response whose connection closes mid-answer (`drops`), or takes the whole answer. */
  const response = (drops: boolean) => {
    const res = new EventEmitter() as EventEmitter & { writeHead: () => void; end: (body: string, done: () => void) => void }
    const written: Array<string> = []
    res.writeHead = () => {}
    res.end = (body, done) => {
      written.push(body)
      if (drops) res.emit("close")
      else {
        done()
        res.emit("close")
      }
    }
    return { res: res as unknown as http.ServerResponse, written }
  }
  const receipt: MessageStatus = { messageId: "m1", acceptedAt: 1, deadline: 2, outcome: "acknowledged", outcomeAt: 2, code: 100 }
  /** A collector over `read` and `handed`; its documents name the message alone. */
  const collector = (parts: Pick<Parameters<typeof makeCollector>[0], "read" | "handed">) =>
    makeCollector({
      ...parts,
      document: (status) => ({ message: status.messageId }) as unknown as StatusDocument,
      messagePath: "/m/",
      endedAtMaxHold: () => {}
    })

  for (const drops of [true, false]) {
    it.effect(drops ? "a client that drops mid-answer: kept for its next collection" : "a whole answer: removed after it", () =>
      Effect.gen(function*() {
        const handed: Array<string> = []
        const { held } = collector({
          read: () => Effect.succeed([receipt]),
          handed: (_id, receipts) => Effect.sync(() => void handed.push(...receipts.map((r) => r.messageId))),
        })
        const { res, written } = response(drops)
        yield* held("rs", "json", res, {}, 0)
        assert.strictEqual(written.length, 1)
        assert.deepStrictEqual(handed, drops ? [] : ["m1"])
      }))
  }

  it.effect("a sender that asks again while the removal is under way does not get them twice from this node", () =>
    Effect.gen(function*() {
      const removed = yield* Deferred.make<void>()
      let removals = 0
      const { held } = collector({
        // Storage still holds the receipt until the first removal is let through.
        read: () => Effect.map(Deferred.isDone(removed), (done) => (done ? [] : [receipt])),
        handed: () => (removals++ === 0 ? Deferred.await(removed) : Effect.void),
      })
      const first = response(false)
      const removing = yield* Effect.forkChild(held("rs", "json", first.res, {}, 0))
      yield* Effect.yieldNow
      assert.strictEqual(first.written.length, 1)
      assert.include(first.written[0], "m1")
      const again = response(false)
      yield* held("rs", "json", again.res, {}, 0)
      yield* Deferred.succeed(removed, undefined)
      yield* Fiber.join(removing)
      assert.deepStrictEqual(again.written.map((body) => JSON.parse(body)), [{ receipts: [] }])
      assert.strictEqual(removals, 1)
    }))

  it.effect("a read that began before the removal finished and ends after it does not hand them out again", () =>
    Effect.gen(function*() {
      const removed = yield* Deferred.make<void>()
      const readStarted = yield* Deferred.make<void>()
      const readLetGo = yield* Deferred.make<void>()
      let reads = 0
      const { held } = collector({
        // The second read sees storage as it was before the removal, and answers only after the removal ended.
        read: () =>
          Effect.gen(function*() {
            const snapshot = (yield* Deferred.isDone(removed)) ? [] : [receipt]
            if (reads++ === 1) {
              yield* Deferred.succeed(readStarted, undefined)
              yield* Deferred.await(readLetGo)
            }
            return snapshot
          }),
        handed: () => Deferred.await(removed),
      })
      const first = response(false)
      const removing = yield* Effect.forkChild(held("rs", "json", first.res, {}, 0))
      yield* Effect.yieldNow
      assert.strictEqual(first.written.length, 1)
      const again = response(false)
      const asking = yield* Effect.forkChild(held("rs", "json", again.res, {}, 0))
      yield* Deferred.await(readStarted)
      yield* Deferred.succeed(removed, undefined)
      yield* Fiber.join(removing)
      yield* Deferred.succeed(readLetGo, undefined)
      yield* Fiber.join(asking)
      assert.deepStrictEqual(again.written.map((body) => JSON.parse(body)), [{ receipts: [] }])
    }))
})
