/**
 * `maintenance export` and `maintenance import`: the whole store as one JSON Lines file, to back it
 * up or to move it (a laptop's embedded data to DynamoDB, one store to another).
 *
 * The file is a header line, one line per item, then an end line with the counts (written last, so
 * that a file cut short is told apart from a whole one):
 *
 *     {"format":"autopush-export","version":1,"exported_at":"…","router_table":"router",
 *      "message_tablename":"message","no_table_rotation":false,"message_tables":[…],"secrets"?:{…}}
 *     {"table":"router","name":"router","item":{"uaid":{"S":"…"},…}}
 *     {"table":"messages","name":"message_2026_11","item":{…}}
 *     {"end":true,"items":{"router":3,"message_2026_11":9}}
 *
 * Items are the DynamoDB AttributeValue maps the tables hold. Import puts the file's tables under
 * the configured names: the router table under router_tablename, each message table under
 * message_tablename with the same `_{YYYY}_{MM}` suffix (users' current_month follows).
 */
import { createReadStream, existsSync } from "node:fs"
import { resolve } from "node:path"
import { createInterface } from "node:readline"
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as Result from "effect/Result"
import * as Schema from "effect/Schema"
import * as Stream from "effect/Stream"
import { requireSecrets, type Settings } from "../config/index.ts"
import { TableCopy } from "../storage/tableCopy.ts"
import { type Item, S } from "../storage/items.ts"
import { Storage } from "../storage/Storage.ts"
import { isMessageTable, type StorageOptions } from "../storage/tables.ts"
import { plural, say, type SplitArgs, ToolFailure, UsageError } from "./cli.ts"
import { openPrivateTemporary } from "../platform/privateFile.ts"
import type { Command, Run } from "./command.ts"
import { embeddedSecretsFile, type EmbeddedSecrets, readEmbeddedSecrets, storageOptionsOf, writeEmbeddedSecrets } from "./storage.ts"

// ── the file ─────────────────────────────────────────────────────────────────────────────────────

const EXPORT_FORMAT = "autopush-export"
const EXPORT_VERSION = 1
/** Batches written at once by an import (each up to 25 items): a few, not the table's whole capacity. */
const IMPORT_CONCURRENCY = 4
/** Items per BatchWriteItem request: its most. */
const BATCH = 25

const Keys = Schema.Array(Schema.NonEmptyString).check(Schema.isMinLength(1))
const Secrets = Schema.Struct({ crypto_key: Keys, auth_keys: Keys })

const Header = Schema.Struct({
  format: Schema.Literal(EXPORT_FORMAT),
  version: Schema.Literal(EXPORT_VERSION),
  exported_at: Schema.String,
  router_table: Schema.NonEmptyString,
  message_tablename: Schema.NonEmptyString,
  no_table_rotation: Schema.Boolean,
  message_tables: Schema.Array(Schema.String),
  secrets: Schema.optionalKey(Secrets)
})
type ExportHeader = typeof Header.Type

const ItemLine = Schema.Struct({
  table: Schema.Literals(["router", "messages"]),
  name: Schema.String,
  item: Schema.Record(Schema.String, Schema.Record(Schema.String, Schema.Unknown))
})
/** An item line; its attribute values go to the server as they are (it judges them). */
interface ItemLine {
  readonly table: "router" | "messages"
  readonly name: string
  readonly item: Item
}

const EndLine = Schema.Struct({ end: Schema.Literal(true), items: Schema.Record(Schema.String, Schema.Int) })

type Line =
  | { readonly _tag: "header"; readonly header: ExportHeader }
  | { readonly _tag: "item"; readonly line: ItemLine }
  | { readonly _tag: "end"; readonly items: Readonly<Record<string, number>> }

const decodeHeader = Schema.decodeUnknownOption(Header)
const decodeItem = Schema.decodeUnknownOption(ItemLine)
const decodeEnd = Schema.decodeUnknownOption(EndLine)

const sourceOptions = (header: ExportHeader): StorageOptions => ({
  routerTable: header.router_table,
  messageTablePrefix: header.message_tablename,
  noTableRotation: header.no_table_rotation
})

/** What is wrong with the header's own content, if anything. */
const headerProblem = (header: ExportHeader): string | undefined => {
  const foreign = header.message_tables.find((name) => !isMessageTable(sourceOptions(header), name) || name === header.router_table)
  return foreign === undefined ? undefined : `message table ${JSON.stringify(foreign)} is not named ${header.message_tablename}_YYYY_MM`
}

/**
 * One line of the file (number `n`, from 1), read against the header (undefined on line 1): what
 * it is, or why it is not a line of an export.
 */
const readLine = (text: string, n: number, header: ExportHeader | undefined): Result.Result<Line, string> => {
  let json: unknown
  try {
    json = JSON.parse(text)
  } catch (error) {
    return Result.fail(`not JSON (${(error as Error).message})`)
  }
  const record = typeof json === "object" && json !== null ? json as Record<string, unknown> : {}
  if (header === undefined) {
    if (n !== 1 || record["format"] !== EXPORT_FORMAT) return Result.fail(`not an export of this tool: its first line has no "format":"${EXPORT_FORMAT}"`)
    if (record["version"] !== EXPORT_VERSION) {
      return Result.fail(`format version ${JSON.stringify(record["version"])}: this tool reads version ${EXPORT_VERSION} (use the version of autopush-ts that made the file)`)
    }
    return Option.match(decodeHeader(json), {
      onNone: () => Result.fail("a header without its table names, time or secrets in the expected shape"),
      onSome: (decoded) => {
        const problem = headerProblem(decoded)
        return problem === undefined ? Result.succeed({ _tag: "header", header: decoded }) : Result.fail(problem)
      }
    })
  }
  if ("end" in record) {
    return Option.match(decodeEnd(json), {
      onNone: () => Result.fail(`an end line without its counts ({"end":true,"items":{"<table>":<count>,…}})`),
      onSome: ({ items }) => Result.succeed({ _tag: "end", items })
    })
  }
  return Option.match(decodeItem(json), {
    onNone: () => Result.fail(`not an item ({"table":"router"|"messages","name":"<table>","item":{<attribute values>}})`),
    onSome: (line): Result.Result<Line, string> => {
      const known = line.table === "router" ? line.name === header.router_table : header.message_tables.includes(line.name)
      if (!known) return Result.fail(`an item of ${line.table} table ${JSON.stringify(line.name)}, which the header does not list`)
      const keys = line.table === "router" ? ["uaid"] : ["uaid", "chidmessageid"]
      const missing = keys.find((key) => typeof line.item[key]?.["S"] !== "string")
      if (missing !== undefined) return Result.fail(`an item without its key attribute ${missing} (a string)`)
      return Result.succeed({ _tag: "item", line: { ...line, item: line.item as unknown as Item } })
    }
  })
}

/** The file's lines with their numbers; a file that cannot be read is a `ToolFailure`. */
const fileLines = (path: string): Stream.Stream<readonly [string, number], ToolFailure> =>
  Stream.unwrap(
    Effect.map(
      Effect.acquireRelease(Effect.sync(() => createReadStream(path)), (input) => Effect.sync(() => input.destroy())),
      (input) =>
        Stream.fromAsyncIterable(
          createInterface({ input, crlfDelay: Infinity }),
          (cause) => new ToolFailure({ message: `cannot read ${path}: ${(cause as Error).message}` })
        ).pipe(Stream.map((text, i) => [text, i + 1] as const))
    )
  )

interface CheckedFile {
  readonly header: ExportHeader
  /** Items per table of the file, as counted (and as its end line says). */
  readonly items: ReadonlyMap<string, number>
}

/**
 * Read the whole file and check every line, writing nothing: a bad line fails naming its number,
 * a file without its end line (cut short) or whose counts disagree fails too.
 */
const checkExportFile = Effect.fn("checkExportFile")(function*(path: string) {
  const bad = (n: number, why: string) => new ToolFailure({ message: `${path} line ${n}: ${why} (nothing was imported)` })
  let header: ExportHeader | undefined
  let end: Readonly<Record<string, number>> | undefined
  let last = 0
  const items = new Map<string, number>()
  yield* fileLines(path).pipe(
    Stream.runForEach(([text, n]) =>
      Effect.suspend(() => {
        last = n
        if (end !== undefined) return Effect.fail(bad(n, "a line after the end line"))
        const line = readLine(text, n, header)
        if (Result.isFailure(line)) return Effect.fail(bad(n, line.failure))
        const read = line.success
        if (read._tag === "header") header = read.header
        else if (read._tag === "end") end = read.items
        else items.set(read.line.name, (items.get(read.line.name) ?? 0) + 1)
        return Effect.void
      })
    )
  )
  if (header === undefined) return yield* new ToolFailure({ message: `${path} is empty: not an export (nothing was imported)` })
  if (end === undefined) {
    return yield* new ToolFailure({ message: `${path} ends at line ${last} without its end line: the file is cut short (export it again; nothing was imported)` })
  }
  const counts = end
  const wrong = [header.router_table, ...header.message_tables, ...Object.keys(counts)].find((table) =>
    (counts[table] ?? 0) !== (items.get(table) ?? 0)
  )
  if (wrong !== undefined) {
    return yield* new ToolFailure({
      message: `${path} line ${last}: the end line counts ${counts[wrong] ?? 0} items of table ${wrong}, the file holds ${items.get(wrong) ?? 0} (nothing was imported)`
    })
  }
  return { header, items } satisfies CheckedFile
})

// ── writing files ────────────────────────────────────────────────────────────────────────────────

const fsFailure = (path: string) => (cause: unknown) => new ToolFailure({ message: `cannot write ${path}: ${(cause as Error).message}` })

/**
 * Write `path` (mode 0600) a piece at a time through a private temporary file (random name, created
 * exclusively: `privateFile.ts`) renamed over it at the end: it is either the whole new content or
 * the old.
 */
export const writeAtomically = <A, E, R>(
  path: string,
  body: (write: (text: string) => Effect.Effect<void, ToolFailure>) => Effect.Effect<A, E, R>
): Effect.Effect<A, E | ToolFailure, R> => {
  const attempt = <B>(f: () => Promise<B>) => Effect.tryPromise({ try: f, catch: fsFailure(path) })
  return Effect.acquireUseRelease(
    attempt(() => openPrivateTemporary(path)),
    (temporary) =>
      body((text) => attempt(() => temporary.handle.appendFile(text))).pipe(
        Effect.tap(() => attempt(() => temporary.handle.sync())),
        Effect.tap(() => attempt(() => temporary.commit()))
      ),
    (temporary, exit) => exit._tag === "Success" ? Effect.void : Effect.promise(() => temporary.discard())
  )
}

// ── export ───────────────────────────────────────────────────────────────────────────────────────

/**
 * The keys the server runs with, picked as the all-in-one picks them: the configured ones, else
 * (embedded storage) those it generated in data_dir/secrets.json.
 */
const serverSecrets = Effect.fnUntraced(function*(settings: Settings) {
  const path = embeddedSecretsFile(settings)
  const stored = settings.storageEndpoint === undefined
    ? yield* readEmbeddedSecrets(path).pipe(Effect.mapError((error) => new ToolFailure({ message: `--secrets: ${error.message}` })))
    : undefined
  const secrets: EmbeddedSecrets = {
    crypto_key: settings.cryptoKey.length > 0 ? settings.cryptoKey : stored?.crypto_key ?? [],
    auth_keys: settings.authKeys.length > 0 ? settings.authKeys : stored?.auth_keys ?? []
  }
  yield* requireSecrets({ ...settings, cryptoKey: secrets.crypto_key, authKeys: secrets.auth_keys }, ["crypto_key", "auth_keys"]).pipe(
    Effect.mapError((error) =>
      new ToolFailure({ message: `--secrets: ${error.message}${settings.storageEndpoint === undefined ? ` (${path} holds none)` : ""}` })
    )
  )
  return secrets
})

const runExport = (out: string, withSecrets: boolean): Run => (settings) =>
  Effect.gen(function*() {
    const storage = yield* Storage
    const tables = yield* TableCopy
    const options = storageOptionsOf(settings)
    const secrets = withSecrets ? yield* serverSecrets(settings) : undefined
    const router = (yield* storage.checkTables).find((t) => t.table === options.routerTable)
    if (router?.ok !== true) {
      return yield* new ToolFailure({
        message: `router table ${options.routerTable}: ${router?.cause ?? "not found"}: nothing to export (is router_tablename right?)`
      })
    }
    const messageTables = yield* storage.listMessageTables
    const header: ExportHeader = {
      format: EXPORT_FORMAT,
      version: EXPORT_VERSION,
      exported_at: new Date(yield* Clock.currentTimeMillis).toISOString(),
      router_table: options.routerTable,
      message_tablename: options.messageTablePrefix,
      no_table_rotation: options.noTableRotation,
      message_tables: messageTables,
      ...(secrets !== undefined ? { secrets } : {})
    }
    const sources = [["router", options.routerTable] as const, ...messageTables.map((name) => ["messages", name] as const)]
    const counts = yield* writeAtomically(out, (write) =>
      Effect.gen(function*() {
        yield* write(`${JSON.stringify(header)}\n`)
        const items: Record<string, number> = {}
        for (const [table, name] of sources) {
          let count = 0
          yield* tables.scan(name).pipe(
            Stream.runForEachArray((page) => {
              count += page.length
              return write(page.map((item) => `${JSON.stringify({ table, name, item })}\n`).join(""))
            })
          )
          items[name] = count
          yield* say(`${table === "router" ? "router" : "message"} table ${name}: ${plural(count, "item")}`)
        }
        yield* write(`${JSON.stringify({ end: true, items })}\n`)
        return items
      }))
    const total = Object.values(counts).reduce((a, b) => a + b, 0)
    yield* say(`exported ${plural(total, "item")} of ${plural(sources.length, "table")} to ${out} (mode 0600)`)
    if (secrets !== undefined) {
      yield* say(
        `WARNING: ${out} holds the secrets of the server (crypto_key and auth_keys): with them anyone can make ` +
          "endpoint URLs that work and bridge registration secrets. Keep it as private as the keys themselves."
      )
    } else {
      yield* say(
        "secrets: not included. Keep a copy of the keys as well: " +
          (settings.storageEndpoint === undefined ? `${embeddedSecretsFile(settings)} (or the configured crypto_key and auth_keys)` : "the configured crypto_key and auth_keys") +
          "; without the same crypto_key every endpoint URL changes. Or export with --secrets."
      )
    }
  })

export const exportCommand: Command = {
  summary: "write the router and message tables (and optionally the keys) to a file",
  usage: "export --out FILE [--secrets]",
  description: [
    "Writes every item of the router table (users and the broadcasts) and of every message table",
    "to FILE, as JSON Lines: a header (time, table names), one line per item, an end line with the",
    "counts. Tables are read by Scan in small pages, so it can run beside a running server; the",
    "file is written to a temporary file first and renamed (mode 0600). With --secrets the header",
    "also holds the keys the server runs with (crypto_key and auth_keys: configured, or",
    "data_dir/secrets.json): every endpoint URL is made with crypto_key. Read back with import."
  ],
  flags: [
    ["--out FILE", "the file to write (replaced if it exists)"],
    ["--secrets", "include crypto_key and auth_keys: the file then needs the care of the keys"]
  ],
  mayCreate: false,
  prepare: (args) => {
    const out = args.flags.get("--out")
    if (out === undefined) return Effect.fail(new UsageError({ message: "--out FILE is required" }))
    return Effect.succeed(runExport(resolve(out), args.flags.has("--secrets")))
  }
}

// ── import ───────────────────────────────────────────────────────────────────────────────────────

/** Where the file's tables go: the configured router table, and message tables by their month. */
const importedName = (header: ExportHeader, target: StorageOptions) => (name: string): string =>
  name === header.router_table ? target.routerTable : `${target.messageTablePrefix}${name.slice(header.message_tablename.length)}`

/** An item as the target holds it: a user's current_month names its message table under the target's name. */
const importedItem = (header: ExportHeader, target: StorageOptions, { table, item }: ItemLine): Item => {
  const month = item["current_month"]?.S
  if (table !== "router" || month === undefined || !isMessageTable(sourceOptions(header), month)) return item
  return { ...item, current_month: S(importedName(header, target)(month)) }
}

const runImport = (path: string, file: CheckedFile, merge: boolean, secretsOut: string | undefined): Run => (settings) =>
  Effect.gen(function*() {
    const storage = yield* Storage
    const tables = yield* TableCopy
    const { header } = file
    const target = storageOptionsOf(settings)
    const nameOf = importedName(header, target)
    const total = [...file.items.values()].reduce((a, b) => a + b, 0)
    yield* say(`file ${path}: exported ${header.exported_at}, ${plural(total, "item")}${header.secrets !== undefined ? ", with secrets" : ""}`)
    if (header.no_table_rotation !== target.noTableRotation) {
      return yield* new ToolFailure({
        message: `the file was exported ${header.no_table_rotation ? "with" : "without"} no_table_rotation and this store is configured ` +
          `${target.noTableRotation ? "with" : "without"} it: the nodes would not serve the imported users; import with the same no_table_rotation`
      })
    }
    for (const name of [header.router_table, ...header.message_tables]) {
      const kind = name === header.router_table ? "router" : "message"
      yield* say(`  ${kind} table ${name} → ${nameOf(name)}: ${plural(file.items.get(name) ?? 0, "item")}`)
    }
    if (!merge) {
      const users = yield* tables.countUsers(target.routerTable)
      if (users > 0) {
        return yield* new ToolFailure({
          message: `router table ${target.routerTable} already holds ${plural(users, "user")}: nothing was imported. Run again with --merge ` +
            "to add the file's items to them (items with the same key are replaced; the same file imported twice changes nothing)"
        })
      }
    }
    yield* storage.createTables(header.message_tables.map(nameOf))
    const written = new Map<string, number>()
    yield* fileLines(path).pipe(
      Stream.mapEffect(([text, n]) => {
        const line = readLine(text, n, n === 1 ? undefined : header)
        return Result.isFailure(line) ? Effect.fail(new ToolFailure({ message: `${path} line ${n}: ${line.failure} (the file changed while it was imported)` })) : Effect.succeed(line.success)
      }),
      Stream.filter((line) => line._tag === "item"),
      Stream.map(({ line }) => [nameOf(line.name), importedItem(header, target, line)] as const),
      Stream.grouped(BATCH),
      Stream.mapEffect((batch) =>
        // A batch holds one table's items, or two where the file goes on to the next table.
        Effect.forEach(new Set(batch.map(([table]) => table)), (table) => {
          const items = batch.flatMap(([t, item]) => t === table ? [item] : [])
          return tables.putItems(table, items).pipe(Effect.tap(() => Effect.sync(() => written.set(table, (written.get(table) ?? 0) + items.length))))
        }, { discard: true }), { concurrency: IMPORT_CONCURRENCY }),
      Stream.runDrain
    )
    const imported = [...written.values()].reduce((a, b) => a + b, 0)
    yield* say(`imported ${plural(imported, "item")}${imported > 0 ? `: ${[...written].map(([table, n]) => `${n} into ${table}`).join(", ")}` : ""}`)
    if (secretsOut !== undefined && header.secrets !== undefined) {
      const secrets = header.secrets
      // As the all-in-one keeps them (prepare refused a file that exists).
      yield* writeEmbeddedSecrets(secretsOut, secrets).pipe(Effect.mapError((error) => new ToolFailure({ message: `--secrets-out: ${error.message}` })))
      yield* say(`secrets written to ${secretsOut} (mode 0600): crypto_key and auth_keys of the exporting server`)
    } else if (header.secrets !== undefined) {
      yield* say("secrets: the file holds the keys of the exporting server; write them out with --secrets-out PATH, or configure the nodes' crypto_key and auth_keys with them")
    } else {
      yield* say("secrets: the file holds none; the nodes need the crypto_key of the exporting server, or every endpoint URL changes")
    }
  })

export const importCommand: Command = {
  summary: "read a file written by export into this store (refuses a store with users unless --merge)",
  usage: "import --in FILE [--merge] [--secrets-out PATH]",
  description: [
    "Reads a file written by export into the configured store. The whole file is checked first (a",
    "bad line fails naming its number, and nothing is written). Missing tables are created; the",
    "file's router table goes into router_tablename and each message table into message_tablename",
    "with the same _YYYY_MM (users' current_month follows). Items are written with BatchWriteItem,",
    "25 at a time, replacing items with the same key, so the same import can run again. A store",
    "whose router table holds users already is refused unless --merge. With --secrets-out, the keys",
    "of a file exported with --secrets are written to PATH as a secrets.json (mode 0600; never over",
    "an existing file)."
  ],
  flags: [
    ["--in FILE", "the file export wrote"],
    ["--merge", "import into a router table that holds users already"],
    ["--secrets-out PATH", "write the file's keys to PATH (a new file), as data_dir/secrets.json"]
  ],
  mayCreate: true,
  prepare: (args: SplitArgs) =>
    Effect.gen(function*() {
      const input = args.flags.get("--in")
      if (input === undefined) return yield* new UsageError({ message: "--in FILE is required" })
      const secretsFlag = args.flags.get("--secrets-out")
      const secretsOut = secretsFlag === undefined ? undefined : resolve(secretsFlag)
      if (secretsOut !== undefined && existsSync(secretsOut)) {
        return yield* new ToolFailure({ message: `--secrets-out: ${secretsOut} exists; it is never overwritten (move it away, or name another file)` })
      }
      const path = resolve(input)
      const file = yield* checkExportFile(path)
      if (secretsOut !== undefined && file.header.secrets === undefined) {
        return yield* new ToolFailure({ message: `--secrets-out: ${path} holds no secrets (it was exported without --secrets); nothing was imported` })
      }
      return runImport(path, file, args.flags.has("--merge"), secretsOut)
    })
}
