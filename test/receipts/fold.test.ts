/**
 * Receipt status rows as a fold of events: what each event of a message sent with a receipt writes
 * to its row (the endpoint's, a connection node's, a collector's), and, over in-memory storage, a
 * message stored under a new id (its row moves with it) and an outcome that loses the race to an
 * earlier one (`notification.receipt.1` once, for the outcome that won).
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { domainEvent, type DomainEvent, type DomainEventType, type EventData } from "../../src/domain/events.ts"
import { EventLog, EventLogMemory } from "../../src/observability/EventLog.ts"
import { makeReceiptBook } from "../../src/receipts/book.ts"
import { receiptChangeOf } from "../../src/receipts/fold.ts"
import { layerMemory } from "../../src/storage/memory/layer.ts"
import { createActiveTables, Storage } from "../../src/storage/Storage.ts"

const UAID = "u".repeat(32)
const AT = Date.UTC(2026, 0, 1, 12, 0, 0, 250)
const event = <T extends DomainEventType>(type: T, data: EventData<T>, time = AT) => domainEvent(type, UAID, time, data)

describe("receipt fold", () => {
  it("each event of a message with a receipt maps to its row's write; without a receipt, to none", () => {
    const receipt = "rs"
    const row = { uaid: UAID, subscription: receipt }
    const cases: ReadonlyArray<readonly [DomainEvent, unknown]> = [
      [event("notification.accepted.1", { channelId: "c", version: "m", ttl: 60, receipt }), { ...row, messageId: "m", kind: "open", change: { acceptedAt: AT, deadline: Date.UTC(2026, 0, 1, 12, 1, 0) } }],
      [event("notification.stored.1", { channelId: "c", version: "m", reason: "offline", receipt }), { ...row, messageId: "m", kind: "update", change: { storedAt: AT } }],
      [
        event("notification.stored.1", { channelId: "c", version: "m2", reason: "offline", acceptedAt: AT - 5, ttl: 60, receipt }),
        { ...row, messageId: "m2", kind: "open", change: { acceptedAt: AT - 5, deadline: Date.UTC(2026, 0, 1, 12, 1, 0), storedAt: AT } }
      ],
      [event("notification.moved.1", { channelId: "c", version: "m", receipt }), { ...row, messageId: "m", kind: "remove" }],
      [event("notification.delivered.1", { channelId: "c", version: "m", source: "direct", receipt }), { ...row, messageId: "m", kind: "update", change: { deliveredAt: AT } }],
      [event("notification.acked.1", { version: "m", code: 100, source: "direct", receipt }), { ...row, messageId: "m", kind: "update", change: { outcome: { outcome: "acknowledged", at: AT, code: 100 } } }],
      [event("notification.nacked.1", { version: "m", code: 302, receipt }), { ...row, messageId: "m", kind: "update", change: { outcome: { outcome: "rejected", at: AT, code: 302 } } }],
      [event("notification.expired.1", { version: "m", receipt }), { ...row, messageId: "m", kind: "update", change: { outcome: { outcome: "expired", at: AT } } }],
      [event("notification.bridged.1", { channelId: "c", version: "m", platform: "fcm", receipt }), { ...row, messageId: "m", kind: "update", change: { outcome: { outcome: "bridged", at: AT } } }],
      [event("notification.deleted.1", { version: "m", receipt }), { ...row, messageId: "m", kind: "update", change: { outcome: { outcome: "deleted", at: AT } } }],
      [event("notification.settled.1", { version: "m", receipt, outcome: "unsubscribed" }), { ...row, messageId: "m", kind: "update", change: { outcome: { outcome: "unsubscribed", at: AT } } }],
      [event("notification.acked.1", { version: "m", code: 100, source: "direct" }), undefined],
      [event("notification.routed.1", { channelId: "c", version: "m", outcome: "stored", durationMs: 1 }), undefined]
    ]
    for (const [e, expected] of cases) assert.deepStrictEqual(receiptChangeOf(e), expected, e.type)
  })

  it.effect("a message stored under a new id: its row opened under that id with the accept's times, the old one removed; a late outcome loses", () =>
    Effect.gen(function*() {
      yield* createActiveTables
      const storage = yield* Storage
      const book = makeReceiptBook(storage, yield* EventLog, 86_400)
      yield* storage.createReceiptSubscription("rs", Math.floor(AT / 1000) + 3600)
      const fold = (e: DomainEvent) => book.fold(e)
      assert.isTrue(yield* fold(event("notification.accepted.1", { channelId: "c", version: "a", ttl: 60, receipt: "rs" })))
      assert.isTrue(yield* fold(event("notification.stored.1", { channelId: "c", version: "b", reason: "offline", acceptedAt: AT, ttl: 60, receipt: "rs" }, AT + 3)))
      assert.isTrue(yield* fold(event("notification.moved.1", { channelId: "c", version: "a", receipt: "rs" }, AT + 3)))
      assert.isUndefined(yield* storage.getMessageStatus("rs", "a"))
      assert.deepInclude(yield* storage.getMessageStatus("rs", "b"), { acceptedAt: AT, deadline: Date.UTC(2026, 0, 1, 12, 1, 0), storedAt: AT + 3 })
      // The sender deletes it; a collector's expiry, folded later, does not change the outcome.
      assert.isTrue(yield* fold(event("notification.deleted.1", { version: "b", receipt: "rs" }, AT + 5)))
      assert.isFalse(yield* fold(event("notification.settled.1", { version: "b", receipt: "rs", outcome: "expired" }, AT + 70_000)))
      assert.strictEqual((yield* storage.getMessageStatus("rs", "b"))?.outcome, "deleted")
      const decided = (yield* EventLogMemory).events.filter((e) => e.type === "notification.receipt.1")
      assert.deepStrictEqual(decided.map((e) => e.data), [{ version: "b", receipt: "rs", outcome: "deleted" }])
    }).pipe(Effect.provide(Layer.mergeAll(
      EventLog.layerMemory,
      layerMemory({ routerTable: "router", messageTablePrefix: "message", noTableRotation: false })
    ))))
})
