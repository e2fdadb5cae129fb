/**
 * The table keeper: a node keeps the router, receipt and last, this and next month's message tables
 * present — created at start and at every hourly check, whatever the day of the month — and where
 * it may not create them it still starts, says which tables are missing and how to make them, and
 * says it again at each check.
 */
import { assert, describe, it } from "@effect/vitest"
import { Clock, Effect, Layer, Logger } from "effect"
import { TestClock } from "effect/testing"
import { layerMemory } from "../../src/storage/memory/layer.ts"
import { mapStorageOperations, Storage, StorageError } from "../../src/storage/Storage.ts"
import { Denied, Unavailable } from "../../src/storage/failures.ts"
import { CREATE_TABLES_COMMAND, layerTableKeeper, TABLE_CHECK_SPREAD } from "../../src/storage/tableKeeper.ts"
import { Duration } from "effect"

const options = { routerTable: "router", messageTablePrefix: "message", noTableRotation: false }

/** Log lines written while a test runs, captured. */
const captured = () => {
  const lines: Array<{ readonly level: string; readonly text: string }> = []
  const layer = Logger.layer([
    Logger.make(({ logLevel, message }) => void lines.push({ level: logLevel, text: (Array.isArray(message) ? message : [message]).map(String).join(" ") }))
  ])
  return { lines, layer }
}

/** What the keeper found missing: the tables a check reports not OK. */
const missingTables = Storage.use((storage) => Effect.map(storage.checkTables, (statuses) => statuses.filter((s) => !s.ok).map((s) => s.table)))

/** Memory storage where CreateTable is denied (as for an IAM role without dynamodb:CreateTable). */
const deniedCreate = Layer.effect(
  Storage,
  Effect.map(Storage, (inner) =>
    mapStorageOperations(inner, (name) => (operation) =>
      name === "createTables"
        ? Effect.fail(new StorageError({ operation: name, reason: new Denied(), cause: Object.assign(new Error("not authorized to perform: dynamodb:CreateTable"), { name: "AccessDeniedException" }) })) as never
        : operation))
).pipe(Layer.provideMerge(layerMemory(options)))

describe("table keeper", () => {
  it.effect("creates last, this and next month's tables at start, whatever the day; the month after next on the last day; again within the hour", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(Date.UTC(2027, 0, 30, 9))
      const storage = yield* Storage
      assert.deepStrictEqual(yield* missingTables, ["router", "router_receipts", "message_2026_12", "message_2027_01", "message_2027_02"])
      yield* Layer.build(layerTableKeeper)
      assert.deepStrictEqual(yield* missingTables, [])
      assert.deepStrictEqual(yield* storage.listMessageTables, ["message_2026_12", "message_2027_01", "message_2027_02"])

      // The last day: the tables the turn makes active are made before it.
      yield* TestClock.setTime(Date.UTC(2027, 0, 31, 0, 0, 30))
      assert.deepStrictEqual(yield* missingTables, [])
      assert.deepStrictEqual(yield* storage.listMessageTables, ["message_2026_12", "message_2027_01", "message_2027_02", "message_2027_03"])
      yield* TestClock.setTime(Date.UTC(2027, 1, 1, 0, 0, 0, 1))
      assert.deepStrictEqual(yield* missingTables, [], "nothing missing the moment the month turns")

      // A table an operator dropped by mistake is back within the hour.
      yield* storage.dropMessageTable("message_2027_02")
      yield* TestClock.adjust("1 hour")
      assert.deepStrictEqual(yield* missingTables, [])
    }).pipe(Effect.scoped, Effect.provide(layerMemory(options))))

  it.effect("a new day's active tables are made at the keeper's next look (seconds), not at the next hourly check", () =>
    Effect.gen(function*() {
      const storage = yield* Storage
      yield* TestClock.setTime(Date.UTC(2027, 0, 30, 23, 30))
      yield* Layer.build(layerTableKeeper)
      assert.deepStrictEqual(yield* storage.listMessageTables, ["message_2026_12", "message_2027_01", "message_2027_02"])
      yield* TestClock.setTime(Date.UTC(2027, 0, 31, 0, 0, 10))
      assert.deepStrictEqual(yield* missingTables, [])
      assert.deepStrictEqual(yield* storage.listMessageTables, ["message_2026_12", "message_2027_01", "message_2027_02", "message_2027_03"])
    }).pipe(Effect.scoped, Effect.provide(layerMemory(options))))

  it.effect("where creating is denied, the node still starts and names the missing tables and the command, at start and at every check", () => {
    const logs = captured()
    return Effect.gen(function*() {
      // The last day, hours before the next set of tables: only the start and the hourly check look.
      yield* TestClock.setTime(Date.UTC(2027, 0, 31, 12, 0))
      yield* Layer.build(layerTableKeeper)
      const errors = () => logs.lines.filter((line) => line.level === "Error").map((line) => line.text)
      assert.strictEqual(errors().length, 1)
      const [error] = errors()
      assert.include(error, "tables missing and not created: router, router_receipts, message_2026_12, message_2027_01, message_2027_02, message_2027_03")
      assert.include(error, CREATE_TABLES_COMMAND)
      yield* TestClock.adjust("1 hour")
      assert.strictEqual(errors().length, 2, "said again at the hourly check (the first within the hour)")
    }).pipe(Effect.scoped, Effect.provide(deniedCreate), Effect.provide(logs.layer))
  })

  it.effect("nodes' checks of a new day's tables are spread over the half hour before its midnight, and the tables are there when it comes", () =>
    Effect.gen(function*() {
      const nodes = 20
      const midnight = Date.UTC(2027, 0, 31) // the last day: March's table becomes active
      // When (in whole ticks of the test's clock) each check looking at the new day was made.
      let now = midnight - Duration.toMillis(Duration.hours(2))
      const seen: Array<number> = []
      const looks: Array<number> = []
      const watched = Layer.effect(
        Storage,
        Effect.map(Storage, (inner) =>
          mapStorageOperations(inner, (name) => (operation) =>
            name === "checkTables"
              ? Effect.flatMap(Clock.currentTimeMillis, (lookedAt) => {
                if (lookedAt >= midnight) seen.push(now)
                return operation
              })
              : operation))
      ).pipe(Layer.provideMerge(layerMemory(options)))
      yield* Effect.gen(function*() {
        yield* TestClock.setTime(now)
        for (let i = 0; i < nodes; i++) yield* Layer.build(layerTableKeeper)
        const storage = yield* Storage
        while (now < midnight) {
          now += 10_000
          yield* TestClock.setTime(now)
          if (now < midnight - Duration.toMillis(TABLE_CHECK_SPREAD)) assert.notInclude(yield* storage.listMessageTables, "message_2027_03")
        }
        looks.push(...seen)
        assert.deepStrictEqual(yield* missingTables, [], "March's table is there the moment it becomes active")
      }).pipe(Effect.provide(watched))
      assert.strictEqual(looks.length, nodes, "each node looked at the new day's tables once")
      for (const at of looks) assert.isTrue(at > midnight - Duration.toMillis(TABLE_CHECK_SPREAD) && at <= midnight)
      assert.isAtLeast(new Set(looks).size, nodes / 2, `checks spread over the half hour, not in one tick: ${looks.map((at) => new Date(at).toISOString().slice(11, 19)).join(" ")}`)
    }).pipe(Effect.scoped))

  it.effect("storage that cannot be read at all fails the start", () =>
    Effect.gen(function*() {
      const unreachable = Layer.effect(
        Storage,
        Effect.map(Storage, (inner) =>
          mapStorageOperations(inner, (name) => () => Effect.fail(new StorageError({ operation: name, reason: new Unavailable(), cause: "connect ECONNREFUSED 127.0.0.1:8000" })) as never))
      ).pipe(Layer.provideMerge(layerMemory(options)))
      const exit = yield* Layer.build(layerTableKeeper).pipe(Effect.provide(unreachable), Effect.exit)
      assert.isTrue(exit._tag === "Failure")
    }).pipe(Effect.scoped))
})
