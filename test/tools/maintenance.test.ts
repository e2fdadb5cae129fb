/** `maintenance` as a child process against dynalite: create, list, drop tables, drop stale users; errors. */
import { join } from "node:path"
import { Cause, Effect, Exit, Layer, Scope } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { lastConnectValue } from "../../src/domain/user.ts"
import { layerEmbedded } from "../../src/storage/dynalite/embedded.ts"
import { Storage } from "../../src/storage/Storage.ts"
import { activeTableNames, monthTableName } from "../../src/storage/tables.ts"
import { maintenance, maintenanceHelp, tablesToDrop } from "../../src/tools/maintenance.ts"
import { DASHED_KEY } from "../config/sandbox.ts"
import { runTool, scratch, startServer, storageFlags, tablesFor, withStorage } from "./harness.ts"

let server: Awaited<ReturnType<typeof startServer>>
beforeAll(async () => {
  server = await startServer()
})
afterAll(() => server?.close())

/** The first day of the month `delta` months from now (UTC), in ms. */
const monthsFromNow = (delta: number): number => {
  const d = new Date()
  return Date.UTC(d.getUTCFullYear(), d.getUTCMonth() + delta, 1, 12)
}

const listed = (tables: ReturnType<typeof tablesFor>) =>
  withStorage(server.endpoint, tables, Storage.use((s) => s.listMessageTables))

/** The tool's program in this process: its failure, for arguments it rejects before reading anything. */
const failureOf = async (args: ReadonlyArray<string>) => {
  const exit = await Effect.runPromiseExit(maintenance(args))
  if (Exit.isSuccess(exit)) throw new Error(`${args.join(" ")}: succeeded`)
  const error = Cause.squash(exit.cause) as { _tag: string; message?: string; text?: string }
  return { tag: error._tag, text: error.text ?? error.message ?? "" }
}

describe("maintenance: arguments", () => {
  it("--help prints the commands and the storage options, exit 0; so does a command's --help", async () => {
    const [run, command] = await Promise.all([runTool("maintenance", ["--help"]), runTool("maintenance", ["drop-tables", "--help"])])
    expect(run.code).toBe(0)
    for (const text of ["create-tables", "list-tables", "drop-tables", "drop-users", "--storage-endpoint", "AWS_ENDPOINT_URL_DYNAMODB"]) {
      expect(run.stdout).toContain(text)
    }
    expect(run.stdout.trimEnd()).toBe(maintenanceHelp())
    expect(command.code).toBe(0)
    expect(command.stdout).toContain("Usage: maintenance drop-tables --older-than N [--yes]")
    expect(run.stderr + command.stderr).toBe("")
  })

  it("every command has its help, also as `help COMMAND`", async () => {
    for (const [name, text] of [
      ["create-tables", "next month"],
      ["list-tables", "active"],
      ["drop-tables", "--older-than N"],
      ["drop-users", "--lookback M"],
      ["export", "--secrets"],
      ["import", "--merge"]
    ] as const) {
      const help = await failureOf([name, "--help"])
      expect(help.tag).toBe("HelpRequested")
      expect(help.text).toContain(`Usage: maintenance ${name}`)
      expect(help.text).toContain(text)
      expect(await failureOf(["help", name])).toEqual(help)
    }
    expect((await failureOf(["help"])).text).toBe(maintenanceHelp())
  })

  it("an unknown command or a missing argument exits 2 with a message", async () => {
    const [unknown, missing] = await Promise.all([
      runTool("maintenance", ["rotate"]),
      runTool("maintenance", ["drop-tables", "--storage-endpoint", "http://127.0.0.1:9"])
    ])
    expect(unknown.code).toBe(2)
    expect(unknown.stderr).toContain('maintenance: unknown command "rotate": expected one of create-tables, list-tables, drop-tables, drop-users, export, import (see maintenance --help)')
    expect(missing.code).toBe(2)
    expect(missing.stderr).toContain("--older-than N is required")
    expect(unknown.stdout + missing.stdout).toBe("")
  })

  it("bad arguments are usage errors found before settings or storage are read", async () => {
    const cases: ReadonlyArray<readonly [ReadonlyArray<string>, string]> = [
      [[], "a command is required"],
      [["help", "rotate"], 'unknown command "rotate"'],
      [["drop-tables", "--older-than", "0"], '"0" is not an integer of at least 1'],
      [["drop-tables", "--older-than", "three"], '"three" is not an integer'],
      [["drop-tables", "--older-than"], "--older-than needs a value"],
      [["drop-tables", "--older-than", "--yes"], "--older-than needs a value"],
      [["drop-users", "--months", "2", "--lookback", "-1"], "--lookback"],
      [["drop-users"], "--months N is required"],
      [["drop-users", "--months", "2", "--yes=no"], "--yes takes no value"],
      [["list-tables", "--yes"], "list-tables takes no --yes"],
      [["list-tables", "extra"], 'unexpected argument "extra"'],
      [["list-tables", "--frobnicate"], "unknown flag --frobnicate"]
    ]
    for (const [args, message] of cases) {
      const failure = await failureOf(args)
      expect(failure.tag, args.join(" ")).toBe("UsageError")
      expect(failure.text, args.join(" ")).toContain(message)
    }
    const config = await failureOf(["list-tables", "--storage-endpoint", "ftp://nope"])
    expect(config).toEqual({ tag: "ConfigError", text: expect.stringContaining("storage_endpoint") })
    // A configuration value given apart may start with "--" (one Fernet key in 4,096 does): it is the
    // flag's value, and the settings are read (the bad endpoint after it is what fails).
    const dashed = await failureOf(["list-tables", "--crypto-key", DASHED_KEY, "--storage-endpoint", "ftp://nope"])
    expect(dashed).toEqual({ tag: "ConfigError", text: expect.stringContaining("storage_endpoint") })
  })

  it("unreachable storage exits 1 and says so", async () => {
    const run = await runTool("maintenance", ["list-tables", "--storage-endpoint", "http://127.0.0.1:9"])
    expect(run.code).toBe(1)
    expect(run.stderr).toMatch(/storage error in .*cannot reach http:\/\/127\.0\.0\.1:9/)
  })
})

describe("maintenance: tables", () => {
  it("create-tables makes the router table and the active tables (last, this and next month's…), once", async () => {
    const tables = tablesFor()
    const last = monthTableName(tables.messageTablePrefix, monthsFromNow(-1))
    const current = monthTableName(tables.messageTablePrefix, Date.now())
    const next = monthTableName(tables.messageTablePrefix, monthsFromNow(1))
    // On a month's last day the month after next is active too.
    const active = activeTableNames(tables, Date.now())
    const first = await runTool("maintenance", ["create-tables", ...storageFlags(server.endpoint, tables)])
    expect(first.code, first.stderr).toBe(0)
    expect(first.stdout).toContain(`storage: DynamoDB at ${server.endpoint}`)
    expect(first.stdout).toContain(`router table ${tables.routerTable}: created`)
    expect(first.stdout).toContain(`receipt table ${tables.routerTable}_receipts: created`)
    expect(first.stdout).toContain(`message table ${current}: created`)
    expect(first.stdout).toContain(`message table ${last}: created`)
    expect(first.stdout).toContain(`message table ${next}: created`)
    expect(active.slice(0, 3)).toEqual([last, current, next])
    expect(await listed(tables)).toEqual(active)
    const status = await withStorage(server.endpoint, tables, Storage.use((s) => s.checkTables))
    expect(status.find((t) => t.table === tables.routerTable)?.ok).toBe(true)

    const again = await runTool("maintenance", ["create-tables", ...storageFlags(server.endpoint, tables)])
    expect(again.code).toBe(0)
    expect(again.stdout).toContain(`router table ${tables.routerTable}: already there`)
    expect(again.stdout).toContain(`receipt table ${tables.routerTable}_receipts: already there`)
    expect(again.stdout).toContain(`message table ${current}: already there`)

    const list = await runTool("maintenance", ["list-tables", ...storageFlags(server.endpoint, tables)])
    expect(list.code).toBe(0)
    expect(list.stdout).toContain(`router table ${tables.routerTable}: ok`)
    expect(list.stdout).toContain(`receipt table ${tables.routerTable}_receipts: ok`)
    expect(list.stdout).toContain(`${current}  (active, current)`)
    expect(list.stdout).toContain(`${next}  (active)`)
    expect(list.stdout).not.toContain("missing")
  })

  it("create-tables with no_table_rotation makes the single table", async () => {
    const tables = tablesFor(true)
    const run = await runTool("maintenance", ["create-tables", ...storageFlags(server.endpoint, tables)])
    expect(run.code, run.stderr).toBe(0)
    expect(run.stdout).toContain(`message table ${tables.messageTablePrefix}: created`)
    expect(await listed(tables)).toEqual([tables.messageTablePrefix])
  })

  it("list-tables says which active tables are missing", async () => {
    const tables = tablesFor()
    const current = monthTableName(tables.messageTablePrefix, Date.now())
    await withStorage(server.endpoint, tables, Storage.use((s) => s.createTables([current])))
    const run = await runTool("maintenance", ["list-tables", ...storageFlags(server.endpoint, tables)])
    expect(run.code).toBe(0)
    expect(run.stdout).toContain("message tables (1, oldest first):")
    const last = monthTableName(tables.messageTablePrefix, monthsFromNow(-1))
    const next = monthTableName(tables.messageTablePrefix, monthsFromNow(1))
    const missing = activeTableNames(tables, Date.now()).filter((table) => table !== current)
    expect(missing.slice(0, 2)).toEqual([last, next])
    expect(run.stdout).toContain(`missing: ${missing.join(", ")} (run create-tables)`)
  })

  it("drop-tables lists old tables in a dry run and drops them with --yes, never active ones", async () => {
    const tables = tablesFor()
    const name = (delta: number) => monthTableName(tables.messageTablePrefix, monthsFromNow(delta))
    const old = [name(-14), name(-5), name(-4)]
    const kept = [name(-3), name(-1), name(0), name(1)]
    await withStorage(server.endpoint, tables, Storage.use((s) => s.createTables([...old, ...kept])))
    const flags = ["drop-tables", "--older-than", "3", ...storageFlags(server.endpoint, tables)]

    const dry = await runTool("maintenance", flags)
    expect(dry.code, dry.stderr).toBe(0)
    expect(dry.stdout).toContain("message tables older than 3 months")
    for (const table of old) expect(dry.stdout).toContain(`would drop ${table}`)
    for (const table of kept) expect(dry.stdout).not.toContain(table)
    expect(dry.stdout).toContain("dry run: nothing dropped; run again with --yes")
    expect(await listed(tables)).toEqual([...old, ...kept])

    const real = await runTool("maintenance", [...flags, "--yes"])
    expect(real.code, real.stderr).toBe(0)
    for (const table of old) expect(real.stdout).toContain(`dropped ${table}`)
    expect(real.stdout).toContain("dropped 3 tables")
    expect(await listed(tables)).toEqual(kept)

    const none = await runTool("maintenance", [...flags, "--yes"])
    expect(none.code).toBe(0)
    expect(none.stdout).toContain("nothing to drop")

    // --older-than 1 would reach last month, which is active: it stays.
    const edge = await runTool("maintenance", ["drop-tables", "--older-than=1", "--yes", ...storageFlags(server.endpoint, tables)])
    expect(edge.code).toBe(0)
    expect(await listed(tables)).toEqual([name(-1), name(0), name(1)])
  })
})

describe("maintenance: drop-users", () => {
  const uaid = (n: number) => `${"ab".repeat(15)}${String(n).padStart(2, "0")}`
  const chid = "00000000-0000-4000-8000-0000000000c1"

  it("drops users not seen for N months with their messages, keeps the others, dry run first", async () => {
    const tables = tablesFor()
    const now = Date.now()
    const table = monthTableName(tables.messageTablePrefix, now)
    const staleAt = monthsFromNow(-5)
    const seed = Effect.gen(function*() {
      const storage = yield* Storage
      yield* storage.createTables([table])
      const users = [
        { uaid: uaid(1), lastConnect: lastConnectValue(staleAt, 3), connectedAt: staleAt },
        { uaid: uaid(2), lastConnect: lastConnectValue(now, 7), connectedAt: now },
        // Seen 2 months ago: not stale for --months 3.
        { uaid: uaid(3), lastConnect: lastConnectValue(monthsFromNow(-2), 0), connectedAt: monthsFromNow(-2) }
      ]
      for (const user of users) {
        yield* storage.registerUser({ ...user, routerType: "webpush", routerData: {}, currentMonth: table })
        yield* storage.addChannel(user.uaid, table, chid)
        yield* storage.saveMessage(user.uaid, table, { channelId: chid, version: `v-${user.uaid}`, ttl: 3600, timestamp: Math.floor(now / 1000), topic: "t" })
      }
    })
    await withStorage(server.endpoint, tables, seed)
    const flags = ["drop-users", "--months", "3", "--lookback", "3", ...storageFlags(server.endpoint, tables)]
    const state = () =>
      withStorage(server.endpoint, tables, Effect.gen(function*() {
        const storage = yield* Storage
        return yield* Effect.forEach([1, 2, 3], (n) =>
          Effect.all([storage.getUser(uaid(n)), storage.getChannels(uaid(n), table), storage.fetchTopicMessages(uaid(n), table, 10)]).pipe(
            Effect.map(([user, channels, messages]) => ({ user: user !== undefined, channels: channels.size, messages: messages.length }))
          ))
      }))

    const dry = await runTool("maintenance", flags)
    expect(dry.code, dry.stderr).toBe(0)
    expect(dry.stdout).toContain("(3 to 6 months ago: 4 months of the last_connect index)")
    expect(dry.stdout).toContain("dry run: 1 user would be dropped, nothing was; run again with --yes to drop it")
    expect((await state()).every((s) => s.user && s.channels === 1 && s.messages === 1)).toBe(true)

    const real = await runTool("maintenance", [...flags, "--yes"])
    expect(real.code, real.stderr).toBe(0)
    expect(real.stdout).toContain("dropped 1 user")
    expect(await state()).toEqual([
      { user: false, channels: 0, messages: 0 },
      { user: true, channels: 1, messages: 1 },
      { user: true, channels: 1, messages: 1 }
    ])
  })
})

describe("maintenance: embedded data", () => {
  it("while an all-in-one runs on the embedded data, the tools use its embedded server", async () => {
    const dataDir = join(scratch("running"), "data")
    const tables = { routerTable: "router", messageTablePrefix: "message", noTableRotation: false }
    const scope = Effect.runSync(Scope.make())
    // What the all-in-one runs: embedded storage, which announces where it serves the data.
    await Effect.runPromise(Layer.buildWithScope(layerEmbedded({ ...tables, dataDir: join(dataDir, "dynalite") }), scope))
    try {
      const list = await runTool("maintenance", ["list-tables", "--data-dir", dataDir])
      expect(list.code, list.stderr).toBe(0)
      expect(list.stdout).toContain(`${monthTableName("message", Date.now())}  (active, current)`)
    } finally {
      await Effect.runPromise(Scope.close(scope, Exit.void))
    }
  })

  it("works on the embedded data of a stopped all-in-one; data held by a process that does not announce itself is refused", async () => {
    const dataDir = join(scratch("embedded"), "data")
    const running = await startServer(join(dataDir, "dynalite"))
    const tables = { routerTable: "router", messageTablePrefix: "message", noTableRotation: false }
    const current = monthTableName("message", Date.now())
    await withStorage(running.endpoint, tables, Storage.use((s) => s.createTables([current])))

    const locked = await runTool("maintenance", ["list-tables", "--data-dir", dataDir])
    expect(locked.code).toBe(1)
    expect(locked.stderr).toContain(`the embedded data under ${join(dataDir, "dynalite")} is in use`)

    await running.close()
    const list = await runTool("maintenance", ["list-tables", "--data-dir", dataDir])
    expect(list.code, list.stderr).toBe(0)
    expect(list.stdout).toContain(`storage: embedded data under ${join(dataDir, "dynalite")}`)
    expect(list.stdout).toContain(`${current}  (active, current)`)
  })

  it("without a storage endpoint or embedded data, only create-tables proceeds", async () => {
    const cwd = scratch("empty")
    const run = await runTool("maintenance", ["drop-tables", "--older-than", "3"], { cwd })
    expect(run.code).toBe(1)
    expect(run.stderr).toContain("no storage: no storage_endpoint is configured")
    const create = await runTool("maintenance", ["create-tables"], { cwd })
    expect(create.code, create.stderr).toBe(0)
    expect(create.stdout).toContain(`storage: embedded SQLite database ${join(cwd, "data", "autopush.sqlite")}`)
    expect(create.stdout).toContain("router table router: created")
  })

  it("reads the storage endpoint from AWS_ENDPOINT_URL_DYNAMODB and ini files like the nodes", async () => {
    const tables = tablesFor()
    const viaEnv = await runTool("maintenance", ["create-tables", "--router-tablename", tables.routerTable, "--message-tablename", tables.messageTablePrefix], {
      env: { AWS_ENDPOINT_URL_DYNAMODB: server.endpoint }
    })
    expect(viaEnv.code, viaEnv.stderr).toBe(0)
    expect(viaEnv.stdout).toContain(`storage: DynamoDB at ${server.endpoint}`)
    const cwd = scratch("ini")
    const { writeFileSync } = await import("node:fs")
    writeFileSync(join(cwd, ".autopush_shared.ini"), `storage_endpoint = ${server.endpoint}\nrouter_tablename = ${tables.routerTable}\nmessage_tablename = ${tables.messageTablePrefix}\n`)
    const viaIni = await runTool("maintenance", ["list-tables"], { cwd })
    expect(viaIni.code, viaIni.stderr).toBe(0)
    expect(viaIni.stdout).toContain(`router table ${tables.routerTable}: ok`)
  })
})

describe("maintenance: which tables", () => {
  const options = { routerTable: "router", messageTablePrefix: "message", noTableRotation: false }
  const lastDayOfNovember = Date.UTC(2026, 10, 30, 12)

  it("drop-tables: strictly older than N months, never an active table, never the bare or a foreign table", () => {
    const existing = ["message", "message_2025_12", "message_2026_07", "message_2026_08", "message_2026_10", "message_2026_11", "message_2026_12", "message_x_2020_01"]
    expect(tablesToDrop(options, existing, lastDayOfNovember, 3)).toEqual(["message_2025_12", "message_2026_07"])
    // Even asked for everything, last, this and next month stay.
    expect(tablesToDrop(options, existing, lastDayOfNovember, -5)).toEqual(["message_2025_12", "message_2026_07", "message_2026_08"])
    expect(tablesToDrop({ ...options, noTableRotation: true }, ["message", "message_2026_01"], lastDayOfNovember, 1)).toEqual(["message_2026_01"])
  })
})
