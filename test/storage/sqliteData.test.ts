/**
 * The embedded database's data directory (`sqlite/data.ts`): what is refused as a database that lost
 * its contents, and what is not; what is made private.
 */
import { chmodSync, mkdirSync, mkdtempSync, rmSync, statSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { DatabaseSync } from "node:sqlite"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { afterAll } from "vitest"
import { databaseFiles, makeDataPrivate, markDatabaseStarted, refuseLostDatabase, startedMarkerOf } from "../../src/storage/sqlite/data.ts"

const root = mkdtempSync(join(tmpdir(), "autopush-sqlite-data-"))
afterAll(() => rmSync(root, { recursive: true, force: true }))

let dirs = 0
/** A new data directory and the path of its database (not made). */
const fresh = () => {
  const dir = join(root, String(dirs++))
  mkdirSync(dir)
  return join(dir, "autopush.sqlite")
}

const withTable = (path: string) => {
  const db = new DatabaseSync(path)
  db.exec("CREATE TABLE router (uaid TEXT PRIMARY KEY)")
  db.close()
}

/** The refusal's message, or undefined when the start may go on. */
const refusal = (path: string) => Effect.match(refuseLostDatabase(path), { onFailure: (error) => error.message, onSuccess: () => undefined })

describe("a database that lost its contents", () => {
  it.effect("is not refused without the marker: a first start, with or without a file", () =>
    Effect.gen(function*() {
      const path = fresh()
      assert.isUndefined(yield* refusal(path))
      writeFileSync(path, "")
      assert.isUndefined(yield* refusal(path))
    }))

  it.effect("the marker is written once, with the time, and kept", () =>
    Effect.gen(function*() {
      const path = fresh()
      withTable(path)
      yield* markDatabaseStarted(path, new Date("2026-11-30T10:00:00Z"))
      yield* markDatabaseStarted(path, new Date("2026-12-01T10:00:00Z"))
      const marker = startedMarkerOf(path)
      assert.strictEqual(statSync(marker).mode & 0o777, 0o600)
      assert.isUndefined(yield* refusal(path))
      rmSync(path)
      assert.match((yield* refusal(path)) ?? "", /autopush\.sqlite is missing, but .*autopush\.sqlite\.started says nodes ran on a database there since 2026-11-30T10:00:00\.000Z/)
    }))

  it.effect("beside the marker: missing, 0 bytes, or tableless refused, each saying so and how to start anew; tables or not a database at all let through", () =>
    Effect.gen(function*() {
      const path = fresh()
      yield* markDatabaseStarted(path, new Date())
      assert.match((yield* refusal(path)) ?? "", /is missing, but/)
      writeFileSync(path, "")
      const empty = (yield* refusal(path)) ?? ""
      assert.match(empty, /is empty \(0 bytes: a failed copy or restore\?\), but/)
      assert.match(empty, /restore the database from a backup; or, to start anew with an empty database on purpose .* remove .*autopush\.sqlite\.started \(option data_dir\)$/)
      const db = new DatabaseSync(path)
      db.exec("PRAGMA user_version = 1")
      db.close()
      assert.match((yield* refusal(path)) ?? "", /autopush\.sqlite has no tables, but/)
      withTable(path)
      assert.isUndefined(yield* refusal(path))
      // What is no database is left for opening it to report (with its own message).
      writeFileSync(path, "not a database ".repeat(100))
      assert.isUndefined(yield* refusal(path))
    }))

  it.effect("a marker that is not JSON is still a marker (no date said)", () =>
    Effect.gen(function*() {
      const path = fresh()
      writeFileSync(startedMarkerOf(path), "garbage")
      assert.match((yield* refusal(path)) ?? "", /\.started says nodes ran on a database there: its users/)
    }))
})

describe("the data directory made private", () => {
  it.effect("a new directory 0700; loose modes of the directory and the files that exist set to 0700/0600 and named; private ones not", () =>
    Effect.gen(function*() {
      const dir = join(root, "private", "data")
      const path = join(dir, "autopush.sqlite")
      assert.deepStrictEqual(yield* makeDataPrivate(dir, databaseFiles(path)), [])
      assert.strictEqual(statSync(dir).mode & 0o777, 0o700)
      writeFileSync(path, "")
      writeFileSync(`${path}-wal`, "")
      chmodSync(path, 0o644)
      chmodSync(`${path}-wal`, 0o600)
      chmodSync(dir, 0o750)
      assert.deepStrictEqual(yield* makeDataPrivate(dir, databaseFiles(path)), [dir, path])
      assert.strictEqual(statSync(dir).mode & 0o777, 0o700)
      assert.strictEqual(statSync(path).mode & 0o777, 0o600)
      assert.deepStrictEqual(yield* makeDataPrivate(dir, databaseFiles(path)), [])
    }))

  it.effect("a data directory that cannot be made is a StartupError naming data_dir", () =>
    Effect.gen(function*() {
      const file = join(root, "a-file")
      writeFileSync(file, "")
      const error = yield* Effect.flip(makeDataPrivate(join(file, "data"), []))
      assert.match(error.message, /^cannot make .*a-file\/data private \(option data_dir\): /)
    }))
})
