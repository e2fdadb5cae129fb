/**
 * `maintenance`: the table chores of a deployment on DynamoDB (or on the embedded data of a stopped
 * all-in-one), over the Storage service.
 *
 * - `create-tables`: the router and receipt tables and the active message tables (last, this and
 *   next month's; the single table with `no_table_rotation`). The nodes do the same at start and
 *   every hour; this is for deployments whose nodes may not create tables.
 * - `list-tables`: what exists, which tables are active.
 * - `drop-tables --older-than N`: message tables more than N months before this month; never an
 *   active one (last, this or next month).
 * - `drop-users --months N`: users whose last connection was N or more months ago, with their
 *   stored messages, through the `last_connect` index (paced by the Storage layer).
 * - `export` / `import`: the whole store to a file and back, to back it up or move it
 *   (`exportImport.ts`).
 *
 * The two drop commands only say what they would do unless given `--yes`.
 */
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import { HelpRequested } from "../config/index.ts"
import type { OptionName } from "../config/options.ts"
import { Storage } from "../storage/Storage.ts"
import { activeTableNames, currentTableName, monthIndex, receiptTableName, type StorageOptions, staleMonths } from "../storage/tables.ts"
import {
  describeStorageError,
  intFlag,
  plural,
  say,
  settingsHelp,
  splitArgs,
  type ToolError,
  ToolFailure,
  toolSettings,
  usageRow,
  UsageError
} from "./cli.ts"
import type { Command, Run } from "./command.ts"
import { exportCommand, importCommand } from "./exportImport.ts"
import { storageDescription, storageOptionsOf, toolTablesLayer } from "./storage.ts"

const STORAGE_OPTIONS: ReadonlyArray<OptionName> = [
  "storage_endpoint",
  "aws_region",
  "router_tablename",
  "message_tablename",
  "no_table_rotation",
  "data_dir"
]

/** `--lookback` default: a year of `last_connect` months beyond `--months`. */
const DEFAULT_LOOKBACK = 12

// ── months ───────────────────────────────────────────────────────────────────────────────────────

const monthText = (index: number): string => `${Math.floor(index / 12)}-${String((index % 12) + 1).padStart(2, "0")}`

/** The month index of a `{prefix}_{YYYY}_{MM}` table; undefined for the bare `{prefix}` table and others. */
const tableMonthIndex = (options: StorageOptions, name: string): number | undefined => {
  const match = /^_(\d{4})_(0[1-9]|1[0-2])$/.exec(name.slice(options.messageTablePrefix.length))
  if (!name.startsWith(options.messageTablePrefix) || match === null) return undefined
  return Number(match[1]) * 12 + Number(match[2]) - 1
}

/**
 * Monthly tables of `existing` whose month is more than `olderThan` months before the month of
 * `nowMs`, minus the active tables whatever `olderThan` is.
 */
export const tablesToDrop = (
  options: StorageOptions,
  existing: ReadonlyArray<string>,
  nowMs: number,
  olderThan: number
): ReadonlyArray<string> => {
  const cutoff = monthIndex(nowMs) - olderThan
  const active = new Set(activeTableNames(options, nowMs))
  return existing.filter((name) => {
    const index = tableMonthIndex(options, name)
    return index !== undefined && index < cutoff && !active.has(name)
  })
}

// ── commands ─────────────────────────────────────────────────────────────────────────────────────

const createTables: Command = {
  summary: "create the router and receipt tables and last, this and next month's message tables",
  usage: "create-tables",
  description: [
    "Creates what is missing of: the router table (with its AccessIndex on last_connect), the",
    "receipt table, last, this and next month's message tables (with TTL on expiry), or the single",
    "message table with no_table_rotation. Tables are created PAY_PER_REQUEST. Safe to repeat. The",
    "nodes do the same when they start and every hour, so this is needed only where they may not",
    "create tables (no dynamodb:CreateTable): then run it at least once a month, before the 1st."
  ],
  flags: [],
  mayCreate: true,
  prepare: () =>
    Effect.succeed((settings) =>
      Effect.gen(function*() {
        const storage = yield* Storage
        const options = storageOptionsOf(settings)
        const targets = activeTableNames(options, yield* Clock.currentTimeMillis)
        const statusBefore = yield* storage.checkTables
        const existed = (table: string) => statusBefore.find((t) => t.table === table)?.ok ?? false
        const receipts = receiptTableName(options)
        const before = new Set(yield* storage.listMessageTables)
        yield* storage.createTables(targets)
        yield* say(`router table ${options.routerTable}: ${existed(options.routerTable) ? "already there" : "created"}`)
        yield* say(`receipt table ${receipts}: ${existed(receipts) ? "already there" : "created"}`)
        for (const table of targets) yield* say(`message table ${table}: ${before.has(table) ? "already there" : "created"}`)
      })
    )
}

const listTables: Command = {
  summary: "list the router and receipt tables and the message tables, marking the active ones",
  usage: "list-tables",
  description: [
    "Says whether the router and receipt tables are there, and lists our message tables, oldest",
    "first, marking the active ones (the tables a user's",
    "current_month may name and still be served: last, this and next month's) and the current",
    "one, and says which active tables are missing. Changes nothing."
  ],
  flags: [],
  mayCreate: false,
  prepare: () =>
    Effect.succeed((settings) =>
      Effect.gen(function*() {
        const storage = yield* Storage
        const options = storageOptionsOf(settings)
        const now = yield* Clock.currentTimeMillis
        const status = yield* storage.checkTables
        const tables = yield* storage.listMessageTables
        const active = activeTableNames(options, now)
        const current = currentTableName(options, now)
        const tableLine = (what: string, name: string) => {
          const found = status.find((t) => t.table === name)
          return say(`${what} table ${name}: ${found?.ok === true ? "ok" : `missing or not ready (${found?.cause ?? "unknown"}; run create-tables)`}`)
        }
        yield* tableLine("router", options.routerTable)
        yield* tableLine("receipt", receiptTableName(options))
        yield* say(`message tables (${tables.length}, oldest first):`)
        for (const table of tables) {
          const marks = [...(active.includes(table) ? ["active"] : []), ...(table === current ? ["current"] : [])]
          yield* say(`  ${table}${marks.length > 0 ? `  (${marks.join(", ")})` : ""}`)
        }
        const missing = active.filter((table) => !tables.includes(table))
        if (missing.length > 0) yield* say(`missing: ${missing.join(", ")} (run create-tables)`)
      })
    )
}

const dropTables: Command = {
  summary: "drop message tables older than N months (dry run unless --yes)",
  usage: "drop-tables --older-than N [--yes]",
  description: [
    "Drops the monthly message tables whose month is more than N months before this month (with",
    "--older-than 3 in November: July and before). Active tables (last, this and next month) are",
    "never dropped, nor the bare single table of no_table_rotation. Users whose current_month names",
    "a dropped table are no longer served anyway (the endpoint answers 410 and forgets them); run",
    "drop-users first to remove their router records. Without --yes, lists what it would drop."
  ],
  flags: [
    ["--older-than N", "months, at least 1"],
    ["--yes", "really drop (default: dry run)"]
  ],
  mayCreate: false,
  prepare: (args) =>
    Effect.map(intFlag(args, "--older-than", 1), (olderThan): Run => (settings) =>
      Effect.gen(function*() {
        const storage = yield* Storage
        const options = storageOptionsOf(settings)
        const now = yield* Clock.currentTimeMillis
        const doomed = tablesToDrop(options, yield* storage.listMessageTables, now, olderThan)
        const what = `older than ${plural(olderThan, "month")} (before ${monthText(monthIndex(now) - olderThan)})`
        if (doomed.length === 0) return yield* say(`no message table is ${what}; nothing to drop`)
        yield* say(`message tables ${what}: ${doomed.length}`)
        if (!args.flags.has("--yes")) {
          for (const table of doomed) yield* say(`  would drop ${table}`)
          return yield* say(`dry run: nothing dropped; run again with --yes to drop ${doomed.length === 1 ? "it" : `these ${doomed.length} tables`}`)
        }
        for (const table of doomed) {
          yield* storage.dropMessageTable(table)
          yield* say(`  dropped ${table}`)
        }
        yield* say(`dropped ${plural(doomed.length, "table")}`)
      }))
}

const yyyymmText = (yyyymm: number | undefined): string =>
  yyyymm === undefined ? "?" : `${Math.floor(yyyymm / 100)}-${String(yyyymm % 100).padStart(2, "0")}`

const dropUsers: Command = {
  summary: "drop users not seen for N months, with their messages (dry run unless --yes)",
  usage: "drop-users --months N [--lookback M] [--yes]",
  description: [
    "Drops the router records of users whose last connection (last_connect, kept by the month) was",
    "N or more months before this month, and their channels and messages in their message table.",
    "It walks the AccessIndex on last_connect month by month, from N months ago back to N + M months",
    "ago, in small pages (the Storage layer paces it so a sweep does not eat the table's",
    "capacity), printing progress. A user that connects meanwhile is kept. Users last seen before",
    "the looked-back months are not found: use a larger --lookback once on an old deployment.",
    "Without --yes, only says which months it would sweep."
  ],
  flags: [
    ["--months N", "at least 1 (2, as Mozilla's autopush: clients unseen for 30-60 days)"],
    ["--lookback M", `further months to sweep before those N (default ${DEFAULT_LOOKBACK})`],
    ["--yes", "really drop (default: dry run)"]
  ],
  mayCreate: false,
  prepare: (args) =>
    Effect.gen(function*() {
      const months = yield* intFlag(args, "--months", 1)
      const lookback = yield* intFlag(args, "--lookback", 0, DEFAULT_LOOKBACK)
      return (): ReturnType<Run> =>
        Effect.gen(function*() {
          const storage = yield* Storage
          const now = yield* Clock.currentTimeMillis
          const swept = staleMonths(now, months, lookback)
          yield* say(
            `users last connected in ${yyyymmText(swept[0])} back to ${yyyymmText(swept.at(-1))} ` +
              `(${months} to ${months + lookback} months ago: ${plural(swept.length, "month")} of the last_connect index)`
          )
          if (!args.flags.has("--yes")) {
            const stale = yield* storage.dropStaleUsers({ monthsAgo: months, lookbackMonths: lookback, dryRun: true })
            return yield* say(`dry run: ${plural(stale, "user")} would be dropped, nothing was; run again with --yes to drop ${stale === 1 ? "it" : "them"}`)
          }
          let lastPrint = now
          const dropped = yield* storage.dropStaleUsers({
            monthsAgo: months,
            lookbackMonths: lookback,
            onProgress: (n) =>
              Effect.gen(function*() {
                const t = yield* Clock.currentTimeMillis
                if (t - lastPrint < 1_000) return
                lastPrint = t
                yield* say(`  dropped ${n} so far`)
              })
          })
          yield* say(`dropped ${plural(dropped, "user")}`)
        })
    })
}

export const COMMANDS: Readonly<Record<string, Command>> = {
  "create-tables": createTables,
  "list-tables": listTables,
  "drop-tables": dropTables,
  "drop-users": dropUsers,
  export: exportCommand,
  import: importCommand
}

const TOOL_FLAGS = {
  "--older-than": "value",
  "--months": "value",
  "--lookback": "value",
  "--yes": "boolean",
  "--out": "value",
  "--secrets": "boolean",
  "--in": "value",
  "--merge": "boolean",
  "--secrets-out": "value"
} as const

// ── help ─────────────────────────────────────────────────────────────────────────────────────────

export const maintenanceHelp = (): string =>
  [
    "Usage: maintenance COMMAND [options]",
    "",
    "Table chores, backups and moves for autopush storage: a DynamoDB endpoint when one is",
    "configured, otherwise the embedded data under data_dir (through the all-in-one while it runs).",
    "",
    "Commands:",
    ...Object.entries(COMMANDS).map(([name, command]) => usageRow(name, command.summary)),
    "",
    "Run `maintenance COMMAND --help` for a command's options. Exit status: 0 done, 1 failed",
    "(storage unreachable, data in use, ...), 2 bad arguments or configuration.",
    "",
    ...settingsHelp(STORAGE_OPTIONS)
  ].join("\n")

const commandHelp = (command: Command): string =>
  [
    `Usage: maintenance ${command.usage} [options]`,
    "",
    ...command.description,
    ...(command.flags.length > 0 ? ["", "Options:", ...command.flags.map(([flag, help]) => usageRow(flag, help))] : []),
    "",
    ...settingsHelp(STORAGE_OPTIONS)
  ].join("\n")

// ── the tool ─────────────────────────────────────────────────────────────────────────────────────

export const maintenance = (argv: ReadonlyArray<string>): Effect.Effect<void, ToolError> =>
  Effect.gen(function*() {
    const args = yield* splitArgs(argv, TOOL_FLAGS)
    const [name, ...extra] = args.positional
    const names = Object.keys(COMMANDS).join(", ")
    if (name === "help" || name === undefined) {
      const topic = name === "help" ? extra[0] : undefined
      const command = topic === undefined ? undefined : COMMANDS[topic]
      if (topic !== undefined && command === undefined) return yield* new UsageError({ message: `unknown command ${JSON.stringify(topic)}: expected one of ${names}` })
      if (topic !== undefined && command !== undefined) return yield* new HelpRequested({ text: commandHelp(command) })
      if (name === "help" || args.help) return yield* new HelpRequested({ text: maintenanceHelp() })
      return yield* new UsageError({ message: `a command is required: one of ${names}` })
    }
    const command = COMMANDS[name]
    if (command === undefined) return yield* new UsageError({ message: `unknown command ${JSON.stringify(name)}: expected one of ${names}` })
    if (args.help) return yield* new HelpRequested({ text: commandHelp(command) })
    if (extra.length > 0) return yield* new UsageError({ message: `${name}: unexpected argument ${JSON.stringify(extra[0])}` })
    const known = new Set(command.flags.map(([flag]) => flag.split(" ")[0]))
    for (const flag of args.flags.keys()) {
      if (!known.has(flag)) return yield* new UsageError({ message: `${name} takes no ${flag}` })
    }
    // Arguments first (exit 2 before anything is read), then settings, then storage.
    const run = yield* command.prepare(args)
    const settings = yield* toolSettings(args.config)
    yield* say(`storage: ${storageDescription(settings)}`)
    yield* run(settings).pipe(
      Effect.provide(toolTablesLayer(settings, command.mayCreate)),
      Effect.catchTag("StorageError", (error) => Effect.fail(new ToolFailure({ message: describeStorageError(error, settings) })))
    )
  })
