import { assert, describe, it } from "@effect/vitest"
import type { Notification } from "../../src/domain/notification.ts"
import { lastConnectValue } from "../../src/domain/user.ts"
import {
  messageSortKey,
  parseSortKey,
  sortKeyMsOf,
  storedNotification,
  TIMESTAMP_END,
  timestampLowerBound,
  timestampSortKey
} from "../../src/storage/model.ts"
import {
  activeTableNames,
  currentTableName,
  isMessageTable,
  lastConnectKeys,
  messageTablesOf,
  monthTableName,
  staleMonths
} from "../../src/storage/tables.ts"

const rotating = { routerTable: "router", messageTablePrefix: "message", noTableRotation: false }
const single = { ...rotating, noTableRotation: true }
const chid = "5f2e1a9c-0b3d-4e8f-9a1b-2c3d4e5f6a7b"

describe("message table names", () => {
  it("are {prefix}_{YYYY}_{MM} by UTC month", () => {
    assert.strictEqual(monthTableName("message", Date.UTC(2024, 0, 1)), "message_2024_01")
    assert.strictEqual(monthTableName("message", Date.UTC(2024, 11, 31, 23, 59, 59, 999)), "message_2024_12")
    assert.strictEqual(monthTableName("m", 0), "m_1970_01")
    assert.strictEqual(currentTableName(rotating, Date.UTC(2025, 6, 4)), "message_2025_07")
  })

  it("active: last, this and next month; on a month's last day the month after next too", () => {
    assert.deepStrictEqual(activeTableNames(rotating, Date.UTC(2024, 0, 1)), ["message_2023_12", "message_2024_01", "message_2024_02"])
    assert.deepStrictEqual(activeTableNames(rotating, Date.UTC(2024, 0, 30, 23, 59, 59, 999)), ["message_2023_12", "message_2024_01", "message_2024_02"])
    assert.deepStrictEqual(activeTableNames(rotating, Date.UTC(2024, 0, 31)), [
      "message_2023_12",
      "message_2024_01",
      "message_2024_02",
      "message_2024_03"
    ])
    assert.deepStrictEqual(activeTableNames(rotating, Date.UTC(2024, 1, 29, 12)), [
      "message_2024_01",
      "message_2024_02",
      "message_2024_03",
      "message_2024_04"
    ])
    assert.deepStrictEqual(activeTableNames(rotating, Date.UTC(2024, 11, 31, 0, 0, 1)), [
      "message_2024_11",
      "message_2024_12",
      "message_2025_01",
      "message_2025_02"
    ])
    assert.deepStrictEqual(activeTableNames(rotating, Date.UTC(2025, 0, 1)), ["message_2024_12", "message_2025_01", "message_2025_02"])
  })

  it("no_table_rotation: the single table is named exactly the prefix", () => {
    assert.strictEqual(currentTableName(single, Date.UTC(2024, 0, 31)), "message")
    assert.deepStrictEqual(activeTableNames(single, Date.UTC(2024, 0, 31)), ["message"])
  })

  it("recognises and orders our message tables only", () => {
    assert.isTrue(isMessageTable(rotating, "message_2024_01"))
    assert.isTrue(isMessageTable(rotating, "message"))
    for (const other of ["router", "message_2024_13", "message_2024_1", "message_x_2024_01", "messages_2024_01", "message_2024_01_x"]) {
      assert.isFalse(isMessageTable(rotating, other), other)
    }
    assert.deepStrictEqual(
      messageTablesOf(rotating, ["message_2024_02", "router", "message_2023_12", "message", "other_2024_01"]),
      ["message", "message_2023_12", "message_2024_02"]
    )
  })
})

describe("stale-user sweep range", () => {
  it("covers monthsAgo … monthsAgo + lookbackMonths, across years", () => {
    assert.deepStrictEqual(staleMonths(Date.UTC(2024, 1, 10), 2, 2), [202312, 202311, 202310])
    assert.deepStrictEqual(staleMonths(Date.UTC(2024, 4, 10), 0, 0), [202405])
  })

  it("enumerates every last_connect key of a month: 24 hours × spread 0-10", () => {
    const keys = lastConnectKeys(202403)
    assert.strictEqual(keys.length, 24 * 11)
    assert.strictEqual(new Set(keys).size, keys.length)
    for (let hour = 0; hour < 24; hour++) {
      for (const spread of [0, 5, 10]) {
        assert.include(keys, lastConnectValue(Date.UTC(2024, 2, 17, hour, 30), spread))
      }
    }
    assert.notInclude(keys, lastConnectValue(Date.UTC(2024, 3, 1), 0))
  })
})

describe("sort keys", () => {
  const n = (fields: Partial<Notification>): Notification =>
    ({ channelId: chid, version: "v", ttl: 60, timestamp: 1_700_000_000, ...fields }) as Notification

  it("are autopush's: 01:{chid}:{topic}, 02:{ms}:{chid}", () => {
    assert.strictEqual(messageSortKey(n({ topic: "news" })), `01:${chid}:news`)
    assert.strictEqual(messageSortKey(n({ sortkeyTimestamp: 1_700_000_000_123 })), `02:1700000000123:${chid}`)
    assert.strictEqual(messageSortKey(n({})), `02:1700000000000:${chid}`)
  })

  it("zero-pad small ms so string order is numeric order", () => {
    assert.strictEqual(timestampSortKey(999, chid), `02:0000000000999:${chid}`)
    assert.isTrue(timestampSortKey(999, chid) < timestampSortKey(1000, chid))
  })

  it("bound timestamp pages: strictly after `after`, below 03", () => {
    const at = (ms: number, c = chid) => timestampSortKey(ms, c)
    assert.isTrue(timestampLowerBound(undefined) < at(0))
    assert.isTrue(timestampLowerBound(5) > at(5, "ffffffff-ffff-ffff-ffff-ffffffffffff"))
    assert.isTrue(timestampLowerBound(5) < at(6, "00000000-0000-0000-0000-000000000000"))
    assert.isTrue(at(9_999_999_999_999) < TIMESTAMP_END)
    assert.isTrue(`01:${chid}:zzz` < timestampLowerBound(undefined))
  })

  it("parse back to channel, topic and ms", () => {
    assert.deepStrictEqual(parseSortKey(`01:${chid}:news`), { channelId: chid, topic: "news" })
    assert.deepStrictEqual(parseSortKey(`02:0000000000999:${chid}`), { channelId: chid, sortkeyTimestamp: 999 })
    assert.strictEqual(sortKeyMsOf(`02:1700000000123:${chid}`), 1_700_000_000_123)
    assert.isUndefined(parseSortKey(" "))
    assert.isUndefined(parseSortKey(`${chid}:legacy`))
  })

  it("a stored message reads back without undefined fields; topic messages keep the ms they were accepted at, if any", () => {
    assert.deepStrictEqual(storedNotification(n({ data: undefined, topic: "t", sortkeyTimestamp: 5 })), {
      channelId: chid,
      version: "v",
      ttl: 60,
      timestamp: 1_700_000_000,
      topic: "t",
      sortkeyTimestamp: 5
    })
    assert.isFalse("sortkeyTimestamp" in storedNotification(n({ data: undefined, topic: "t", sortkeyTimestamp: undefined })))
    assert.strictEqual(storedNotification(n({})).sortkeyTimestamp, 1_700_000_000_000)
  })
})
