/**
 * The connection node's receipt recorder under a storage that is slow or never answers: the writes
 * waiting stay bounded (what is beyond is dropped, counted, and logged a line at a time, not a line
 * per write), the writes of one subscription keep their order (a step never lands after the
 * outcome), a write that gets no answer gives its subscription's turn back after its timeout, and
 * once storage answers again everything waiting is written and the recorder is idle. Over real
 * (in-memory) storage: a step that comes after the receipt was collected does not make its row again.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer, Logger } from "effect"
import { domainEvent, type DomainEvent } from "../../src/domain/events.ts"
import type { StatusUpdate } from "../../src/domain/receipt.ts"
import { METRICS } from "../../src/observability/catalog.ts"
import { EventLog, EventLogMemory } from "../../src/observability/EventLog.ts"
import { Metrics } from "../../src/observability/Metrics.ts"
import { makeReceiptBook } from "../../src/receipts/book.ts"
import { receiptRecording } from "../../src/receipts/recorder.ts"
import { layerMemory } from "../../src/storage/memory/layer.ts"
import { createActiveTables, Storage, type StorageService } from "../../src/storage/Storage.ts"

interface Written {
  readonly subscription: string
  readonly messageId: string
  readonly update: StatusUpdate
}

/** A storage of status rows only: each write waits for `answer` (a promise per call) and is recorded once answered. */
const statusStorage = (answer: (subscription: string) => Promise<void> | undefined) => {
  const written: Array<Written> = []
  let calls = 0
  const storage = {
    updateMessageStatus: (subscription: string, messageId: string, update: StatusUpdate) =>
      Effect.suspend(() => {
        calls++
        const wait = answer(subscription)
        return wait === undefined ? Effect.void : Effect.promise(() => wait)
      }).pipe(Effect.map(() => {
        written.push({ subscription, messageId, update })
        return true
      }))
  } as unknown as StorageService
  return { storage, written, calls: () => calls }
}

const delivered = (subscription: string, version: string, time = Date.now()): DomainEvent =>
  domainEvent("notification.delivered.1", "u".repeat(32), time, { channelId: "c", version, source: "direct", receipt: subscription })
const acked = (subscription: string, version: string, time = Date.now()): DomainEvent =>
  domainEvent("notification.acked.1", "u".repeat(32), time, { version, code: 100, source: "direct", receipt: subscription })

const captured = () => {
  const lines: Array<string> = []
  const layer = Logger.layer([
    Logger.make(({ message }) => void lines.push((Array.isArray(message) ? message : [message]).map(String).join(" ")))
  ])
  return { lines, layer }
}

const recorder = (storage: StorageService, bounds: Parameters<typeof receiptRecording>[1], logs: Layer.Layer<never>) =>
  receiptRecording(86_400, bounds).pipe(
    Layer.provideMerge(Layer.mergeAll(EventLog.layerMemory, Metrics.layerMemory, Layer.succeed(Storage, storage))),
    Layer.provide(logs)
  )

const until = (check: () => boolean, ms: number) =>
  Effect.gen(function*() {
    const end = Date.now() + ms
    while (!check() && Date.now() < end) yield* Effect.sleep("20 millis")
    return check()
  })

describe("receipt recorder", () => {
  it.live("a storage that never answers: at most maxQueued writes wait, the rest dropped, counted and logged once; all written once it answers, then idle", () => {
    let release = () => {}
    let blackHole = true
    const gate = new Promise<void>((resolve) => (release = resolve))
    const store = statusStorage(() => (blackHole ? gate : undefined))
    const logs = captured()
    return Effect.gen(function*() {
      const events = yield* EventLog
      const metrics = yield* Metrics
      const queued = () => metrics.value(METRICS.receiptWritesQueued.name) ?? -1
      // 300 subscriptions, 50 messages each: 15,000 writes, while storage answers nothing.
      for (let m = 0; m < 50; m++) for (let s = 0; s < 300; s++) events.record(delivered(`sub-${s}`, `m-${s}-${m}`))
      yield* Effect.sleep("50 millis")
      assert.strictEqual(queued(), 1_000, "the waiting writes stop at maxQueued")
      assert.strictEqual(metrics.value(METRICS.receiptWritesDropped.name), 14_000)
      assert.strictEqual(store.calls(), 16, "16 subscriptions written at once, each write waiting")
      const dropLines = logs.lines.filter((line) => line.includes("receipt status writes dropped"))
      assert.strictEqual(dropLines.length, 1, "one log line for 14,000 drops")
      // The abuser is gone and storage answers again: what waited is written, nothing is left.
      blackHole = false
      release()
      assert.isTrue(yield* until(() => queued() === 0, 5_000), `${queued()} writes still waiting`)
      assert.strictEqual(store.written.length, 1_000)
      const calls = store.calls()
      yield* Effect.sleep("300 millis")
      assert.strictEqual(store.calls(), calls, "idle: no more storage calls")
      console.log(`recorder: 15,000 writes into a black hole: 1,000 queued, 14,000 dropped, ${dropLines.length} log line; drained in full once storage answered`)
    }).pipe(Effect.provide(recorder(store.storage, { maxQueued: 1_000 }, logs.layer)))
  })

  it.live("one subscription's writes land in order of arrival, though storage answers them in any order", () => {
    const store = statusStorage(() => new Promise((resolve) => setTimeout(resolve, Math.random() * 8)))
    return Effect.gen(function*() {
      const events = yield* EventLog
      const metrics = yield* Metrics
      const now = Date.now()
      for (let m = 0; m < 40; m++) {
        for (let s = 0; s < 4; s++) {
          events.record(delivered(`sub-${s}`, `m-${s}-${m}`, now))
          events.record(acked(`sub-${s}`, `m-${s}-${m}`, now + 1))
        }
      }
      assert.isTrue(yield* until(() => (metrics.value(METRICS.receiptWritesQueued.name) ?? 1) === 0, 10_000))
      assert.strictEqual(store.written.length, 320)
      for (let s = 0; s < 4; s++) {
        const order = store.written.filter((w) => w.subscription === `sub-${s}`).map((w) => `${w.messageId} ${w.update.outcome === undefined ? "delivered" : "acked"}`)
        const expected = Array.from({ length: 40 }, (_, m) => [`m-${s}-${m} delivered`, `m-${s}-${m} acked`]).flat()
        assert.deepStrictEqual(order, expected)
      }
    }).pipe(Effect.provide(recorder(store.storage, {}, Layer.empty)))
  })

  it.live("a write that gets no answer gives its subscription's turn back after its timeout; other subscriptions are not held up", () => {
    const store = statusStorage((subscription) => (subscription === "stuck" ? new Promise(() => {}) : undefined))
    const logs = captured()
    return Effect.gen(function*() {
      const events = yield* EventLog
      const metrics = yield* Metrics
      events.record(delivered("stuck", "a"))
      events.record(delivered("stuck", "b"))
      for (let i = 0; i < 20; i++) events.record(delivered("fine", `f-${i}`))
      yield* Effect.sleep("100 millis")
      assert.strictEqual(store.written.length, 20, "the other subscription is written meanwhile")
      assert.strictEqual(metrics.value(METRICS.receiptWritesQueued.name), 2)
      assert.isTrue(yield* until(() => metrics.value(METRICS.receiptWritesQueued.name) === 0, 2_000), "both stuck writes timed out in turn")
      assert.strictEqual(store.calls(), 22)
      assert.strictEqual(logs.lines.filter((line) => line.includes("no answer in time")).length, 2)
    }).pipe(Effect.provide(recorder(store.storage, { writeTimeoutMs: 300 }, logs.layer)))
  })

  it.live("a delivery recorded after the receipt was collected does not make the row again: the message is reported once", () =>
    Effect.gen(function*() {
      const storage = yield* Storage
      const events = yield* EventLog
      const metrics = yield* Metrics
      const idle = () => until(() => metrics.value(METRICS.receiptWritesQueued.name) === 0, 5_000)
      yield* createActiveTables
      const now = Date.now()
      yield* storage.createReceiptSubscription("rs", Math.floor(now / 1000) + 3600)
      // The endpoint opens the row as it accepts the message.
      assert.isTrue(yield* makeReceiptBook(storage, events, 86_400).open("u".repeat(32), "rs", "m1", { acceptedAt: now, deadline: now + 60_000 }))
      // This node records the ack; the receipt is collected (its row removed).
      events.record(acked("rs", "m1", now + 2))
      assert.isTrue(yield* idle())
      assert.strictEqual((yield* storage.getMessageStatus("rs", "m1"))?.outcome, "acknowledged")
      yield* storage.deleteMessageStatuses("rs", ["m1"])
      // The delivery, recorded late (another node, or a node whose write was retried), comes after.
      events.record(delivered("rs", "m1", now + 1))
      assert.isTrue(yield* idle())
      assert.isUndefined(yield* storage.getMessageStatus("rs", "m1"))
      assert.deepStrictEqual((yield* storage.readReceiptSubscription("rs"))?.statuses, [], "nothing left to report as expired or unsubscribed")
      const receipts = (yield* EventLogMemory).events.filter((event) => event.type === "notification.receipt.1")
      assert.deepStrictEqual(receipts.map((event) => event.data), [{ version: "m1", receipt: "rs", outcome: "acknowledged" }])
    }).pipe(Effect.provide(
      receiptRecording(86_400).pipe(
        Layer.provideMerge(Layer.mergeAll(
          EventLog.layerMemory,
          Metrics.layerMemory,
          layerMemory({ routerTable: "router", messageTablePrefix: "message", noTableRotation: false })
        ))
      )
    )))
})
