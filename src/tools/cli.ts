/**
 * What the operator tools (`maintenance`, `endpoint-diagnostic`) share: splitting their own
 * arguments from the configuration flags, reading settings from the same sources as the nodes,
 * help lines for the options they read (from the option table), and one exit-code policy:
 *
 * - 0: done (`--help` too);
 * - 1: the tool ran but failed: storage unreachable or failing, embedded data locked, an endpoint
 *   that does not decrypt or whose user is gone (`ToolFailure`, `StorageError`);
 * - 2: bad arguments or configuration (`UsageError`, `ConfigError`).
 */
import { homedir } from "node:os"
import * as NodeRuntime from "@effect/platform-node/NodeRuntime"
import * as Console from "effect/Console"
import * as Data from "effect/Data"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as Schema from "effect/Schema"
import { type ConfigError, HelpRequested, isConfigFlag, loadSettings, type Settings } from "../config/index.ts"
import { defaultSpelling, envNamesOf, flagOf, integer, isOptionName, type OptionDef, type OptionName, options, secretNote } from "../config/options.ts"
import { stopTeardown } from "../platform/teardown.ts"
import { failureText, type StorageError } from "../storage/Storage.ts"

/** Bad arguments: printed with a pointer to `--help`, exit 2. */
export class UsageError extends Data.TaggedError("UsageError")<{ readonly message: string }> {}

/** The tool could not do its job: printed, exit 1. */
export class ToolFailure extends Data.TaggedError("ToolFailure")<{ readonly message: string }> {}

/** Nothing failed, but the answer is "no" (an endpoint that would not accept messages): exit 1, nothing printed. */
export class NegativeResult extends Data.TaggedError("NegativeResult")<{}> {}

export type ToolError = UsageError | ToolFailure | NegativeResult | ConfigError | HelpRequested | StorageError

// ── arguments ────────────────────────────────────────────────────────────────────────────────────

/** A tool's own flags: `value` flags take the next argument (or `=value`), `boolean` ones none. */
export type ToolFlags = Readonly<Record<string, "value" | "boolean">>

export interface SplitArgs {
  /** Arguments that are not flags, in order. */
  readonly positional: ReadonlyArray<string>
  /** The tool's own flags that were given (boolean ones as "true"). */
  readonly flags: ReadonlyMap<string, string>
  /** Everything else, for `loadSettings` (which reports unknown flags). */
  readonly config: ReadonlyArray<string>
  readonly help: boolean
}

/**
 * Whether a configuration flag (`--storage-endpoint`, `--config-shared`, …) takes a separate
 * value; undefined when it is no configuration flag at all.
 */
const configFlagTakesValue = (flag: string): boolean | undefined => {
  const key = flag.slice(2).toLowerCase().replaceAll("-", "_")
  if (/^config_(shared|connection|endpoint)$/.test(key)) return true
  return isOptionName(key) ? (options[key] as OptionDef).kind.metavar !== "" : undefined
}

/**
 * Separates positional arguments, the tool's flags and configuration flags. A flag's value given
 * apart is the next argument unless that is itself a flag: a value may start with "--" (a
 * Fernet key in 4,096 does).
 */
export const splitArgs = (argv: ReadonlyArray<string>, toolFlags: ToolFlags): Effect.Effect<SplitArgs, UsageError> =>
  Effect.gen(function*() {
    const isFlag = (arg: string): boolean =>
      arg === "--" || arg === "--help" || toolFlags[arg.split("=", 1)[0] ?? arg] !== undefined || isConfigFlag(arg)
    const positional: Array<string> = []
    const flags = new Map<string, string>()
    const config: Array<string> = []
    let help = false
    for (let i = 0; i < argv.length; i++) {
      const arg = argv[i] ?? ""
      if (arg === "--help" || arg === "-h") {
        help = true
        continue
      }
      if (!arg.startsWith("--") || arg === "--") {
        if (arg !== "--") positional.push(arg)
        continue
      }
      const eq = arg.indexOf("=")
      const flag = eq < 0 ? arg : arg.slice(0, eq)
      const inline = eq < 0 ? undefined : arg.slice(eq + 1)
      const kind = toolFlags[flag]
      if (kind === "boolean") {
        if (inline !== undefined) return yield* new UsageError({ message: `${flag} takes no value` })
        flags.set(flag, "true")
      } else if (kind === "value") {
        const value = inline ?? argv[i + 1]
        if (value === undefined || (inline === undefined && isFlag(value))) {
          return yield* new UsageError({ message: `${flag} needs a value` })
        }
        if (inline === undefined) i++
        flags.set(flag, value)
      } else {
        const takesValue = configFlagTakesValue(flag)
        if (takesValue === undefined) return yield* new UsageError({ message: `unknown flag ${flag}` })
        config.push(arg)
        const next = argv[i + 1]
        if (inline === undefined && takesValue && next !== undefined && !isFlag(next)) {
          config.push(next)
          i++
        }
      }
    }
    return { positional, flags, config, help }
  })

/** One line of a tool's report, on stdout. */
export const say = (line: string) => Console.log(line)

/** `1 table`, `3 tables`. */
export const plural = (n: number, word: string): string => `${n} ${word}${n === 1 ? "" : "s"}`

/** A whole number of at least `minimum`, decoded with the option table's integer kind. */
export const intFlag = (args: SplitArgs, flag: string, minimum: number, fallback?: number): Effect.Effect<number, UsageError> => {
  const raw = args.flags.get(flag)
  if (raw === undefined) {
    return fallback === undefined ? Effect.fail(new UsageError({ message: `${flag} N is required` })) : Effect.succeed(fallback)
  }
  const kind = integer(minimum)
  return Option.match(Schema.decodeUnknownOption(kind.codec)(raw.trim()), {
    onNone: () => Effect.fail(new UsageError({ message: `${flag}: ${JSON.stringify(raw)} is not ${kind.expected}` })),
    onSome: Effect.succeed
  })
}

// ── settings ─────────────────────────────────────────────────────────────────────────────────────

/**
 * Settings as the all-in-one reads them: all three ini files, `AUTOPUSH__*`, `AUTOCONNECT__*`,
 * `AUTOEND__*` and the plain aliases (`CRYPTO_KEY`, `AWS_ENDPOINT_URL_DYNAMODB`, …), then flags. A
 * tool runs beside either kind of node, so it reads what both read.
 */
export const toolSettings = (configArgs: ReadonlyArray<string>): Effect.Effect<Settings, ConfigError | HelpRequested> =>
  loadSettings({ role: "autopush", argv: configArgs, env: process.env, cwd: process.cwd(), home: homedir() })

/** One `--help` line: the flag in a column of 30, its text after (on the next line if the flag is long). */
export const usageRow = (left: string, right: string): string =>
  `  ${left.padEnd(30)}${left.length >= 30 ? "\n" + " ".repeat(32) : ""}${right}`

/** `--help` lines for some options of the table: flag, description, default and environment names. */
const optionHelp = (names: ReadonlyArray<OptionName>): ReadonlyArray<string> =>
  names.flatMap((name) => {
    const def: OptionDef = options[name]
    const flag = def.kind.metavar === "" ? `${flagOf(name)}[=BOOL]` : `${flagOf(name)} ${def.kind.metavar}`
    return [
      usageRow(flag, `${def.description}${def.secret ? secretNote(name) : ""}`),
      usageRow("", `default: ${def.defaultText ?? (defaultSpelling(name) || "empty")}; env: ${envNamesOf(name).join(", ")}`)
    ]
  })

/** The part of every tool's help about where settings come from. */
export const settingsHelp = (names: ReadonlyArray<OptionName>): ReadonlyArray<string> => [
  "Settings are read as the nodes read them (lowest to highest precedence): the ini files",
  "autopush_shared.ini, autopush_connection.ini and autopush_endpoint.ini (from /etc, ~/.NAME,",
  "./.NAME, ./configs/NAME, or --config-shared/--config-connection/--config-endpoint PATH), then",
  "AUTOPUSH__*, AUTOCONNECT__* and AUTOEND__* environment variables, then flags. Any option of",
  "the nodes is accepted; these are the ones this tool uses:",
  "",
  ...optionHelp(names)
]

// ── failures and running ─────────────────────────────────────────────────────────────────────────

/** What went wrong with storage, with a hint for the usual causes. */
export const describeStorageError = (error: StorageError, settings?: Settings): string => {
  const where = settings?.storageEndpoint ?? (settings !== undefined ? "AWS DynamoDB" : "storage")
  const hint = error.reason._tag === "MissingTable"
    ? " (a table is missing: run `maintenance create-tables`)"
    : error.reason._tag === "Unavailable"
    ? ` (cannot reach ${where})`
    : error.reason._tag === "Denied"
    ? settings?.dbDsn !== undefined ? " (check the user name and password of option db_dsn)" : " (check the AWS credentials and IAM permissions: docs/aws.md)"
    : ""
  return `storage error in ${error.operation}: ${failureText(error)}${hint}`
}

/**
 * Run a tool's program as the process: `--help` text to stdout (exit 0), usage and configuration
 * errors to stderr (exit 2), failures to stderr (exit 1).
 */
export const runTool = (name: string, program: Effect.Effect<void, ToolError>): void => {
  const fail = (code: number, message?: string) =>
    Effect.gen(function*() {
      if (message !== undefined) yield* Console.error(`${name}: ${message}`)
      process.exitCode = code
    })
  const main = program.pipe(
    Effect.catchTags({
      HelpRequested: (e) => Console.log(e.text.trimEnd()),
      UsageError: (e) => fail(2, `${e.message} (see ${name} --help)`),
      ConfigError: (e) => fail(2, `configuration error: ${e.message}`),
      ToolFailure: (e) => fail(1, e.message),
      NegativeResult: () => fail(1),
      StorageError: (e) => fail(1, describeStorageError(e))
    })
  )
  NodeRuntime.runMain(main, { teardown: stopTeardown })
}
