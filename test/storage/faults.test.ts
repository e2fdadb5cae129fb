/**
 * The DynamoDB layer against a server that misbehaves: a proxy in front of dynalite answers some
 * requests itself with throttling errors or "nothing processed" batch results, closes the connection
 * under a request, or never answers — before the request reaches the store, or after it was applied
 * there (`applied`: DynamoDB's usual failure, a write written and its answer lost).
 */
import { mkdtempSync, rmSync } from "node:fs"
import { createServer, request, type IncomingMessage, type Server } from "node:http"
import type { AddressInfo } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Scope } from "effect"
import { afterAll, beforeAll } from "vitest"
import { layerDynamo } from "../../src/storage/dynamo/layer.ts"
import { startDynalite } from "../../src/storage/dynalite/embedded.ts"
import { createActiveTables, Storage } from "../../src/storage/Storage.ts"

/** `pass`: this request is forwarded as usual (a later one of the list is faulted). */
type Fault = "pass" | "throttle" | "unprocessed" | "hang" | "drop" | "slow" | "applied"

const dataDir = mkdtempSync(join(tmpdir(), "autopush-faults-"))
const scope = Effect.runSync(Scope.make())
let proxy: Server | undefined
let endpoint = ""
/** Faults to inject, per operation (`GetItem`, `BatchWriteItem`, ...), used up in order. */
const faults = new Map<string, Array<Fault>>()
const seen: Array<string> = []
/** Requests the proxy left unanswered that the client has since abandoned (their sockets closed). */
let abandoned = 0
/** How long a "slow" request waits before it is forwarded. */
let slowMs = 0

const body = (req: IncomingMessage) =>
  new Promise<Buffer>((resolve) => {
    const chunks: Array<Buffer> = []
    req.on("data", (c: Buffer) => chunks.push(c))
    req.on("end", () => resolve(Buffer.concat(chunks)))
  })

beforeAll(async () => {
  const upstream = new URL(await Effect.runPromise(Scope.provide(startDynalite(dataDir), scope)))
  proxy = createServer(async (req, res) => {
    const payload = await body(req)
    const operation = String(req.headers["x-amz-target"]).split(".")[1] ?? ""
    seen.push(operation)
    const fault = faults.get(operation)?.shift()
    if (fault === "hang") return void res.on("close", () => abandoned++)
    // A keep-alive connection the server closes under a request it has read.
    if (fault === "drop") return void req.socket.destroy()
    if (fault === "slow") await new Promise((r) => setTimeout(r, slowMs))
    const reply = (status: number, json: unknown) => {
      res.writeHead(status, { "content-type": "application/x-amz-json-1.0" })
      res.end(JSON.stringify(json))
    }
    if (fault === "throttle") {
      return reply(400, {
        __type: "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException",
        message: "slow down"
      })
    }
    if (fault === "unprocessed") {
      return reply(200, { UnprocessedItems: (JSON.parse(payload.toString()) as { RequestItems: unknown }).RequestItems })
    }
    const forward = request(
      { host: upstream.hostname, port: upstream.port, method: req.method, path: req.url, headers: req.headers },
      (up) => {
        // Applied upstream; the answer never comes back.
        if (fault === "applied") return void up.resume().on("end", () => res.on("close", () => abandoned++))
        res.writeHead(up.statusCode ?? 500, up.headers)
        up.pipe(res)
      }
    )
    forward.end(payload)
  })
  await new Promise<void>((resolve) => proxy?.listen(0, "127.0.0.1", resolve))
  endpoint = `http://127.0.0.1:${(proxy.address() as AddressInfo).port}`
})

afterAll(async () => {
  await new Promise((resolve) => proxy?.close(resolve))
  await Effect.runPromise(Scope.close(scope, Exit.void))
  rmSync(dataDir, { recursive: true, force: true })
})

let n = 0
const withStorage = <A, E>(effect: Effect.Effect<A, E, Storage>, timeoutMs?: number) => {
  const prefix = `f${Date.now().toString(36)}${n++}`
  return Effect.gen(function*() {
    yield* createActiveTables
    faults.clear()
    seen.length = 0
    return yield* effect
  }).pipe(
    Effect.provide(layerDynamo({
      routerTable: `${prefix}_router`,
      messageTablePrefix: `${prefix}_message`,
      noTableRotation: false,
      endpoint,
      region: "local",
      timeoutMs
    }))
  )
}

const count = (operation: string) => seen.filter((o) => o === operation).length

describe("DynamoDB layer under faults", () => {
  it.live("a save whose writes are applied and answered with a timeout, retried from the start: each message stored once", () =>
    withStorage(Effect.gen(function*() {
      const s = yield* Storage
      const table = yield* s.currentMessageTable
      const uaid = "00000000000000000000000000000001"
      const channelId = "eac8e1de-cddf-42d6-9919-a7b0e0f41e59"
      const at = Date.UTC(2034, 4, 15, 12)
      const messages = Array.from({ length: 6 }, (_, i) => ({
        channelId,
        version: `m${i}`,
        ttl: 3600,
        timestamp: Math.floor(at / 1000),
        sortkeyTimestamp: at + (i >> 1) // two messages (two ids) at each ms
      }))
      // The third write is applied, its answer lost: the operation times out, as a whole.
      faults.set("PutItem", ["pass", "pass", "applied"])
      const first = yield* Effect.flip(s.saveMessages(uaid, table, messages))
      assert.strictEqual(first.reason._tag, "Timeout")
      faults.set("PutItem", ["applied"])
      assert.strictEqual((yield* Effect.flip(s.saveMessages(uaid, table, messages))).reason._tag, "Timeout")
      const saved = yield* s.saveMessages(uaid, table, messages)
      const page = yield* s.fetchTimestampMessages(uaid, table, undefined, 100)
      assert.deepStrictEqual(page.messages.map((m) => m.version).sort(), messages.map((m) => m.version))
      assert.deepStrictEqual(saved.map((m) => m.version), messages.map((m) => m.version))
    }), 500))

  it.effect("throttled requests are retried a few times, then succeed", () =>
    withStorage(Effect.gen(function*() {
      const s = yield* Storage
      faults.set("GetItem", ["throttle", "throttle", "throttle"])
      assert.isUndefined(yield* s.getUser("00000000000000000000000000000001"))
      assert.strictEqual(count("GetItem"), 4)
    })))

  it.effect("persistent throttling becomes a StorageError after a bounded number of attempts", () =>
    withStorage(Effect.gen(function*() {
      const s = yield* Storage
      faults.set("GetItem", Array.from({ length: 20 }, () => "throttle" as const))
      const error = yield* Effect.flip(s.getUser("00000000000000000000000000000001"))
      assert.strictEqual(error.operation, "getUser")
      assert.strictEqual((error.cause as Error).name, "ProvisionedThroughputExceededException")
      assert.strictEqual(count("GetItem"), 5)
    })))

  it.live("a server that never answers: the operation fails at the deadline and its request is abandoned", () =>
    withStorage(Effect.gen(function*() {
      const s = yield* Storage
      faults.set("GetItem", ["hang"])
      abandoned = 0
      const started = Date.now()
      const error = yield* Effect.flip(s.getUser("00000000000000000000000000000001"))
      const took = Date.now() - started
      assert.strictEqual(error.operation, "getUser")
      assert.strictEqual(error.reason._tag, "Timeout")
      assert.isAtLeast(took, 300)
      assert.isBelow(took, 3_000)
      yield* Effect.promise(() => new Promise((r) => setTimeout(r, 100)))
      assert.strictEqual(abandoned, 1, "the hanging request was aborted")
      // The next call is answered as usual.
      assert.isUndefined(yield* s.getUser("00000000000000000000000000000001"))
    }), 300))

  it.effect("a connection closed under a request is retried on a new one", () =>
    withStorage(Effect.gen(function*() {
      const s = yield* Storage
      faults.set("GetItem", ["drop"])
      assert.isUndefined(yield* s.getUser("00000000000000000000000000000002"))
      assert.strictEqual(count("GetItem"), 2)
    })))

  it.effect("unprocessed batch items are resubmitted until written", () =>
    withStorage(Effect.gen(function*() {
      const s = yield* Storage
      const table = yield* s.currentMessageTable
      faults.set("BatchWriteItem", ["unprocessed", "unprocessed"])
      const channels = Array.from({ length: 30 }, (_, i) => `00000000-0000-4000-8000-${String(i).padStart(12, "0")}`)
      yield* s.addChannels("00000000000000000000000000000001", table, channels)
      assert.strictEqual(count("BatchWriteItem"), 4) // 2 chunks, the first one twice more
      assert.strictEqual((yield* s.getChannels("00000000000000000000000000000001", table)).size, 30)
    })))

  it.effect("a failed condition is an answer, not retried", () =>
    withStorage(Effect.gen(function*() {
      const s = yield* Storage
      const user = { uaid: "00000000000000000000000000000001", routerType: "webpush", routerData: {}, connectedAt: 5 }
      assert.isTrue(yield* s.registerUser(user))
      assert.isFalse(yield* s.registerUser({ ...user, connectedAt: 4 }))
      assert.strictEqual(count("PutItem"), 2)
    })))

  describe("storage_timeout is the deadline of one Storage operation, not of each of its requests", () => {
    const uaid = "00000000000000000000000000000009"
    const slowly = (operation: string) => faults.set(operation, Array.from({ length: 50 }, () => "slow" as const))
    const message = (n: number) => ({
      channelId: "00000000-0000-4000-8000-000000000001",
      version: `v${n}`,
      ttl: 600,
      timestamp: Math.floor(Date.now() / 1000),
      sortkeyTimestamp: Date.now() + n
    })

    it.live("saveMessages: four writes one after another, each answered just under the deadline, fail at about one deadline", () =>
      withStorage(Effect.gen(function*() {
        const s = yield* Storage
        const table = yield* s.currentMessageTable
        slowMs = 250
        slowly("PutItem")
        const started = Date.now()
        // Four messages of one channel and ms: written in turn (each taking the next ms free).
        const at = Date.now()
        const sameKey = [1, 2, 3, 4].map((n) => ({ ...message(n), sortkeyTimestamp: at }))
        const error = yield* Effect.flip(s.saveMessages(uaid, table, sameKey))
        const took = Date.now() - started
        assert.strictEqual(error.operation, "saveMessages")
        assert.strictEqual(error.reason._tag, "Timeout")
        assert.isAtLeast(took, 380)
        assert.isBelow(took, 700, `took ${took} ms`)
        assert.isAtMost(count("PutItem"), 2)
      }), 400))

    it.live("saveMessages: rows are written side by side, within one deadline that writing them one by one would outlive", () =>
      withStorage(Effect.gen(function*() {
        const s = yield* Storage
        const table = yield* s.currentMessageTable
        slowMs = 150
        slowly("PutItem")
        const channel = (c: number) => `00000000-0000-4000-8000-0000000000${String(c).padStart(2, "0")}`
        // Two channels, 12 rows each (one channel's rows at 12 ms apart, as a client's unacked ones):
        // one by one, 24 writes of 150 ms; side by side, two rounds.
        const messages = Array.from({ length: 24 }, (_, n) => ({ ...message(n), channelId: channel(n % 2) }))
        const saved = yield* s.saveMessages(uaid, table, messages)
        assert.deepStrictEqual(saved.map((m) => m.version), messages.map((m) => m.version), "in the order given")
        assert.strictEqual((yield* s.fetchTimestampMessages(uaid, table, undefined, 100)).messages.length, 24)
      }), 1_500))

    it.live("dropUser: the record, the query of its rows and their deletion together fail at about one deadline", () =>
      withStorage(Effect.gen(function*() {
        const s = yield* Storage
        const table = yield* s.currentMessageTable
        assert.isTrue(yield* s.registerUser({ uaid, routerType: "webpush", routerData: {}, connectedAt: 1, currentMonth: table }))
        yield* s.saveMessage(uaid, table, message(1))
        slowMs = 250
        for (const operation of ["DeleteItem", "Query", "BatchWriteItem"]) slowly(operation)
        const started = Date.now()
        const error = yield* Effect.flip(s.dropUser(uaid))
        const took = Date.now() - started
        assert.strictEqual(error.operation, "dropUser")
        assert.strictEqual(error.reason._tag, "Timeout")
        assert.isBelow(took, 700, `took ${took} ms`)
      }), 400))

    it.live("createTables (waiting for ACTIVE) is not cut by it: each request still has the deadline", () =>
      withStorage(Effect.gen(function*() {
        const s = yield* Storage
        slowMs = 250
        slowly("DescribeTable")
        slowly("CreateTable")
        const started = Date.now()
        yield* s.createTables([`f${Date.now().toString(36)}_extra`])
        assert.isAtLeast(Date.now() - started, 500, "several slow requests in a row")
        // One request that never answers still fails at the deadline.
        faults.set("DescribeTable", ["hang"])
        const error = yield* Effect.flip(s.createTables([`f${Date.now().toString(36)}_more`]))
        assert.strictEqual(error.reason._tag, "Timeout")
      }), 400))
  })
})
