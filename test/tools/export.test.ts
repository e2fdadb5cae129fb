/**
 * `maintenance export` and `import` as child processes against dynalite: a store with users,
 * channels, messages and broadcasts in two month tables, exported and imported into another store
 * under other table names, then read back through the Storage service; bad files, a store that
 * holds users already, and the secrets.
 */
import { existsSync, lstatSync, readdirSync, readFileSync, renameSync, statSync, symlinkSync, writeFileSync } from "node:fs"
import { join } from "node:path"
import { Effect } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { lastConnectValue, type UserRecord } from "../../src/domain/user.ts"
import { layerSqlite } from "../../src/storage/sqlite/layer.ts"
import { Storage } from "../../src/storage/Storage.ts"
import { monthTableName } from "../../src/storage/tables.ts"
import { writeAtomically } from "../../src/tools/exportImport.ts"
import { readEmbeddedSecrets, writeEmbeddedSecrets } from "../../src/tools/storage.ts"
import { runTool, scratch, startServer, storageFlags, type Tables, tablesFor, withStorage } from "./harness.ts"

let source: Awaited<ReturnType<typeof startServer>>
let target: Awaited<ReturnType<typeof startServer>>
beforeAll(async () => {
  ;[source, target] = await Promise.all([startServer(), startServer()])
})
afterAll(async () => {
  await Promise.all([source?.close(), target?.close()])
})

const now = Date.now()
const lastMonth = (() => {
  const d = new Date(now)
  return Date.UTC(d.getUTCFullYear(), d.getUTCMonth() - 1, 15)
})()
const uaid = (n: number) => `${"cd".repeat(15)}${String(n).padStart(2, "0")}`
const chid = (n: number) => `00000000-0000-4000-8000-0000000000${String(n).padStart(2, "0")}`
const seconds = Math.floor(now / 1000)

/** Two users in last month's table and one in this month's, with channels, topic and timestamp messages; two broadcasts. */
const seed = (tables: Tables, endpoint = source.endpoint) => {
  const old = monthTableName(tables.messageTablePrefix, lastMonth)
  const current = monthTableName(tables.messageTablePrefix, now)
  const users: ReadonlyArray<UserRecord> = [
    { uaid: uaid(1), routerType: "webpush", routerData: {}, connectedAt: lastMonth, lastConnect: lastConnectValue(lastMonth, 2), currentMonth: old, recordVersion: 1 },
    { uaid: uaid(2), routerType: "fcm", routerData: { token: "t-2", app_id: "app" }, connectedAt: lastMonth + 1, lastConnect: lastConnectValue(lastMonth, 5), currentMonth: old, recordVersion: 1 },
    { uaid: uaid(3), routerType: "webpush", routerData: {}, connectedAt: now, nodeId: "http://node-1:8081", lastConnect: lastConnectValue(now, 0), currentMonth: current, recordVersion: 1, urgency: "high" }
  ]
  return withStorage(endpoint, tables, Effect.gen(function*() {
    const storage = yield* Storage
    yield* storage.createTables([old, current])
    for (const [i, user] of users.entries()) {
      const table = user.currentMonth ?? ""
      yield* storage.registerUser(user)
      yield* storage.addChannels(user.uaid, table, [chid(i * 10 + 1), chid(i * 10 + 2)])
      yield* storage.saveMessage(user.uaid, table, { channelId: chid(i * 10 + 1), version: `topic-${i}`, ttl: 3600, timestamp: seconds, sortkeyTimestamp: now, topic: `t${i}`, data: "aGVsbG8", headers: { encoding: "aes128gcm" } })
      for (let m = 0; m < 3; m++) {
        yield* storage.saveMessage(user.uaid, table, { channelId: chid(i * 10 + 2), version: `ts-${i}-${m}`, ttl: 3600, timestamp: seconds, sortkeyTimestamp: now + m, urgency: "low" })
      }
    }
    yield* storage.putBroadcast("a", "v1")
    yield* storage.putBroadcast("b", "v7")
    return users
  }))
}

/** What the Storage service reads of the store: users, and each user's channels and messages in its current table. */
const snapshot = (endpoint: string, tables: Tables) => withStorage(endpoint, tables, read)

const read = Effect.gen(function*() {
    const storage = yield* Storage
    const users = yield* Effect.forEach([1, 2, 3], (n) =>
      Effect.gen(function*() {
        const user = yield* storage.getUser(uaid(n))
        const table = user?.currentMonth ?? ""
        return {
          user,
          channels: [...(yield* storage.getChannels(uaid(n), table))].sort(),
          topic: yield* storage.fetchTopicMessages(uaid(n), table, 10),
          timestamp: (yield* storage.fetchTimestampMessages(uaid(n), table, undefined, 10)).messages
        }
      }))
    return { users, broadcasts: Object.fromEntries(yield* storage.getBroadcasts) }
  })

/** The source's snapshot as the target must read it: its tables renamed. */
const renamed = (snap: Awaited<ReturnType<typeof snapshot>>, from: Tables, to: Tables) => ({
  ...snap,
  users: snap.users.map((entry) => ({
    ...entry,
    user: entry.user === undefined ? undefined : { ...entry.user, currentMonth: entry.user.currentMonth?.replace(from.messageTablePrefix, to.messageTablePrefix) }
  }))
})

const fileLines = (path: string) => readFileSync(path, "utf8").trimEnd().split("\n").map((line) => JSON.parse(line) as Record<string, unknown>)

const routerExists = (endpoint: string, tables: Tables) =>
  withStorage(endpoint, tables, Storage.use((s) => s.checkTables)).then((status) => status.find((t) => t.table === tables.routerTable)?.ok === true)

describe("maintenance export → import", () => {
  const from = tablesFor()
  const to: Tables = { routerTable: `moved_router_${process.pid}`, messageTablePrefix: `moved_msg_${process.pid}`, noTableRotation: false }
  const file = join(scratch("export"), "backup.jsonl")
  let exported: Awaited<ReturnType<typeof snapshot>>

  beforeAll(async () => {
    await seed(from)
    exported = await snapshot(source.endpoint, from)
  })

  it("export writes a header, every item of the router table and both month tables, and an end line with the counts", async () => {
    // The seed is what the comparison relies on: every user, channel and message is there.
    expect(exported.users.map((u) => [u.user?.uaid, u.channels.length, u.topic.length, u.timestamp.length])).toEqual([
      [uaid(1), 2, 1, 3],
      [uaid(2), 2, 1, 3],
      [uaid(3), 2, 1, 3]
    ])
    const run = await runTool("maintenance", ["export", "--out", file, ...storageFlags(source.endpoint, from)])
    expect(run.code, run.stderr).toBe(0)
    const old = monthTableName(from.messageTablePrefix, lastMonth)
    const current = monthTableName(from.messageTablePrefix, now)
    // Router: 3 users and the broadcasts item; messages: per user a meta row, 2 channels, 4 messages.
    expect(run.stdout).toContain(`router table ${from.routerTable}: 4 items`)
    expect(run.stdout).toContain(`message table ${old}: 14 items`)
    expect(run.stdout).toContain(`message table ${current}: 7 items`)
    expect(run.stdout).toContain("exported 25 items of 3 tables")
    expect(run.stdout).toContain("secrets: not included")
    expect(statSync(file).mode & 0o777).toBe(0o600)

    const lines = fileLines(file)
    expect(lines[0]).toMatchObject({
      format: "autopush-export",
      version: 1,
      router_table: from.routerTable,
      message_tablename: from.messageTablePrefix,
      no_table_rotation: false,
      message_tables: [old, current]
    })
    expect(lines[0]).not.toHaveProperty("secrets")
    expect(lines.at(-1)).toEqual({ end: true, items: { [from.routerTable]: 4, [old]: 14, [current]: 7 } })
    const items = lines.slice(1, -1)
    expect(items).toHaveLength(25)
    expect(items.filter((l) => l["table"] === "router").map((l) => (l["item"] as { uaid: { S: string } }).uaid.S).sort()).toEqual(
      ["broadcasts", uaid(1), uaid(2), uaid(3)]
    )
    expect(items.every((l) => Object.keys(l).sort().join() === "item,name,table")).toBe(true)
    expect(items.find((l) => l["table"] === "messages" && l["name"] === current)).toMatchObject({ item: { uaid: { S: uaid(3) } } })
    expect(readdirSync(join(file, "..")).filter((name) => name.endsWith(".tmp"))).toEqual([])
  })

  it("import into an empty store under other table names: the Storage service reads the same users, channels, messages and broadcasts", async () => {
    const run = await runTool("maintenance", ["import", "--in", file, ...storageFlags(target.endpoint, to)])
    expect(run.code, run.stderr).toBe(0)
    const old = monthTableName(to.messageTablePrefix, lastMonth)
    expect(run.stdout).toContain(`router table ${from.routerTable} → ${to.routerTable}: 4 items`)
    expect(run.stdout).toContain(`message table ${monthTableName(from.messageTablePrefix, lastMonth)} → ${old}: 14 items`)
    expect(run.stdout).toContain("imported 25 items")
    expect(run.stdout).toContain("secrets: the file holds none")
    const imported = await snapshot(target.endpoint, to)
    expect(imported.users[0]?.user?.currentMonth).toBe(old)
    expect(imported).toEqual(renamed(exported, from, to))
    expect(imported.broadcasts).toEqual({ a: "v1", b: "v7" })
    expect(await withStorage(target.endpoint, to, Storage.use((s) => s.listMessageTables))).toEqual([old, monthTableName(to.messageTablePrefix, now)])
  })

  it("a store whose router table holds users is refused without --merge; with it, the same import again changes nothing", async () => {
    const refused = await runTool("maintenance", ["import", "--in", file, ...storageFlags(target.endpoint, to)])
    expect(refused.code).toBe(1)
    expect(refused.stderr).toContain(`router table ${to.routerTable} already holds 3 users: nothing was imported. Run again with --merge`)
    const merged = await runTool("maintenance", ["import", "--in", file, "--merge", ...storageFlags(target.endpoint, to)])
    expect(merged.code, merged.stderr).toBe(0)
    expect(merged.stdout).toContain("imported 25 items")
    expect(await snapshot(target.endpoint, to)).toEqual(renamed(exported, from, to))
  })

  it("a bad line fails naming its number, and nothing is written", async () => {
    const empty = tablesFor()
    const lines = readFileSync(file, "utf8").split("\n")
    const write = (name: string, content: ReadonlyArray<string>) => {
      const path = join(scratch("bad"), name)
      writeFileSync(path, content.join("\n"))
      return path
    }
    const cases: ReadonlyArray<readonly [string, string]> = [
      [write("json.jsonl", lines.map((l, i) => (i === 2 ? "{not json" : l))), "line 3: not JSON"],
      [write("shape.jsonl", lines.map((l, i) => (i === 4 ? '{"table":"users","name":"x","item":{}}' : l))), "line 5: not an item"],
      [write("table.jsonl", lines.map((l, i) => (i === 5 ? l.replace(/"name":"[^"]+"/, '"name":"elsewhere"') : l))), "line 6: an item of"],
      [write("key.jsonl", lines.map((l, i) => (i === 1 ? '{"table":"router","name":"' + from.routerTable + '","item":{"uaid":{"N":"1"}}}' : l))), "line 2: an item without its key attribute uaid"],
      [write("version.jsonl", lines.map((l, i) => (i === 0 ? l.replace('"version":1', '"version":2') : l))), "line 1: format version 2"],
      [write("other.jsonl", ['{"hello":"world"}', ...lines.slice(1)]), "line 1: not an export of this tool"],
      [write("cut.jsonl", lines.slice(0, 10)), "ends at line 10 without its end line: the file is cut short"],
      [write("count.jsonl", lines.filter((_, i) => i !== 3)), "the end line counts"]
    ]
    for (const [path, message] of cases) {
      const run = await runTool("maintenance", ["import", "--in", path, ...storageFlags(target.endpoint, empty)])
      expect(run.code, path).toBe(1)
      expect(run.stderr, path).toContain(message)
      expect(run.stderr, path).toContain("nothing was imported")
    }
    expect(await routerExists(target.endpoint, empty)).toBe(false)
    expect(await withStorage(target.endpoint, empty, Storage.use((s) => s.listMessageTables))).toEqual([])

    // Not even embedded data is made for a bad file.
    const cwd = scratch("bad-embedded")
    const run = await runTool("maintenance", ["import", "--in", cases[0]?.[0] ?? ""], { cwd })
    expect(run.code).toBe(1)
    expect(existsSync(join(cwd, "data"))).toBe(false)
  })

  it("a file of monthly tables is refused by a store configured with no_table_rotation", async () => {
    const single = tablesFor(true)
    const run = await runTool("maintenance", ["import", "--in", file, ...storageFlags(target.endpoint, single)])
    expect(run.code).toBe(1)
    expect(run.stderr).toContain("exported without no_table_rotation and this store is configured with it")
    expect(await routerExists(target.endpoint, single)).toBe(false)
  })

  it("arguments: --out and --in are required", async () => {
    const [out, input] = await Promise.all([runTool("maintenance", ["export"]), runTool("maintenance", ["import"])])
    expect([out.code, input.code]).toEqual([2, 2])
    expect(out.stderr).toContain("--out FILE is required")
    expect(input.stderr).toContain("--in FILE is required")
  })
})

describe("dynalite data of an earlier version", () => {
  it("moves to SQLite as the README says: export, move the dynalite directory aside, import; the same users, channels, messages and broadcasts", async () => {
    const dir = scratch("legacy")
    const tables: Tables = { routerTable: "router", messageTablePrefix: "message", noTableRotation: false }
    const legacy = await startServer(join(dir, "data", "dynalite"))
    let before: Awaited<ReturnType<typeof snapshot>>
    try {
      await seed(tables, legacy.endpoint)
      before = await snapshot(legacy.endpoint, tables)
    } finally {
      await legacy.close()
    }
    const file = join(dir, "data.jsonl")
    const exported = await runTool("maintenance", ["export", "--out", file], { cwd: dir })
    expect(exported.code, exported.stderr).toBe(0)
    expect(exported.stdout).toContain(`storage: embedded data under ${join(dir, "data", "dynalite")}`)
    renameSync(join(dir, "data", "dynalite"), join(dir, "data", "dynalite.old"))
    const imported = await runTool("maintenance", ["import", "--in", file], { cwd: dir })
    expect(imported.code, imported.stderr).toBe(0)
    expect(imported.stdout).toContain(`storage: embedded SQLite database ${join(dir, "data", "autopush.sqlite")}`)
    const after = await Effect.runPromise(read.pipe(Effect.provide(layerSqlite({ ...tables, path: join(dir, "data", "autopush.sqlite") }))))
    expect(after.users.map((u) => [u.channels.length, u.topic.length, u.timestamp.length])).toEqual([[2, 1, 3], [2, 1, 3], [2, 1, 3]])
    expect(after).toEqual(before)
  })
})

describe("maintenance export --secrets → import --secrets-out", () => {
  it("carries the keys of the embedded all-in-one into a new secrets.json, never over an existing one", async () => {
    const laptop = scratch("laptop")
    const secrets = { crypto_key: ["b4X-QvdL9DeneThA70aW1C4pYaZqu0_IAnsG2_MWw7A="], auth_keys: ["auth-key-1", "auth-key-0"] }
    await Effect.runPromise(writeEmbeddedSecrets(join(laptop, "data", "secrets.json"), secrets))
    const created = await runTool("maintenance", ["create-tables"], { cwd: laptop })
    expect(created.code, created.stderr).toBe(0)

    const file = join(laptop, "with-secrets.jsonl")
    const exported = await runTool("maintenance", ["export", "--out", file, "--secrets"], { cwd: laptop })
    expect(exported.code, exported.stderr).toBe(0)
    expect(exported.stdout).toContain(`storage: embedded SQLite database ${join(laptop, "data", "autopush.sqlite")}`)
    expect(exported.stdout).toContain(`WARNING: ${file} holds the secrets of the server`)
    expect(statSync(file).mode & 0o777).toBe(0o600)
    expect(fileLines(file)[0]?.["secrets"]).toEqual(secrets)

    const tables = tablesFor()
    const secretsOut = join(scratch("node"), "keys", "secrets.json")
    const imported = await runTool("maintenance", ["import", "--in", file, "--secrets-out", secretsOut, ...storageFlags(target.endpoint, tables)])
    expect(imported.code, imported.stderr).toBe(0)
    expect(imported.stdout).toContain(`secrets written to ${secretsOut} (mode 0600)`)
    expect(statSync(secretsOut).mode & 0o777).toBe(0o600)
    expect(await Effect.runPromise(readEmbeddedSecrets(secretsOut))).toEqual(secrets)

    const again = await runTool("maintenance", ["import", "--in", file, "--merge", "--secrets-out", secretsOut, ...storageFlags(target.endpoint, tables)])
    expect(again.code).toBe(1)
    expect(again.stderr).toContain(`--secrets-out: ${secretsOut} exists; it is never overwritten`)
  })

  it("the configured keys win; without any, --secrets fails naming the option; a file without secrets cannot give them", async () => {
    const tables = tablesFor()
    await withStorage(source.endpoint, tables, Storage.use((s) => s.createTables([])))
    const dir = scratch("configured")
    const configured = await runTool("maintenance", [
      "export", "--out", join(dir, "a.jsonl"), "--secrets", "--auth-keys", "[k2,k1]", ...storageFlags(source.endpoint, tables)
    ], { env: { CRYPTO_KEY: "b4X-QvdL9DeneThA70aW1C4pYaZqu0_IAnsG2_MWw7A=" } })
    expect(configured.code, configured.stderr).toBe(0)
    expect(fileLines(join(dir, "a.jsonl"))[0]?.["secrets"]).toEqual({ crypto_key: ["b4X-QvdL9DeneThA70aW1C4pYaZqu0_IAnsG2_MWw7A="], auth_keys: ["k2", "k1"] })

    const missing = await runTool("maintenance", ["export", "--out", join(dir, "b.jsonl"), "--secrets", ...storageFlags(source.endpoint, tables)])
    expect(missing.code).toBe(1)
    expect(missing.stderr).toContain("--secrets: crypto_key is required")
    expect(existsSync(join(dir, "b.jsonl"))).toBe(false)

    const plain = join(dir, "plain.jsonl")
    expect((await runTool("maintenance", ["export", "--out", plain, ...storageFlags(source.endpoint, tables)])).code).toBe(0)
    const out = join(dir, "secrets.json")
    const run = await runTool("maintenance", ["import", "--in", plain, "--secrets-out", out, ...storageFlags(target.endpoint, tablesFor())])
    expect(run.code).toBe(1)
    expect(run.stderr).toContain("holds no secrets (it was exported without --secrets); nothing was imported")
    expect(existsSync(out)).toBe(false)
  })
})

describe("temporary files of export and secrets.json", () => {
  /** A symlink where the temporary file used to be (`{path}.{pid}.tmp`), to a file that must stay as it is. */
  const plant = (path: string) => {
    const target = join(scratch("victim"), "victim.txt")
    writeFileSync(target, "untouched", { mode: 0o644 })
    symlinkSync(target, `${path}.${process.pid}.tmp`)
    return target
  }
  const checkWritten = (path: string, target: string) => {
    expect(readFileSync(target, "utf8")).toBe("untouched")
    expect(statSync(target).mode & 0o777).toBe(0o644)
    expect(lstatSync(path).isSymbolicLink()).toBe(false)
    expect(lstatSync(path).mode & 0o777).toBe(0o600)
    // Only the planted link is left beside it: the temporary file was renamed into place.
    expect(readdirSync(join(path, "..")).filter((name) => name.endsWith(".tmp"))).toEqual([`${path.split("/").at(-1)}.${process.pid}.tmp`])
  }

  it("secrets.json: a symlink planted at the old temporary path is not followed; the file is mode 0600", async () => {
    const path = join(scratch("secrets"), "secrets.json")
    const target = plant(path)
    const secrets = { crypto_key: ["b4X-QvdL9DeneThA70aW1C4pYaZqu0_IAnsG2_MWw7A="], auth_keys: ["auth-key-1"] }
    await Effect.runPromise(writeEmbeddedSecrets(path, secrets))
    checkWritten(path, target)
    expect(await Effect.runPromise(readEmbeddedSecrets(path))).toEqual(secrets)
  })

  it("export file: a symlink planted at the old temporary path is not followed; the file is mode 0600", async () => {
    const path = join(scratch("out"), "backup.jsonl")
    const target = plant(path)
    await Effect.runPromise(writeAtomically(path, (write) => write("{\"a\":1}\n")))
    checkWritten(path, target)
    expect(readFileSync(path, "utf8")).toBe("{\"a\":1}\n")
  })

  it("a failed write leaves neither the file nor a temporary one", async () => {
    const dir = scratch("failed")
    const path = join(dir, "backup.jsonl")
    const failed = await Effect.runPromise(Effect.exit(writeAtomically(path, (write) => Effect.andThen(write("x"), Effect.fail("stop")))))
    expect(failed._tag).toBe("Failure")
    expect(readdirSync(dir)).toEqual([])
  })
})
