/**
 * The one contract every Storage layer passes (in-memory, SQLite, PostgreSQL, dynalite, DynamoDB
 * Local). Each test gets a fresh layer on fresh table names, and a TestClock (which starts at 0:
 * tests that care about months set it first).
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Layer, Random } from "effect"
import { TestClock } from "effect/testing"
import type { Notification } from "../../src/domain/notification.ts"
import type { MessageStatus } from "../../src/domain/receipt.ts"
import { lastConnectValue, type UserRecord } from "../../src/domain/user.ts"
import { storedNotification } from "../../src/storage/model.ts"
import { messageKeyOf } from "../../src/domain/notification.ts"
import { createActiveTables, Storage, StorageError, type StorageService } from "../../src/storage/Storage.ts"
import type { StorageOptions } from "../../src/storage/tables.ts"

export type MakeStorage = (options: StorageOptions) => Layer.Layer<Storage, StorageError>

/**
 * 2034-05-15T12:00:00Z: mid-month, so two active tables; and years ahead of the real clock, since
 * DynamoDB Local (like DynamoDB) deletes rows whose TTL has passed in real time, in the background.
 */
const T0 = Date.UTC(2034, 4, 15, 12)
const T0_SECONDS = T0 / 1000
/** Message m1's status row once accepted, delivered and acked (in whatever order those were written). */
const ACKED_ROW: MessageStatus = {
  messageId: "m1",
  acceptedAt: T0,
  deadline: T0 + 60_000,
  deliveredAt: T0 + 5,
  outcome: "acknowledged",
  outcomeAt: T0 + 9,
  code: 100
}

let counter = 0
const freshOptions = (noTableRotation = false): StorageOptions => {
  const prefix = `t${Date.now().toString(36)}${process.pid.toString(36)}${(counter++).toString(36)}`
  return { routerTable: `${prefix}_router`, messageTablePrefix: `${prefix}_message`, noTableRotation }
}

const uaid = (n: number) => n.toString(16).padStart(32, "0")
const chid = (n: number) => `00000000-0000-4000-8000-${n.toString(16).padStart(12, "0")}`

const user = (n: number, fields: Partial<UserRecord> = {}): UserRecord => ({
  uaid: uaid(n),
  routerType: "webpush",
  routerData: {},
  connectedAt: T0,
  ...fields
})

const message = (fields: Partial<Notification> & { readonly channelId: string; readonly version: string }) =>
  ({ ttl: 3600, timestamp: T0_SECONDS, ...fields }) as Notification

export const storageContract = (name: string, make: MakeStorage) =>
  describe(`Storage contract: ${name}`, () => {
    const test = (
      title: string,
      body: (s: StorageService, options: StorageOptions) => Effect.Effect<void, unknown, Storage>,
      setup: { readonly noTableRotation?: boolean; readonly createTables?: boolean } = {}
    ) =>
      it.effect(title, () => {
        const options = freshOptions(setup.noTableRotation)
        return Effect.gen(function*() {
          yield* TestClock.setTime(T0)
          if (setup.createTables !== false) yield* createActiveTables
          yield* body(yield* Storage, options)
        }).pipe(Effect.provide(make(options)))
      })

    // ── tables ──────────────────────────────────────────────────────────────────────────────────

    test("table names follow the Clock: last, this and next month are active, and the month after on the last day", (s, o) =>
      Effect.gen(function*() {
        const p = o.messageTablePrefix
        assert.strictEqual(yield* s.currentMessageTable, `${p}_2034_05`)
        assert.deepStrictEqual(yield* s.activeMessageTables, [`${p}_2034_04`, `${p}_2034_05`, `${p}_2034_06`])
        yield* TestClock.setTime(Date.UTC(2034, 11, 31, 23, 59))
        assert.strictEqual(yield* s.currentMessageTable, `${p}_2034_12`)
        assert.deepStrictEqual(yield* s.activeMessageTables, [`${p}_2034_11`, `${p}_2034_12`, `${p}_2035_01`, `${p}_2035_02`])
      }), { createTables: false })

    test("create, check, list and drop tables", (s, o) =>
      Effect.gen(function*() {
        const before = yield* s.checkTables
        assert.deepStrictEqual(before.map((t) => t.table), [o.routerTable, `${o.routerTable}_receipts`, ...(yield* s.activeMessageTables)])
        assert.isTrue(before.every((t) => !t.ok))
        assert.deepStrictEqual(yield* s.listMessageTables, [])

        const missing = yield* Effect.flip(s.getChannels(uaid(1), yield* s.currentMessageTable))
        assert.strictEqual(missing.operation, "getChannels")
        assert.strictEqual(missing.reason._tag, "MissingTable")
        assert.isFalse(missing.isRetryable)
        assert.strictEqual((yield* Effect.flip(s.getUser(uaid(1)))).reason._tag, "MissingTable")

        yield* createActiveTables
        yield* createActiveTables // idempotent
        const march = `${o.messageTablePrefix}_2034_03`
        yield* s.createTables([march])
        const after = yield* s.checkTables
        assert.isTrue(after.every((t) => t.ok), JSON.stringify(after))
        assert.deepStrictEqual(yield* s.listMessageTables, [march, ...(yield* s.activeMessageTables)])

        yield* s.dropMessageTable(march)
        yield* s.dropMessageTable(march) // gone already: fine
        assert.deepStrictEqual(yield* s.listMessageTables, yield* s.activeMessageTables)
        const refused = yield* Effect.flip(s.dropMessageTable(o.routerTable))
        assert.strictEqual(refused.operation, "dropMessageTable")
        assert.isTrue((yield* s.checkTables)[0]?.ok)
      }), { createTables: false })

    test("no_table_rotation: one message table named exactly the prefix", (s, o) =>
      Effect.gen(function*() {
        const p = o.messageTablePrefix
        assert.strictEqual(yield* s.currentMessageTable, p)
        assert.deepStrictEqual(yield* s.activeMessageTables, [p])
        const later = Date.UTC(2031, 0, 31, 12)
        yield* TestClock.setTime(later)
        assert.strictEqual(yield* s.currentMessageTable, p)
        assert.deepStrictEqual(yield* s.activeMessageTables, [p])
        assert.deepStrictEqual(yield* s.listMessageTables, [p])
        assert.isTrue((yield* s.checkTables).every((t) => t.ok))
        yield* s.addChannel(uaid(1), p, chid(1))
        yield* s.saveMessage(uaid(1), p, message({ channelId: chid(1), version: "v1", timestamp: later / 1000 }))
        assert.deepStrictEqual([...(yield* s.getChannels(uaid(1), p))], [chid(1)])
        assert.strictEqual((yield* s.fetchTimestampMessages(uaid(1), p, undefined, 10)).messages.length, 1)
      }), { noTableRotation: true })

    // ── router table ────────────────────────────────────────────────────────────────────────────

    test("broadcasts: one shared set, put replaces a version, delete says whether there was one", (s) =>
      Effect.gen(function*() {
        assert.deepStrictEqual([...(yield* s.getBroadcasts)], [])
        yield* s.putBroadcast("remote-settings/monitor_changes", "v1")
        yield* s.putBroadcast("test/broadcast", "\"1700000000\"")
        yield* s.putBroadcast("remote-settings/monitor_changes", "v2")
        assert.deepStrictEqual([...(yield* s.getBroadcasts)].sort(), [["remote-settings/monitor_changes", "v2"], ["test/broadcast", "\"1700000000\""]])
        assert.isTrue(yield* s.deleteBroadcast("test/broadcast"))
        assert.isFalse(yield* s.deleteBroadcast("test/broadcast"))
        assert.deepStrictEqual([...(yield* s.getBroadcasts)], [["remote-settings/monitor_changes", "v2"]])
      }))

    test("register: a new record is written, an older or equal one is rejected, a newer one replaces", (s) =>
      Effect.gen(function*() {
        assert.isUndefined(yield* s.getUser(uaid(1)))
        const first = user(1, {
          nodeId: "http://node-a:8081",
          lastConnect: lastConnectValue(T0, 3),
          currentMonth: yield* s.currentMessageTable,
          recordVersion: 1,
          routerData: { token: "abc", nested: { n: 1, ok: true, list: ["x", 2, null] } }
        })
        assert.isTrue(yield* s.registerUser(first))
        assert.deepStrictEqual(yield* s.getUser(uaid(1)), first)

        assert.isFalse(yield* s.registerUser(user(1, { connectedAt: T0 - 1, nodeId: "old" })))
        assert.isFalse(yield* s.registerUser(user(1, { connectedAt: T0, nodeId: "same" })))
        assert.deepStrictEqual(yield* s.getUser(uaid(1)), first)

        const newer = user(1, { connectedAt: T0 + 1, routerType: "fcm", routerData: { token: "t2" } })
        assert.isTrue(yield* s.registerUser(newer))
        assert.deepStrictEqual(yield* s.getUser(uaid(1)), newer) // the whole record: nodeId etc. gone
      }))

    test("update: patches fields, removes those set to undefined, never creates a record", (s) =>
      Effect.gen(function*() {
        assert.isFalse(yield* s.updateUser(uaid(1), { nodeId: "x" }))
        assert.isFalse(yield* s.updateUser(uaid(1), {}))
        assert.isUndefined(yield* s.getUser(uaid(1)))

        yield* s.registerUser(user(1, { nodeId: "http://node-a:8081", recordVersion: 0 }))
        assert.isTrue(yield* s.updateUser(uaid(1), {
          nodeId: undefined,
          currentMonth: "m",
          recordVersion: 1,
          routerData: { a: [1, { b: "c" }] }
        }))
        assert.deepStrictEqual(
          yield* s.getUser(uaid(1)),
          user(1, { currentMonth: "m", recordVersion: 1, routerData: { a: [1, { b: "c" }] } })
        )
        assert.isTrue(yield* s.updateUser(uaid(1), {}))
      }))

    test("clearNodeId only when node and connectedAt both match", (s) =>
      Effect.gen(function*() {
        assert.isFalse(yield* s.clearNodeId(uaid(1), "http://node-a:8081", T0))
        yield* s.registerUser(user(1, { nodeId: "http://node-a:8081", currentMonth: "m" }))
        assert.isFalse(yield* s.clearNodeId(uaid(1), "http://node-b:8081", T0))
        assert.isFalse(yield* s.clearNodeId(uaid(1), "http://node-a:8081", T0 + 1))
        assert.strictEqual((yield* s.getUser(uaid(1)))?.nodeId, "http://node-a:8081")
        assert.isTrue(yield* s.clearNodeId(uaid(1), "http://node-a:8081", T0))
        assert.deepStrictEqual(yield* s.getUser(uaid(1)), user(1, { currentMonth: "m" }))
        assert.isFalse(yield* s.clearNodeId(uaid(1), "http://node-a:8081", T0))
      }))

    test("clearNodeIds clears each session's record where node and connectedAt both match, and counts them", (s) =>
      Effect.gen(function*() {
        const node = "http://node-a:8081"
        yield* s.registerUser(user(1, { nodeId: node }))
        yield* s.registerUser(user(2, { nodeId: node }))
        yield* s.registerUser(user(3, { nodeId: "http://node-b:8081" }))
        yield* s.registerUser(user(4, { nodeId: node, connectedAt: T0 + 5 }))
        const sessions = [1, 2, 3, 4, 5].map((n) => ({ uaid: uaid(n), connectedAt: T0 }))
        assert.strictEqual(yield* s.clearNodeIds(node, sessions), 2)
        assert.isUndefined((yield* s.getUser(uaid(1)))?.nodeId)
        assert.isUndefined((yield* s.getUser(uaid(2)))?.nodeId)
        assert.strictEqual((yield* s.getUser(uaid(3)))?.nodeId, "http://node-b:8081")
        assert.strictEqual((yield* s.getUser(uaid(4)))?.nodeId, node)
        assert.isUndefined(yield* s.getUser(uaid(5)))
        assert.strictEqual(yield* s.clearNodeIds(node, sessions), 0)
        assert.strictEqual(yield* s.clearNodeIds(node, []), 0)
        // More than one statement's worth on the SQL stores.
        const many = Array.from({ length: 1_200 }, (_, i) => ({ uaid: uaid(100 + i), connectedAt: T0 }))
        yield* Effect.forEach(many, (one) => s.registerUser({ ...user(1, { nodeId: node }), uaid: one.uaid }), { concurrency: 16, discard: true })
        assert.strictEqual(yield* s.clearNodeIds(node, many), 1_200)
        assert.isUndefined((yield* s.getUser(many[1_199]!.uaid))?.nodeId)
      }))

    test("dropUser removes the record and everything in its current table, nothing else", (s) =>
      Effect.gen(function*() {
        const table = yield* s.currentMessageTable
        for (const n of [1, 2]) {
          yield* s.registerUser(user(n, { currentMonth: table }))
          yield* s.addChannels(uaid(n), table, [chid(1), chid(2)])
          yield* s.saveMessages(uaid(n), table, [
            message({ channelId: chid(1), version: "a", topic: "t" }),
            ...Array.from({ length: 30 }, (_, i) => message({ channelId: chid(2), version: `v${i}`, sortkeyTimestamp: T0 + i }))
          ])
        }
        yield* s.dropUser(uaid(1))
        yield* s.dropUser(uaid(1)) // already gone: fine
        yield* s.dropUser(uaid(3)) // never existed: fine
        assert.isUndefined(yield* s.getUser(uaid(1)))
        assert.strictEqual((yield* s.getChannels(uaid(1), table)).size, 0)
        assert.deepStrictEqual(yield* s.fetchTopicMessages(uaid(1), table, 10), [])
        assert.deepStrictEqual(yield* s.fetchTimestampMessages(uaid(1), table, undefined, 10), {
          messages: [],
          lastSortKey: undefined,
          more: false
        })

        assert.isDefined(yield* s.getUser(uaid(2)))
        assert.strictEqual((yield* s.getChannels(uaid(2), table)).size, 2)
        assert.strictEqual((yield* s.fetchTimestampMessages(uaid(2), table, undefined, 50)).messages.length, 30)
      }))

    test("registerUser race: 64 concurrent writers, the newest connectedAt wins", (s) =>
      Effect.gen(function*() {
        const stamps = yield* Random.shuffle(Array.from({ length: 64 }, (_, i) => T0 + i * 7))
        const results = yield* Effect.forEach(
          stamps,
          (connectedAt) => s.registerUser(user(1, { connectedAt, nodeId: `node-${connectedAt}` })),
          { concurrency: "unbounded" }
        )
        const newest = Math.max(...stamps)
        assert.deepStrictEqual(yield* s.getUser(uaid(1)), user(1, { connectedAt: newest, nodeId: `node-${newest}` }))
        assert.isTrue(results[stamps.indexOf(newest)])
      }))

    // ── channels ────────────────────────────────────────────────────────────────────────────────

    test("channels: add, add many, list, remove (true only when present), per table", (s) =>
      Effect.gen(function*() {
        const [last, current] = yield* s.activeMessageTables as Effect.Effect<readonly [string, string]>
        assert.strictEqual((yield* s.getChannels(uaid(1), current)).size, 0)
        assert.isFalse(yield* s.removeChannel(uaid(1), current, chid(1)))

        yield* s.addChannel(uaid(1), current, chid(1))
        yield* s.addChannels(uaid(1), current, [chid(2), chid(3), chid(2), chid(1)])
        yield* s.addChannels(uaid(1), current, [])
        assert.deepStrictEqual([...(yield* s.getChannels(uaid(1), current))].sort(), [chid(1), chid(2), chid(3)])
        assert.strictEqual((yield* s.getChannels(uaid(1), last)).size, 0)
        assert.strictEqual((yield* s.getChannels(uaid(2), current)).size, 0)

        assert.isTrue(yield* s.removeChannel(uaid(1), current, chid(2)))
        assert.isFalse(yield* s.removeChannel(uaid(1), current, chid(2)))
        assert.isFalse(yield* s.removeChannel(uaid(1), last, chid(1)))
        assert.deepStrictEqual([...(yield* s.getChannels(uaid(1), current))].sort(), [chid(1), chid(3)])
        assert.isTrue(yield* s.removeChannel(uaid(1), current, chid(1)))
        assert.isTrue(yield* s.removeChannel(uaid(1), current, chid(3)))
        assert.strictEqual((yield* s.getChannels(uaid(1), current)).size, 0)
        yield* s.addChannel(uaid(1), current, chid(4))
        assert.deepStrictEqual([...(yield* s.getChannels(uaid(1), current))], [chid(4)])
      }))

    test("channels: a limit per user that costs the same at any size; re-adding is free; hasChannel", (s) =>
      Effect.gen(function*() {
        const table = yield* s.currentMessageTable
        for (let i = 1; i <= 3; i++) assert.isTrue(yield* s.addChannel(uaid(1), table, chid(i), 3))
        assert.isFalse(yield* s.addChannel(uaid(1), table, chid(4), 3), "a fourth channel over a limit of 3")
        assert.isFalse(yield* s.hasChannel(uaid(1), table, chid(4)), "a refused channel is not kept")
        assert.isTrue(yield* s.addChannel(uaid(1), table, chid(2), 3), "re-adding one that is there")
        assert.isTrue(yield* s.removeChannel(uaid(1), table, chid(1)))
        assert.isTrue(yield* s.addChannel(uaid(1), table, chid(4), 3), "room again after a remove")
        assert.deepStrictEqual([...(yield* s.getChannels(uaid(1), table))].sort(), [chid(2), chid(3), chid(4)])
        assert.deepStrictEqual(
          [yield* s.hasChannel(uaid(1), table, chid(3)), yield* s.hasChannel(uaid(1), table, chid(1)), yield* s.hasChannel(uaid(2), table, chid(3))],
          [true, false, false]
        )
        // A set copied in (a month move) counts too.
        yield* s.addChannels(uaid(2), table, [chid(1), chid(2)])
        assert.isFalse(yield* s.addChannel(uaid(2), table, chid(3), 2))
        assert.isTrue(yield* s.addChannel(uaid(2), table, chid(3)), "no limit given: no limit")
      }))

    test("resume: only an existing, older record is overwritten", (s) =>
      Effect.gen(function*() {
        const table = yield* s.currentMessageTable
        assert.isFalse(yield* s.resumeUser(user(1, { currentMonth: table })), "no record: nothing to resume")
        assert.isUndefined(yield* s.getUser(uaid(1)))
        yield* s.registerUser(user(1, { currentMonth: table, connectedAt: T0 }))
        assert.isTrue(yield* s.resumeUser(user(1, { currentMonth: table, connectedAt: T0 + 5, nodeId: "http://b:8081" })))
        assert.strictEqual((yield* s.getUser(uaid(1)))?.nodeId, "http://b:8081")
        assert.isFalse(yield* s.resumeUser(user(1, { currentMonth: table, connectedAt: T0 + 5 })), "equal is not newer")
      }))

    test("a resumed session after time has passed: clearNodeId and a conditional drop match the connected_at it wrote, not a later now", (s) =>
      Effect.gen(function*() {
        const table = yield* s.currentMessageTable
        const node = "http://a:8081"
        yield* s.registerUser(user(1, { currentMonth: table, connectedAt: T0, nodeId: node }))
        for (const [round, away] of [[1, 1_100], [2, 3_600_000]] as const) {
          yield* TestClock.adjust(away) // the client was away, then says hello with its uaid
          const wrote = T0 + (round === 1 ? 1_100 : 3_601_100)
          assert.isTrue(yield* s.resumeUser(user(1, { currentMonth: table, connectedAt: wrote, nodeId: node })), `round ${round}`)
          yield* TestClock.adjust(873) // the write took time; the session lives on
          assert.isFalse(yield* s.clearNodeId(uaid(1), node, wrote + 873), "a later reading of the clock is not the session's")
          assert.isTrue(yield* s.clearNodeId(uaid(1), node, wrote), `round ${round}: the session's own connected_at clears its node`)
          const after = yield* s.getUser(uaid(1))
          assert.isUndefined(after?.nodeId)
          assert.strictEqual(after?.connectedAt, wrote)
        }
        assert.isFalse(yield* s.dropUser(uaid(1), { ifConnectedAt: T0 + 3_601_100 + 873 }))
        assert.isTrue(yield* s.dropUser(uaid(1), { ifConnectedAt: T0 + 3_601_100 }))
      }))

    test("drop: the router record and the rows go; with ifConnectedAt only if nobody re-claimed the user", (s) =>
      Effect.gen(function*() {
        const table = yield* s.currentMessageTable
        yield* s.registerUser(user(1, { currentMonth: table, connectedAt: T0 }))
        yield* s.addChannel(uaid(1), table, chid(1))
        yield* s.saveMessage(uaid(1), table, message({ channelId: chid(1), version: "v1" }))
        assert.isFalse(yield* s.dropUser(uaid(1), { ifConnectedAt: T0 - 1 }), "re-claimed since")
        assert.isDefined(yield* s.getUser(uaid(1)))
        assert.isTrue(yield* s.hasChannel(uaid(1), table, chid(1)))
        assert.isTrue(yield* s.dropUser(uaid(1), { ifConnectedAt: T0 }))
        assert.isUndefined(yield* s.getUser(uaid(1)))
        assert.strictEqual((yield* s.getChannels(uaid(1), table)).size, 0)
        assert.strictEqual((yield* s.fetchTimestampMessages(uaid(1), table, undefined, 10)).messages.length, 0)
        assert.isFalse(yield* s.dropUser(uaid(1)), "nothing left to drop")
      }))

    test("moving a user to a new month: copy channels, point the record at the new table", (s, o) =>
      Effect.gen(function*() {
        const april = `${o.messageTablePrefix}_2034_04`
        yield* s.registerUser(user(1, { currentMonth: april }))
        yield* s.addChannels(uaid(1), april, [chid(1), chid(2)])
        yield* s.saveMessage(uaid(1), april, message({ channelId: chid(1), version: "old", sortkeyTimestamp: T0 - 1000 }))

        const may = yield* s.currentMessageTable
        assert.notStrictEqual(may, april)
        assert.include(yield* s.activeMessageTables, april)
        yield* s.addChannels(uaid(1), may, yield* s.getChannels(uaid(1), april))
        assert.isTrue(yield* s.updateUser(uaid(1), { currentMonth: may }))

        assert.strictEqual((yield* s.getUser(uaid(1)))?.currentMonth, may)
        assert.deepStrictEqual([...(yield* s.getChannels(uaid(1), may))].sort(), [chid(1), chid(2)])
        // the old table still serves what was stored there until it is drained
        assert.strictEqual((yield* s.fetchTimestampMessages(uaid(1), april, undefined, 10)).messages.length, 1)

        yield* s.dropUser(uaid(1)) // only the current month's rows go with the user
        assert.strictEqual((yield* s.getChannels(uaid(1), may)).size, 0)
        assert.strictEqual((yield* s.getChannels(uaid(1), april)).size, 2)
      }))

    // ── messages ────────────────────────────────────────────────────────────────────────────────

    test("topic messages: a new message replaces the channel's topic, read back as stored", (s) =>
      Effect.gen(function*() {
        const table = yield* s.currentMessageTable
        const first = message({ channelId: chid(1), version: "v1", topic: "weather", data: "AAEC", headers: { encoding: "aes128gcm" } })
        yield* s.saveMessage(uaid(1), table, first)
        assert.deepStrictEqual(yield* s.fetchTopicMessages(uaid(1), table, 10), [storedNotification(first)])

        const second = message({ channelId: chid(1), version: "v2", topic: "weather", sortkeyTimestamp: T0 })
        yield* s.saveMessage(uaid(1), table, second)
        const other = message({ channelId: chid(2), version: "v3", topic: "weather" })
        const otherTopic = message({ channelId: chid(1), version: "v4", topic: "news", ttl: 60 })
        yield* s.saveMessages(uaid(1), table, [other, otherTopic])
        yield* s.saveMessage(uaid(1), table, message({ channelId: chid(1), version: "v5", sortkeyTimestamp: T0 }))

        const topics = yield* s.fetchTopicMessages(uaid(1), table, 10)
        assert.deepStrictEqual(topics, [otherTopic, second, other].map(storedNotification)) // in sort-key order
        assert.strictEqual(topics[1]?.sortkeyTimestamp, T0, "a topic message keeps the ms it was accepted at")
        // An older message of a topic does not replace a newer one.
        assert.strictEqual(yield* s.saveMessage(uaid(1), table, message({ channelId: chid(1), version: "late", topic: "weather", sortkeyTimestamp: T0 - 5 })), "superseded")
        assert.strictEqual((yield* s.fetchTopicMessages(uaid(1), table, 2)).length, 2)
        assert.deepStrictEqual(yield* s.fetchTopicMessages(uaid(2), table, 10), [])

        // A newer message replaced it: kept, and the answer says it was not there.
        assert.isFalse(yield* s.deleteMessage(uaid(1), table, messageKeyOf(second), "v1"))
        assert.strictEqual((yield* s.fetchTopicMessages(uaid(1), table, 10)).length, 3)
        assert.isTrue(yield* s.deleteMessage(uaid(1), table, messageKeyOf(second), "v2"))
        assert.isFalse(yield* s.deleteMessage(uaid(1), table, messageKeyOf(second), "v2"), "gone already")
        assert.deepStrictEqual(yield* s.fetchTopicMessages(uaid(1), table, 10), [otherTopic, other].map(storedNotification))
      }))

    test("replaceTopicMessage: a newer message of a topic, delivered directly, makes the stored one of its topic a tombstone, and no other", (s) =>
      Effect.gen(function*() {
        const table = yield* s.currentMessageTable
        const stored = (topic: string, channel = 1) =>
          message({ channelId: chid(channel), version: `${channel}-${topic}`, topic, sortkeyTimestamp: T0 - 10 })
        // Topics sorting next to "b" (and "-", the alphabet's first character), and "b" of another channel.
        const neighbours = [stored("-"), stored("a"), stored("az"), stored("b-"), stored("b0"), stored("bz"), stored("c"), stored("b", 2)]
        yield* s.saveMessages(uaid(1), table, [...neighbours, stored("b")])
        const newer = message({ channelId: chid(1), version: "direct", topic: "b", sortkeyTimestamp: T0 })

        assert.isTrue(yield* s.replaceTopicMessage(uaid(1), table, newer))
        const left = yield* s.fetchTopicMessages(uaid(1), table, 20)
        assert.sameMembers(left.map((m) => m.version), neighbours.map((m) => m.version), "only topic b of channel 1 went")
        assert.isFalse(yield* s.replaceTopicMessage(uaid(1), table, newer), "a tombstone is not replaced again")
        // The old message's save, retried, does not bring it back; the newer one's save goes over it.
        assert.strictEqual(yield* s.saveMessage(uaid(1), table, stored("b")), "cancelled")
        assert.strictEqual(yield* s.saveMessage(uaid(1), table, newer), "stored")

        // An older message than the stored one, or one without topic, replaces nothing.
        assert.isFalse(yield* s.replaceTopicMessage(uaid(1), table, message({ channelId: chid(1), version: "older", topic: "c", sortkeyTimestamp: T0 - 20 })))
        assert.isFalse(yield* s.replaceTopicMessage(uaid(1), table, message({ channelId: chid(1), version: "no topic", sortkeyTimestamp: T0 })))
        assert.isFalse(yield* s.replaceTopicMessage(uaid(2), table, newer), "another user's")
        assert.strictEqual((yield* s.fetchTopicMessages(uaid(1), table, 20)).length, neighbours.length + 1)
        const [lone] = yield* s.fetchTopicMessages(uaid(1), table, 1)
        assert.isTrue(yield* s.replaceTopicMessage(uaid(1), table, { ...lone!, version: "newer -", sortkeyTimestamp: T0 }))
        assert.notInclude((yield* s.fetchTopicMessages(uaid(1), table, 20)).map((m) => m.version), lone!.version)
      }))

    test("a channel's stored messages are counted: its timestamp and topic rows, readable ones only, up to atMost, without the topic a new message replaces", (s) =>
      Effect.gen(function*() {
        const table = yield* s.currentMessageTable
        const ts = (n: number, channel = 1, fields: Partial<Notification> = {}) =>
          message({ channelId: chid(channel), version: `c${channel}-${n}`, sortkeyTimestamp: T0 + n, ...fields })
        yield* s.saveMessages(uaid(1), table, [ts(1), ts(2), ts(3, 2), ts(4, 1, { ttl: 5 }), ts(5, 1, { timestamp: T0_SECONDS - 3600 })])
        yield* s.saveMessage(uaid(1), table, message({ channelId: chid(1), version: "t-a", topic: "a" }))
        yield* s.saveMessage(uaid(1), table, message({ channelId: chid(2), version: "t-b", topic: "b" }))
        yield* s.saveMessage(uaid(2), table, ts(6))
        // Channel 1: c1-1, c1-2, c1-4 (its TTL still runs) and topic a; c1-5 expired; channel 2 and user 2 are others'.
        assert.strictEqual(yield* s.countChannelMessages(uaid(1), table, chid(1), 100), 4)
        assert.strictEqual(yield* s.countChannelMessages(uaid(1), table, chid(1), 2), 2, "counted up to atMost")
        assert.strictEqual(yield* s.countChannelMessages(uaid(1), table, chid(1), 100, "a"), 3, "the row a message of topic a replaces")
        assert.strictEqual(yield* s.countChannelMessages(uaid(1), table, chid(1), 100, "other"), 4)
        assert.strictEqual(yield* s.countChannelMessages(uaid(1), table, chid(2), 100), 2)
        assert.strictEqual(yield* s.countChannelMessages(uaid(3), table, chid(1), 100), 0)
        // Acked (a tombstone) and expired rows are not stored messages any more.
        yield* s.ackMessages(uaid(1), table, [{ key: messageKeyOf(ts(1)), version: "c1-1" }])
        yield* TestClock.adjust(6_000)
        assert.strictEqual(yield* s.countChannelMessages(uaid(1), table, chid(1), 100), 2)
      }))

    test("timestamp messages: ascending, paged by lastSortKey, deleted by sort key", (s) =>
      Effect.gen(function*() {
        const table = yield* s.currentMessageTable
        const stamps = [T0 + 30, T0 + 10, T0 + 50, T0 + 20, T0 + 40]
        const messages = stamps.map((ms, i) =>
          message({
            channelId: chid(i),
            version: `v${ms}`,
            sortkeyTimestamp: ms,
            data: `d${i}`,
            headers: { encoding: "aesgcm", encryption: "salt=x", crypto_key: "dh=y" },
            // the sender's Urgency is kept with the message
            ...(i === 0 ? { urgency: "high" as const } : {}),
            // and the receipt subscription it was sent with
            ...(i === 1 ? { receipt: "rs-1" } : {})
          })
        )
        yield* s.saveMessages(uaid(1), table, messages)
        // without sortkeyTimestamp the key is timestamp * 1000
        const plain = message({ channelId: chid(9), version: "plain", timestamp: T0_SECONDS + 1 })
        yield* s.saveMessage(uaid(1), table, plain)
        yield* s.saveMessage(uaid(1), table, message({ channelId: chid(8), version: "topic", topic: "t" }))

        const all = yield* s.fetchTimestampMessages(uaid(1), table, undefined, 10)
        const expected = [...messages.map(storedNotification)].sort((a, b) => a.sortkeyTimestamp! - b.sortkeyTimestamp!)
        assert.deepStrictEqual(all.messages, [...expected, storedNotification(plain)])
        assert.strictEqual(all.lastSortKey, T0 + 1000)
        assert.strictEqual(storedNotification(plain).sortkeyTimestamp, T0 + 1000)

        const seen: Array<string> = []
        let after: number | undefined
        for (let pages = 0; pages < 10; pages++) {
          const page = yield* s.fetchTimestampMessages(uaid(1), table, after, 2)
          seen.push(...page.messages.map((m) => m.version))
          if (page.lastSortKey === undefined) break
          assert.isAtMost(page.messages.length, 2)
          after = page.lastSortKey
        }
        assert.deepStrictEqual(seen, [...expected.map((m) => m.version), "plain"])

        const fromCursor = yield* s.fetchTimestampMessages(uaid(1), table, T0 + 20, 10)
        assert.deepStrictEqual(fromCursor.messages.map((m) => m.sortkeyTimestamp), [T0 + 30, T0 + 40, T0 + 50, T0 + 1000])

        yield* s.deleteMessage(uaid(1), table, messageKeyOf(messages[2]!))
        yield* s.deleteMessage(uaid(1), table, messageKeyOf(messages[2]!)) // missing: fine
        assert.isFalse(yield* s.deleteMessage(uaid(1), table, messageKeyOf(messages[0]!), "other")) // not that message: kept
        const left = yield* s.fetchTimestampMessages(uaid(1), table, undefined, 10)
        assert.deepStrictEqual(left.messages.map((m) => m.sortkeyTimestamp), [T0 + 10, T0 + 20, T0 + 30, T0 + 40, T0 + 1000])

        // Acked in batches: only the named rows (of this user), missing ones are fine.
        yield* s.saveMessage(uaid(2), table, messages[1]!)
        yield* s.ackMessages(uaid(1), table, [1, 2, 3].map((i) => ({ key: messageKeyOf(messages[i]!), version: messages[i]!.version })))
        const batched = yield* s.fetchTimestampMessages(uaid(1), table, undefined, 10)
        const named = new Set([1, 2, 3].map((i) => messages[i]!.version))
        assert.deepStrictEqual(batched.messages.map((m) => m.version), left.messages.map((m) => m.version).filter((v) => !named.has(v)))
        assert.isBelow(batched.messages.length, left.messages.length)
        assert.strictEqual((yield* s.fetchTimestampMessages(uaid(2), table, undefined, 10)).messages.length, 1)
      }))

    test("fetchMessages: from the first message on, topic messages then timestamp messages, one page", (s) =>
      Effect.gen(function*() {
        const table = yield* s.currentMessageTable
        assert.deepStrictEqual(yield* s.fetchMessages(uaid(1), table, 10), { messages: [], lastSortKey: undefined, more: false })
        // Channel rows and the meta row sort before the messages: never part of a page.
        yield* s.addChannel(uaid(1), table, chid(1))
        yield* s.addChannel(uaid(1), table, chid(2))
        const topicB = message({ channelId: chid(2), version: "topic-b", topic: "b" })
        const topicA = message({ channelId: chid(1), version: "topic-a", topic: "a", sortkeyTimestamp: T0 + 50 })
        const later = message({ channelId: chid(1), version: "later", sortkeyTimestamp: T0 + 20 })
        const expiring = message({ channelId: chid(2), version: "expiring", sortkeyTimestamp: T0 + 15, ttl: 60 })
        const earlier = message({ channelId: chid(2), version: "earlier", sortkeyTimestamp: T0 + 10 })
        yield* s.saveMessages(uaid(1), table, [later, topicB, expiring, earlier, topicA])
        yield* s.saveMessage(uaid(2), table, message({ channelId: chid(1), version: "other user", topic: "a" }))
        const versions = (page: { readonly messages: ReadonlyArray<Notification> }) => page.messages.map((m) => m.version)

        const all = yield* s.fetchMessages(uaid(1), table, 10)
        assert.deepStrictEqual(all.messages, [topicA, topicB, earlier, expiring, later].map(storedNotification))
        assert.deepStrictEqual([all.lastSortKey, all.more], [T0 + 20, false])
        // A page that ends among the topic rows has read no timestamp row.
        const topics = yield* s.fetchMessages(uaid(1), table, 2)
        assert.deepStrictEqual([versions(topics), topics.lastSortKey, topics.more], [["topic-a", "topic-b"], undefined, true])
        // Expired rows are neither returned nor counted: a page holds `limit` readable rows (`more`: it is full).
        yield* TestClock.setTime(T0 + 60_000)
        const first = yield* s.fetchMessages(uaid(1), table, 4)
        assert.deepStrictEqual([versions(first), first.lastSortKey, first.more], [["topic-a", "topic-b", "earlier", "later"], T0 + 20, true])
        const rest = yield* s.fetchTimestampMessages(uaid(1), table, first.lastSortKey, 4)
        assert.deepStrictEqual([versions(rest), rest.lastSortKey, rest.more], [[], undefined, false])
        const second = yield* s.fetchTimestampMessages(uaid(1), table, T0 + 10, 1)
        assert.deepStrictEqual([versions(second), second.lastSortKey, second.more], [["later"], T0 + 20, true])
      }))

    test("fetchMessages: expired topic rows filling a page do not hide a topic message after them", (s) =>
      Effect.gen(function*() {
        const table = yield* s.currentMessageTable
        // Topic rows sort by channel, then topic: three that expire first, the one that lives after them.
        const expiring = ["a", "b", "c"].map((topic) => message({ channelId: chid(1), version: `expiring-${topic}`, topic, ttl: 60 }))
        const living = message({ channelId: chid(2), version: "living", topic: "a", ttl: 3600 })
        yield* s.saveMessages(uaid(1), table, [...expiring, living])
        yield* TestClock.setTime(T0 + 60_000)
        const page = yield* s.fetchMessages(uaid(1), table, 2)
        assert.deepStrictEqual(page.messages.map((m) => m.version), ["living"])
        assert.isFalse(page.more)
      }))

    test("a page behind and among 1,500 expired rows holds the live ones, in order, and is full when more live ones follow, also past 1,100 more", (s) =>
      Effect.gen(function*() {
        const table = yield* s.currentMessageTable
        // 1,500 expiring rows first (more than a store reads in one step), then every 100th row of
        // the next 1,000 lives: 10 live rows among 990 expiring ones.
        const expiringFirst = Array.from({ length: 1_500 }, (_, i) => message({ channelId: chid(1), version: `e${i}`, sortkeyTimestamp: T0 + i, ttl: 60 }))
        const mixed = Array.from({ length: 1_000 }, (_, i) =>
          message({ channelId: chid(1), version: `m${i}`, sortkeyTimestamp: T0 + 1_500 + i, ttl: i % 100 === 99 ? 3600 : 60 }))
        // User 2 has the same rows and 1,100 live ones after them: more live rows than a store may
        // look up by their expiry.
        const liveAfter = Array.from({ length: 1_100 }, (_, i) => message({ channelId: chid(1), version: `l${i}`, sortkeyTimestamp: T0 + 2_500 + i }))
        for (let i = 0; i < 2_500; i += 500) yield* s.saveMessages(uaid(1), table, [...expiringFirst, ...mixed].slice(i, i + 500))
        for (let i = 0; i < 3_600; i += 500) yield* s.saveMessages(uaid(2), table, [...expiringFirst, ...mixed, ...liveAfter].slice(i, i + 500))
        yield* TestClock.setTime(T0 + 60_000)
        for (const [user, last] of [[1, []], [2, ["l0", "l1", "l2", "l3"]]] as const) {
          const first = yield* s.fetchTimestampMessages(uaid(user), table, undefined, 4)
          assert.deepStrictEqual([first.messages.map((m) => m.version), first.more], [["m99", "m199", "m299", "m399"], true])
          const rest = yield* s.fetchTimestampMessages(uaid(user), table, first.lastSortKey, 10)
          assert.deepStrictEqual([rest.messages.map((m) => m.version), rest.more], [["m499", "m599", "m699", "m799", "m899", "m999", ...last], user === 2])
          // From the first row on (a hello's read): a page of fewer than the live rows, and one of all of them.
          const hello = yield* s.fetchMessages(uaid(user), table, 4)
          assert.deepStrictEqual([hello.messages.map((m) => m.version), hello.lastSortKey], [["m99", "m199", "m299", "m399"], T0 + 1_899])
          const whole = yield* s.fetchMessages(uaid(user), table, 10)
          assert.deepStrictEqual(whole.messages.map((m) => m.version), [...first.messages, ...rest.messages].slice(0, 10).map((m) => m.version))
        }
      }))

    test("saveMessages: more than one batch, the last message for a key wins", (s) =>
      Effect.gen(function*() {
        const table = yield* s.currentMessageTable
        const batch = Array.from({ length: 40 }, (_, i) =>
          i % 10 === 9
            ? message({ channelId: chid(1), version: `topic-${i}`, topic: "same" })
            : message({ channelId: chid(2), version: `ts-${i}`, sortkeyTimestamp: T0 + i }))
        yield* s.saveMessages(uaid(1), table, batch)
        yield* s.saveMessages(uaid(1), table, [])
        assert.deepStrictEqual((yield* s.fetchTopicMessages(uaid(1), table, 10)).map((m) => m.version), ["topic-39"])
        assert.strictEqual((yield* s.fetchTimestampMessages(uaid(1), table, undefined, 100)).messages.length, 36)
      }))

    test("a timestamp message never overwrites another: saveMessage says so, saveMessages moves it to the next free ms", (s) =>
      Effect.gen(function*() {
        const table = yield* s.currentMessageTable
        const first = message({ channelId: chid(1), version: "first", sortkeyTimestamp: T0 })
        assert.strictEqual(yield* s.saveMessage(uaid(1), table, first), "stored")
        assert.strictEqual(yield* s.saveMessage(uaid(1), table, message({ channelId: chid(1), version: "same-ms", sortkeyTimestamp: T0 })), "taken")
        assert.strictEqual(yield* s.saveMessage(uaid(1), table, message({ channelId: chid(2), version: "other-channel", sortkeyTimestamp: T0 })), "stored")
        const saved = yield* s.saveMessages(uaid(1), table, [
          message({ channelId: chid(1), version: "unacked-a", sortkeyTimestamp: T0 }),
          message({ channelId: chid(1), version: "unacked-b", sortkeyTimestamp: T0 })
        ])
        assert.deepStrictEqual(saved.map((m) => [m.version, m.sortkeyTimestamp]), [["unacked-a", T0 + 1], ["unacked-b", T0 + 2]])
        const page = yield* s.fetchTimestampMessages(uaid(1), table, undefined, 10)
        assert.deepStrictEqual(page.messages.map((m) => m.version), ["first", "other-channel", "unacked-a", "unacked-b"])
        // Topic messages still replace an older one; at a disconnect, one a newer message superseded is left out.
        assert.strictEqual(yield* s.saveMessage(uaid(1), table, message({ channelId: chid(1), version: "t1", topic: "t", sortkeyTimestamp: T0 })), "stored")
        assert.strictEqual(yield* s.saveMessage(uaid(1), table, message({ channelId: chid(1), version: "t2", topic: "t", sortkeyTimestamp: T0 + 1 })), "stored")
        assert.deepStrictEqual(yield* s.saveMessages(uaid(1), table, [message({ channelId: chid(1), version: "t0", topic: "t", sortkeyTimestamp: T0 - 1 })]), [])
        assert.deepStrictEqual((yield* s.fetchTopicMessages(uaid(1), table, 10)).map((m) => m.version), ["t2"])
      }))

    test("saveManyMessages saves each user's messages as saveMessages would, and answers save by save", (s) =>
      Effect.gen(function*() {
        const table = yield* s.currentMessageTable
        assert.strictEqual(yield* s.saveMessage(uaid(1), table, message({ channelId: chid(1), version: "there", sortkeyTimestamp: T0 })), "stored")
        assert.strictEqual(yield* s.saveMessage(uaid(2), table, message({ channelId: chid(1), version: "newer", topic: "t", sortkeyTimestamp: T0 + 1 })), "stored")
        const saved = yield* s.saveManyMessages([
          { uaid: uaid(1), table, messages: [message({ channelId: chid(1), version: "same-ms", sortkeyTimestamp: T0 })] },
          { uaid: uaid(2), table, messages: [message({ channelId: chid(1), version: "older", topic: "t", sortkeyTimestamp: T0 })] },
          { uaid: uaid(3), table, messages: [] },
          { uaid: uaid(3), table, messages: [message({ channelId: chid(2), version: "a", sortkeyTimestamp: T0 }), message({ channelId: chid(2), version: "b", sortkeyTimestamp: T0 + 5 })] }
        ])
        assert.deepStrictEqual(saved.map((one) => one.map((m) => [m.version, m.sortkeyTimestamp])), [[["same-ms", T0 + 1]], [], [], [["a", T0], ["b", T0 + 5]]])
        assert.deepStrictEqual((yield* s.fetchTimestampMessages(uaid(1), table, undefined, 10)).messages.map((m) => m.version), ["there", "same-ms"])
        assert.deepStrictEqual((yield* s.fetchTopicMessages(uaid(2), table, 10)).map((m) => m.version), ["newer"])
        assert.deepStrictEqual((yield* s.fetchTimestampMessages(uaid(3), table, undefined, 10)).messages.map((m) => m.version), ["a", "b"])
        assert.deepStrictEqual(yield* s.saveManyMessages([]), [])
      }))

    test("saving a message again writes over its own row: a save retried from the start stores each message once", (s) =>
      Effect.gen(function*() {
        const table = yield* s.currentMessageTable
        const other = message({ channelId: chid(1), version: "other-id-same-ms", sortkeyTimestamp: T0 })
        assert.strictEqual(yield* s.saveMessage(uaid(1), table, other), "stored")
        const unacked = [
          message({ channelId: chid(1), version: "a", sortkeyTimestamp: T0 }),
          message({ channelId: chid(1), version: "b", sortkeyTimestamp: T0 + 5 }),
          message({ channelId: chid(2), version: "c", topic: "t", sortkeyTimestamp: T0 })
        ]
        const first = yield* s.saveMessages(uaid(1), table, unacked)
        for (let retry = 0; retry < 3; retry++) assert.deepStrictEqual(yield* s.saveMessages(uaid(1), table, unacked), first)
        assert.deepStrictEqual(first.map((m) => [m.version, m.sortkeyTimestamp]), [["a", T0 + 1], ["b", T0 + 5], ["c", T0]])
        assert.strictEqual(yield* s.saveMessage(uaid(1), table, unacked[1]!), "stored", "its own row is no other message's key")
        const page = yield* s.fetchMessages(uaid(1), table, 10)
        assert.deepStrictEqual(page.messages.map((m) => m.version), ["c", "other-id-same-ms", "a", "b"])
      }))

    test("a delete by version removes that message or nothing", (s) =>
      Effect.gen(function*() {
        const table = yield* s.currentMessageTable
        const stored = message({ channelId: chid(1), version: "stored", sortkeyTimestamp: T0 })
        yield* s.saveMessage(uaid(1), table, stored)
        assert.isFalse(yield* s.deleteMessage(uaid(1), table, messageKeyOf(stored), "another-id-of-this-key"))
        assert.isFalse(yield* s.deleteMessage(uaid(1), table, { kind: "timestamp", channelId: chid(1), sortkeyTimestamp: T0 + 1 }, "stored"))
        assert.deepStrictEqual((yield* s.fetchMessages(uaid(1), table, 10)).messages.map((m) => m.version), ["stored"])
        assert.isTrue(yield* s.deleteMessage(uaid(1), table, messageKeyOf(stored), "stored"))
        assert.isFalse(yield* s.deleteMessage(uaid(1), table, messageKeyOf(stored), "stored"))
        assert.deepStrictEqual((yield* s.fetchMessages(uaid(1), table, 10)).messages, [])
      }))

    test("a cancel leaves a tombstone of that message only: once, and never over another message", (s) =>
      Effect.gen(function*() {
        const table = yield* s.currentMessageTable
        const stored = message({ channelId: chid(1), version: "stored", sortkeyTimestamp: T0, data: "AAEC", headers: { encoding: "aes128gcm" } })
        yield* s.saveMessage(uaid(1), table, stored)
        assert.isFalse(yield* s.cancelMessage(uaid(1), table, messageKeyOf(stored), "another-id-of-this-key"))
        assert.isFalse(yield* s.cancelMessage(uaid(1), table, { kind: "timestamp", channelId: chid(1), sortkeyTimestamp: T0 + 1 }, "stored"))
        assert.deepStrictEqual((yield* s.fetchMessages(uaid(1), table, 10)).messages.map((m) => m.version), ["stored"])
        assert.isTrue(yield* s.cancelMessage(uaid(1), table, messageKeyOf(stored), "stored"))
        assert.isFalse(yield* s.cancelMessage(uaid(1), table, messageKeyOf(stored), "stored"), "a tombstone is not cancelled twice")
        // Nobody takes a cancelled message (a month move, an ack by version); an unconditional delete removes its tombstone.
        assert.isFalse(yield* s.deleteMessage(uaid(1), table, messageKeyOf(stored), "stored"))
        assert.isTrue(yield* s.deleteMessage(uaid(1), table, messageKeyOf(stored)))
        assert.strictEqual(yield* s.saveMessage(uaid(1), table, stored), "stored", "the tombstone is gone: the key is free")
      }))

    test("a save retried after its message was cancelled does not bring it back", (s) =>
      Effect.gen(function*() {
        const table = yield* s.currentMessageTable
        const other = message({ channelId: chid(1), version: "other-id-same-ms", sortkeyTimestamp: T0 })
        yield* s.saveMessage(uaid(1), table, other)
        const unacked = [
          message({ channelId: chid(1), version: "a", sortkeyTimestamp: T0 }),
          message({ channelId: chid(1), version: "b", sortkeyTimestamp: T0 + 5 }),
          message({ channelId: chid(2), version: "c", topic: "t", sortkeyTimestamp: T0 })
        ]
        // The first save was applied (its answer may have been lost): "a" went to the next ms.
        const first = yield* s.saveMessages(uaid(1), table, unacked)
        assert.deepStrictEqual(first.map((m) => [m.version, m.sortkeyTimestamp]), [["a", T0 + 1], ["b", T0 + 5], ["c", T0]])
        for (const cancelled of first) assert.isTrue(yield* s.cancelMessage(uaid(1), table, messageKeyOf(cancelled), cancelled.version))
        // The retry finds each tombstone, "a"'s at the ms it moved to, and writes nothing, anywhere.
        for (let retry = 0; retry < 2; retry++) assert.deepStrictEqual(yield* s.saveMessages(uaid(1), table, unacked), [])
        for (const m of unacked) {
          assert.strictEqual(yield* s.saveMessage(uaid(1), table, m), m.version === "a" ? "taken" : "cancelled")
        }
        assert.strictEqual(yield* s.saveMessage(uaid(1), table, first[0]!), "cancelled")
        assert.deepStrictEqual((yield* s.fetchMessages(uaid(1), table, 10)).messages.map((m) => m.version), ["other-id-same-ms"])
        // A newer message of the topic replaces its tombstone as it would the message; an older one does not.
        const older = message({ channelId: chid(2), version: "older", topic: "t", sortkeyTimestamp: T0 - 1 })
        assert.strictEqual(yield* s.saveMessage(uaid(1), table, older), "superseded")
        const newer = message({ channelId: chid(2), version: "newer", topic: "t", sortkeyTimestamp: T0 + 1, data: "AAEC" })
        assert.strictEqual(yield* s.saveMessage(uaid(1), table, newer), "stored")
        assert.deepStrictEqual(yield* s.fetchTopicMessages(uaid(1), table, 10), [storedNotification(newer)])
      }))

    test("a save retried after its message was acked does not bring it back", (s) =>
      Effect.gen(function*() {
        const table = yield* s.currentMessageTable
        const unacked = [
          message({ channelId: chid(1), version: "a", sortkeyTimestamp: T0 }),
          message({ channelId: chid(2), version: "t-old", topic: "t", sortkeyTimestamp: T0 }),
          message({ channelId: chid(3), version: "u", topic: "u", sortkeyTimestamp: T0 })
        ]
        // The first save was applied (its answer lost); another session read the rows and acked them.
        const first = yield* s.saveMessages(uaid(1), table, unacked)
        assert.strictEqual(first.length, 3)
        // Meanwhile a newer message replaced topic "t": its ack by the old version leaves it in place.
        const replacing = message({ channelId: chid(2), version: "t-new", topic: "t", sortkeyTimestamp: T0 + 1 })
        assert.strictEqual(yield* s.saveMessage(uaid(1), table, replacing), "stored")
        yield* s.ackMessages(uaid(1), table, first.map((m) => ({ key: messageKeyOf(m), version: m.version })))
        assert.deepStrictEqual((yield* s.fetchMessages(uaid(1), table, 10)).messages.map((m) => m.version), ["t-new"])
        // The retry finds the tombstones and writes nothing; acking again is harmless.
        for (let retry = 0; retry < 2; retry++) assert.deepStrictEqual(yield* s.saveMessages(uaid(1), table, unacked), [])
        assert.strictEqual(yield* s.saveMessage(uaid(1), table, unacked[0]!), "cancelled")
        yield* s.ackMessages(uaid(1), table, first.map((m) => ({ key: messageKeyOf(m), version: m.version })))
        assert.deepStrictEqual((yield* s.fetchMessages(uaid(1), table, 10)).messages.map((m) => m.version), ["t-new"])
        // An acked message's tombstone goes with it: a cancel or a delete by version finds nothing to take.
        assert.isFalse(yield* s.cancelMessage(uaid(1), table, messageKeyOf(first[0]!), "a"))
        assert.isFalse(yield* s.deleteMessage(uaid(1), table, messageKeyOf(first[0]!), "a"))
      }))

    test("reads leave tombstones out", (s) =>
      Effect.gen(function*() {
        const table = yield* s.currentMessageTable
        const messages = [
          message({ channelId: chid(1), version: "topic-cancelled", topic: "a" }),
          message({ channelId: chid(1), version: "topic-kept", topic: "b" }),
          message({ channelId: chid(1), version: "ts-cancelled-1", sortkeyTimestamp: T0 + 1 }),
          message({ channelId: chid(1), version: "ts-cancelled-2", sortkeyTimestamp: T0 + 2 }),
          message({ channelId: chid(1), version: "ts-kept", sortkeyTimestamp: T0 + 3 })
        ]
        yield* s.saveMessages(uaid(1), table, messages)
        for (const m of messages) {
          if (m.version.includes("cancelled")) assert.isTrue(yield* s.cancelMessage(uaid(1), table, messageKeyOf(m), m.version))
        }
        const versions = (ms: ReadonlyArray<Notification>) => ms.map((m) => m.version)
        assert.deepStrictEqual(versions(yield* s.fetchTopicMessages(uaid(1), table, 10)), ["topic-kept"])
        assert.deepStrictEqual(versions(yield* s.fetchTopicMessages(uaid(1), table, 1)), ["topic-kept"], "the limit counts messages, not tombstones")
        assert.deepStrictEqual(versions((yield* s.fetchMessages(uaid(1), table, 10)).messages), ["topic-kept", "ts-kept"])
        assert.deepStrictEqual(versions((yield* s.fetchTimestampMessages(uaid(1), table, undefined, 10)).messages), ["ts-kept"])
        // A page counts messages, not tombstones (as it counts no expired rows).
        assert.deepStrictEqual(yield* s.fetchTimestampMessages(uaid(1), table, undefined, 1), { messages: [storedNotification(messages[4]!)], lastSortKey: T0 + 3, more: true })
      }))

    test("a tombstone expires with its message", (s) =>
      Effect.gen(function*() {
        const table = yield* s.currentMessageTable
        const short = message({ channelId: chid(1), version: "short", sortkeyTimestamp: T0, ttl: 60 })
        yield* s.saveMessage(uaid(1), table, short)
        assert.isTrue(yield* s.cancelMessage(uaid(1), table, messageKeyOf(short), "short"))
        yield* TestClock.setTime(T0 + 59_999)
        assert.deepStrictEqual(yield* s.saveMessages(uaid(1), table, [short]), [], "until the message's expiry its tombstone holds")
        yield* TestClock.setTime(T0 + 60_000)
        // Its tombstone keeps the message's `expiry`: the sweeps and DynamoDB's TTL remove it then
        // (the SQL stores' sweep tests and the DynamoDB layout test check the row itself).
        assert.deepStrictEqual((yield* s.fetchMessages(uaid(1), table, 10)).messages, [])
      }))

    test("expired messages are invisible on every read (expiry <= now)", (s) =>
      Effect.gen(function*() {
        const table = yield* s.currentMessageTable
        yield* s.saveMessages(uaid(1), table, [
          message({ channelId: chid(1), version: "short-topic", topic: "a", ttl: 60 }),
          message({ channelId: chid(2), version: "long-topic", topic: "a", ttl: 3600 }),
          message({ channelId: chid(1), version: "short", sortkeyTimestamp: T0 + 1, ttl: 60 }),
          message({ channelId: chid(1), version: "long", sortkeyTimestamp: T0 + 2, ttl: 3600 }),
          message({ channelId: chid(1), version: "short2", sortkeyTimestamp: T0 + 3, ttl: 60 })
        ])
        const versions = (ms: ReadonlyArray<Notification>) => ms.map((m) => m.version)

        yield* TestClock.setTime(T0 + 59_999)
        assert.deepStrictEqual(versions(yield* s.fetchTopicMessages(uaid(1), table, 10)), ["short-topic", "long-topic"])
        assert.deepStrictEqual(
          versions((yield* s.fetchTimestampMessages(uaid(1), table, undefined, 10)).messages),
          ["short", "long", "short2"]
        )

        yield* TestClock.setTime(T0 + 60_000)
        assert.deepStrictEqual(versions(yield* s.fetchTopicMessages(uaid(1), table, 10)), ["long-topic"])
        // the limit counts visible topic messages
        assert.deepStrictEqual(versions(yield* s.fetchTopicMessages(uaid(1), table, 1)), ["long-topic"])
        const page = yield* s.fetchTimestampMessages(uaid(1), table, undefined, 10)
        assert.deepStrictEqual(versions(page.messages), ["long"])
        // a page counts no expired rows: one of one holds the first that lives
        const first = yield* s.fetchTimestampMessages(uaid(1), table, undefined, 1)
        assert.deepStrictEqual([versions(first.messages), first.lastSortKey, first.more], [["long"], T0 + 2, true])

        yield* TestClock.setTime(T0 + 3_600_000)
        assert.deepStrictEqual(yield* s.fetchTopicMessages(uaid(1), table, 10), [])
        assert.deepStrictEqual(yield* s.fetchTimestampMessages(uaid(1), table, undefined, 10), {
          messages: [],
          lastSortKey: undefined,
          more: false
        })
      }))

    // ── maintenance ─────────────────────────────────────────────────────────────────────────────

    test("dropStaleUsers: the users whose last_connect month is in range, with their messages", (s) =>
      Effect.gen(function*() {
        const table = yield* s.currentMessageTable
        const at = (y: number, m: number, hour: number) => Date.UTC(y, m - 1, 10, hour)
        const stale = [
          ...Array.from({ length: 30 }, (_, i) => user(100 + i, { lastConnect: lastConnectValue(at(2034, 3, 5), 7) })),
          user(1, { lastConnect: lastConnectValue(at(2034, 3, 0), 0) }),
          user(2, { lastConnect: lastConnectValue(at(2034, 2, 23), 10) })
        ]
        const kept = [
          user(3, { lastConnect: lastConnectValue(at(2034, 5, 1), 1) }), // this month
          user(4, { lastConnect: lastConnectValue(at(2034, 4, 1), 1) }), // one month ago
          user(5, { lastConnect: lastConnectValue(at(2034, 1, 1), 1) }), // beyond the lookback
          user(6, {}) // never connected
        ]
        yield* Effect.forEach([...stale, ...kept], (u) =>
          Effect.gen(function*() {
            yield* s.registerUser({ ...u, currentMonth: table })
            yield* s.addChannel(u.uaid, table, chid(1))
            yield* s.saveMessage(u.uaid, table, message({ channelId: chid(1), version: "v", sortkeyTimestamp: T0 }))
          }), { concurrency: 8 })

        const wouldDrop = yield* s.dropStaleUsers({ monthsAgo: 2, lookbackMonths: 1, dryRun: true })
        assert.strictEqual(wouldDrop, stale.length, "a dry run counts them")
        assert.isDefined(yield* s.getUser(stale[0]!.uaid), "and drops nothing")
        const progress: Array<number> = []
        const dropped = yield* s.dropStaleUsers({
          monthsAgo: 2,
          lookbackMonths: 1,
          onProgress: (n) => Effect.sync(() => progress.push(n))
        })
        assert.strictEqual(dropped, stale.length)
        assert.strictEqual(progress.at(-1), stale.length)
        assert.deepStrictEqual(progress, [...progress].sort((a, b) => a - b))
        for (const u of stale) {
          assert.isUndefined(yield* s.getUser(u.uaid))
          assert.strictEqual((yield* s.getChannels(u.uaid, table)).size, 0)
          assert.deepStrictEqual((yield* s.fetchTimestampMessages(u.uaid, table, undefined, 10)).messages, [])
        }
        for (const u of kept) {
          assert.isDefined(yield* s.getUser(u.uaid))
          assert.strictEqual((yield* s.getChannels(u.uaid, table)).size, 1)
        }
        assert.strictEqual(yield* s.dropStaleUsers({ monthsAgo: 2, lookbackMonths: 1 }), 0)
        assert.strictEqual(yield* s.dropStaleUsers({ monthsAgo: 4, lookbackMonths: 0 }), 1)
      }))

    test("operations on a missing message table fail with a StorageError naming the operation, reason MissingTable", (s) =>
      Effect.gen(function*() {
        const exit = yield* Effect.exit(s.saveMessage(uaid(1), "no_such_table_anywhere", message({ channelId: chid(1), version: "v" })))
        assert.isTrue(Exit.isFailure(exit))
        const error = yield* Effect.flip(s.fetchMessages(uaid(1), "no_such_table_anywhere", 1))
        assert.instanceOf(error, StorageError)
        assert.strictEqual(error.operation, "fetchMessages")
        assert.strictEqual(error.reason._tag, "MissingTable")
      }))

    // ── push receipts ───────────────────────────────────────────────────────────────────────────

    test("receipt subscriptions: created, touched while alive, gone once expired", (s) =>
      Effect.gen(function*() {
        assert.isUndefined(yield* s.readReceiptSubscription("rs1"))
        assert.isFalse(yield* s.touchReceiptSubscription("rs1", T0_SECONDS + 60))
        yield* s.createReceiptSubscription("rs1", T0_SECONDS + 60)
        assert.deepStrictEqual(yield* s.readReceiptSubscription("rs1"), { expiry: T0_SECONDS + 60, statuses: [] })
        yield* TestClock.adjust("59 seconds")
        assert.isTrue(yield* s.touchReceiptSubscription("rs1", T0_SECONDS + 120))
        yield* TestClock.adjust("60 seconds") // 119 s: alive thanks to the touch
        assert.strictEqual((yield* s.readReceiptSubscription("rs1"))?.expiry, T0_SECONDS + 120)
        yield* TestClock.adjust("1 second")
        assert.isUndefined(yield* s.readReceiptSubscription("rs1"))
        assert.isFalse(yield* s.touchReceiptSubscription("rs1", T0_SECONDS + 600))
      }))

    test("message status rows: opened, then written field by field in any order, the first outcome kept", (s) =>
      Effect.gen(function*() {
        yield* s.createReceiptSubscription("rs2", T0_SECONDS + 3600)
        const expiry = T0_SECONDS + 600
        assert.isTrue(yield* s.openMessageStatus("rs2", "m1", { acceptedAt: T0, expiry }))
        // The ack of one node may land before the delivery recorded by another, and the endpoint's
        // later write after both.
        assert.isTrue(yield* s.updateMessageStatus("rs2", "m1", { outcome: { outcome: "acknowledged", at: T0 + 9, code: 100 }, expiry }))
        assert.isTrue(yield* s.updateMessageStatus("rs2", "m1", { deliveredAt: T0 + 5, expiry }))
        assert.isTrue(yield* s.updateMessageStatus("rs2", "m1", { deadline: T0 + 60_000, expiry }))
        assert.isFalse(yield* s.updateMessageStatus("rs2", "m1", { outcome: { outcome: "deleted", at: T0 + 10 }, expiry }))
        assert.isFalse(yield* s.openMessageStatus("rs2", "m1", { outcome: { outcome: "deleted", at: T0 + 10 }, expiry }))
        assert.deepStrictEqual(yield* s.getMessageStatus("rs2", "m1"), ACKED_ROW)
        yield* s.openMessageStatus("rs2", "m2", { acceptedAt: T0, storedAt: T0 + 1, deadline: T0 + 1000, expiry: T0_SECONDS + 30 })
        const read = yield* s.readReceiptSubscription("rs2")
        assert.deepStrictEqual(read?.statuses.map((x) => x.messageId).sort(), ["m1", "m2"])
        assert.deepStrictEqual(read?.statuses.find((x) => x.messageId === "m2"), {
          messageId: "m2",
          acceptedAt: T0,
          storedAt: T0 + 1,
          deadline: T0 + 1000
        })
        yield* TestClock.adjust("30 seconds") // m2's row expired, m1's not
        assert.isUndefined(yield* s.getMessageStatus("rs2", "m2"))
        assert.deepStrictEqual((yield* s.readReceiptSubscription("rs2"))?.statuses.map((x) => x.messageId), ["m1"])
        yield* s.deleteMessageStatuses("rs2", ["m1", "missing"])
        assert.isUndefined(yield* s.getMessageStatus("rs2", "m1"))
        assert.deepStrictEqual((yield* s.readReceiptSubscription("rs2"))?.statuses, [])
        // Rows of another subscription are its own.
        yield* s.openMessageStatus("rs3", "m1", { acceptedAt: T0, expiry })
        assert.deepStrictEqual((yield* s.readReceiptSubscription("rs2"))?.statuses, [])
        assert.isUndefined(yield* s.readReceiptSubscription("rs3")) // never created: no subscription
      }))

    test("message status rows: only the opening write makes a row; a late write to a removed row makes none", (s) =>
      Effect.gen(function*() {
        yield* s.createReceiptSubscription("rs4", T0_SECONDS + 3600)
        const expiry = T0_SECONDS + 600
        // Never opened: neither a step nor an outcome makes the row.
        assert.isFalse(yield* s.updateMessageStatus("rs4", "m1", { deliveredAt: T0 + 5 }))
        assert.isFalse(yield* s.updateMessageStatus("rs4", "m1", { outcome: { outcome: "acknowledged", at: T0 + 9, code: 100 }, expiry }))
        assert.isUndefined(yield* s.getMessageStatus("rs4", "m1"))
        assert.deepStrictEqual((yield* s.readReceiptSubscription("rs4"))?.statuses, [])
        // Opened: the later writes apply.
        assert.isTrue(yield* s.openMessageStatus("rs4", "m1", { acceptedAt: T0, deadline: T0 + 60_000, expiry }))
        assert.isTrue(yield* s.updateMessageStatus("rs4", "m1", { deliveredAt: T0 + 5 }))
        assert.isTrue(yield* s.updateMessageStatus("rs4", "m1", { outcome: { outcome: "acknowledged", at: T0 + 9, code: 100 }, expiry }))
        assert.deepStrictEqual(yield* s.getMessageStatus("rs4", "m1"), ACKED_ROW)
        // The receipt collected: a late step or outcome does not bring the row back.
        yield* s.deleteMessageStatuses("rs4", ["m1"])
        assert.isFalse(yield* s.updateMessageStatus("rs4", "m1", { deliveredAt: T0 + 5 }))
        assert.isFalse(yield* s.updateMessageStatus("rs4", "m1", { storedAt: T0 + 6, deadline: T0 + 60_000, expiry }))
        assert.isFalse(yield* s.updateMessageStatus("rs4", "m1", { outcome: { outcome: "expired", at: T0 + 60_000 }, expiry }))
        assert.isUndefined(yield* s.getMessageStatus("rs4", "m1"))
        assert.deepStrictEqual((yield* s.readReceiptSubscription("rs4"))?.statuses, [])
      }))
  })
