/**
 * Loading settings: defaults < ini files < environment < flags, every value decoded by the kind of
 * its option (options.ts) and every error naming the option and where the value came from.
 *
 * Within one level, the all-in-one `autopush` reads both the connection and the endpoint sources
 * (their ini files, `AUTOCONNECT__*` and `AUTOEND__*`); a shared option set in both to different
 * values is an error rather than a silent winner.
 */
import { readFileSync } from "node:fs"
import { join, resolve } from "node:path"
import * as Data from "effect/Data"
import * as Duration from "effect/Duration"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as Schema from "effect/Schema"
import { helpText } from "./docs.ts"
import {
  camel,
  secretFileVar,
  envPrefix,
  iniFile,
  isOptionName,
  optionNames,
  options,
  prefixScope,
  roleScopes,
  scopeNames,
  unquote
} from "./options.ts"
import type {
  OptionDef,
  OptionName,
  OptionValues,
  Role,
  Scope,
  RequiredSecret,
  Settings
} from "./options.ts"

export class ConfigError extends Data.TaggedError("ConfigError")<{ readonly message: string }> {}

/** `--help` (or `-h`) was given: print `text` and exit 0. */
export class HelpRequested extends Data.TaggedError("HelpRequested")<{ readonly text: string }> {}

export interface LoadInput {
  readonly role: Role
  readonly argv: ReadonlyArray<string>
  readonly env: Readonly<Record<string, string | undefined>>
  readonly cwd: string
  readonly home: string
  /** Directory of the `/etc/NAME` lookups; `/etc` unless told. */
  readonly etcDir?: string
  /** Reads a text file, `undefined` when it does not exist; node:fs unless told. */
  readonly readFile?: (path: string) => string | undefined
}

interface Entry {
  readonly value: unknown
  readonly source: string
}
/** The options one source (an ini file, the environment, the flags) sets, with where each came from. */
type Source = Map<OptionName, Entry>

const fail = (message: string) => Effect.fail(new ConfigError({ message }))

const defOf = (name: OptionName): OptionDef => options[name]

/** The value as it would be configured; how two values are compared. */
const spell = (name: OptionName, value: unknown): string =>
  value === undefined ? "" : Schema.encodeSync(defOf(name).kind.codec as Schema.Codec<unknown, string>)(value)

const shown = (name: OptionName, raw: string): string => (defOf(name).secret ? "(secret value)" : JSON.stringify(raw))

/** Decodes one raw value; an empty value means the option's default. */
const decode = (name: OptionName, input: string, source: string): Effect.Effect<Entry, ConfigError> => {
  const def = defOf(name)
  const raw = unquote(input.trim())
  if (raw === "") return Effect.succeed({ value: def.default(), source })
  return Option.match(Schema.decodeUnknownOption(def.kind.codec)(raw), {
    onNone: () => fail(`${name}: ${shown(name, raw)} is not ${def.kind.expected} (from ${source})`),
    onSome: (value) => Effect.succeed({ value, source })
  })
}

// ---------------------------------------------------------------------------------------------
// Ini files

const readIfExists = (path: string): string | undefined => {
  try {
    return readFileSync(path, "utf8")
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code
    if (code === "ENOENT" || code === "ENOTDIR") return undefined
    throw error
  }
}

/** Where a file is looked up when no `--config-*` flag names it, in reading order. */
const iniLocations = (scope: Scope, where: { cwd: string; home: string; etcDir?: string }): ReadonlyArray<string> => {
  const name = iniFile[scope]
  return [
    ...new Set([
      join(where.etcDir ?? "/etc", name),
      join(where.home, `.${name}`),
      join(where.cwd, `.${name}`),
      join(where.cwd, "configs", name)
    ])
  ]
}

/** Parses one ini file into `layer` (later lines win). */
const parseIni = Effect.fnUntraced(function*(scope: Scope, path: string, text: string, layer: Source) {
  for (const [index, line] of text.split(/\r?\n/).entries()) {
    const trimmed = line.trim()
    if (trimmed === "" || /^[#;]/.test(trimmed) || /^\[.*\]$/.test(trimmed)) continue
    const source = `${path} line ${index + 1}`
    const sep = trimmed.search(/[=:]/)
    const key = (sep < 0 ? trimmed : trimmed.slice(0, sep)).trim().toLowerCase().replaceAll("-", "_")
    if (!isOptionName(key)) return yield* fail(`unknown option ${JSON.stringify(key)} (from ${source})`)
    const def = defOf(key)
    if (def.scope !== "shared" && def.scope !== scope) {
      return yield* fail(`${key}: belongs in ${iniFile[def.scope]}, not ${iniFile[scope]} (from ${source})`)
    }
    if (sep < 0 && def.kind.metavar !== "") return yield* fail(`${key}: needs a value, as in "${key} = …" (from ${source})`)
    layer.set(key, yield* decode(key, sep < 0 ? "true" : trimmed.slice(sep + 1), source))
  }
})

const iniLayer = Effect.fnUntraced(function*(input: LoadInput, scope: Scope, named: string | undefined, filesRead: Array<string>) {
  const layer: Source = new Map()
  const read = input.readFile ?? readIfExists
  const paths = named === undefined ? iniLocations(scope, input) : [resolve(input.cwd, named)]
  for (const path of paths) {
    const text = yield* Effect.try({
      try: () => read(path),
      catch: (error) => new ConfigError({ message: `cannot read ${path}: ${error instanceof Error ? error.message : String(error)}` })
    })
    if (text === undefined) {
      if (named !== undefined) return yield* fail(`--config-${scope}: ${path} does not exist`)
      continue
    }
    filesRead.push(path)
    yield* parseIni(scope, path, text, layer)
  }
  return layer
})

// ---------------------------------------------------------------------------------------------
// Environment

const aliasOf = new Map<string, OptionName>(optionNames.flatMap((name) => defOf(name).env.map((env) => [env, name] as const)))

interface EnvLayers {
  /** Unprefixed aliases (`CRYPTO_KEY`, `AWS_REGION`, …): below every prefixed name. */
  readonly plain: Source
  readonly byScope: Readonly<Record<Scope, Source>>
}

/**
 * `KEY_FILE` for a secret option's `KEY`: the value read from that file (Docker and systemd secrets),
 * one trailing newline dropped. Undefined for anything else.
 */
const secretFileValue = (key: string, path: string, env: LoadInput["env"]) =>
  Effect.gen(function*() {
    const base = key.slice(0, -"_FILE".length)
    if (env[base] !== undefined) return yield* fail(`${key} and ${base} are both set: set one of them`)
    return yield* Effect.try({
      try: () => readFileSync(path, "utf8").replace(/\r?\n$/, ""),
      catch: (cause) => new ConfigError({ message: `${key}: cannot read ${path} (${(cause as NodeJS.ErrnoException).code ?? String(cause)})` })
    })
  })

/** The option an environment variable names, with the scope of its prefix; or why it names none. */
const envOption = (key: string) => {
  const scope = prefixScope(key)
  if (scope === undefined) {
    const name = aliasOf.get(key)
    return name === undefined ? undefined : { name, scope, alias: true, error: undefined }
  }
  const suffix = key.slice(envPrefix[scope].length).toLowerCase()
  // An alias wins over the suffix: autopush-rs' AUTOEND__PORT is our endpoint_port, not `port`.
  const name = aliasOf.get(key) ?? (isOptionName(suffix) ? suffix : undefined)
  if (name === undefined) return { name, scope, alias: false, error: `unknown environment variable ${key}: there is no option ${JSON.stringify(suffix)}` }
  return { name, scope, alias: name !== suffix, error: undefined }
}

const envLayers = Effect.fnUntraced(function*(role: Role, env: LoadInput["env"]) {
  const layers: EnvLayers = { plain: new Map(), byScope: { shared: new Map(), connection: new Map(), endpoint: new Map() } }
  const found: Array<{ key: string; raw: string; name: OptionName; scope: Scope | undefined; alias: boolean }> = []
  for (const [key, value] of Object.entries(env)) {
    if (value === undefined) continue
    // A secret may come from a file: `AUTOEND__CRYPTO_KEYS_FILE=/run/secrets/crypto_keys`.
    const fromFile = key.endsWith("_FILE") ? envOption(key.slice(0, -"_FILE".length)) : undefined
    const isSecretFile = fromFile?.name !== undefined && fromFile.error === undefined && defOf(fromFile.name).secret
    const option = isSecretFile ? fromFile : envOption(key)
    if (option === undefined) continue
    if (option.error !== undefined || option.name === undefined) return yield* fail(option.error ?? `unknown environment variable ${key}`)
    const { name, scope, alias } = option
    const raw = isSecretFile ? yield* secretFileValue(key, value, env) : value
    if (scope === undefined) {
      found.push({ key, raw, name, scope, alias })
      continue
    }
    const owner = defOf(name).scope
    if (owner !== "shared" && owner !== scope) {
      return yield* fail(`${key}: ${name} is an option of the ${owner} node; set ${envPrefix[owner]}${name.toUpperCase()} instead`)
    }
    if (roleScopes[role].includes(scope)) found.push({ key, raw, name, scope, alias })
  }
  // Aliases first, so that a canonical name set alongside wins.
  found.sort((a, b) => Number(b.alias) - Number(a.alias))
  for (const { key, raw, name, scope } of found) {
    const layer = scope === undefined ? layers.plain : layers.byScope[scope]
    layer.set(name, yield* decode(name, raw, `environment ${key}`))
  }
  return layers
})

// ---------------------------------------------------------------------------------------------
// Flags

/** `--Router-Port` → `router_port` (anything that is not an option name is reported as unknown). */
const flagKey = (flag: string): string => flag.slice(2).toLowerCase().replaceAll("-", "_")

/** Whether `arg` is a configuration flag (`--name` or `--name=value`): an option's, or a `--config-…` file's. */
export const isConfigFlag = (arg: string): boolean => {
  if (!arg.startsWith("--")) return false
  const eq = arg.indexOf("=")
  const key = flagKey(eq < 0 ? arg : arg.slice(0, eq))
  return isOptionName(key) || scopeNames.some((scope) => key === `config_${scope}`)
}

const flagLayer = Effect.fnUntraced(function*(role: Role, argv: ReadonlyArray<string>) {
  const layer: Source = new Map()
  const configPaths: Partial<Record<Scope, string>> = {}
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i] ?? ""
    if (!arg.startsWith("--") || arg === "--") {
      const previous = argv[i - 1] ?? ""
      const previousKey = flagKey(previous)
      if (previous.startsWith("--") && isOptionName(previousKey) && defOf(previousKey).kind.metavar === "") {
        return yield* fail(`unexpected argument ${JSON.stringify(arg)}: ${previous} takes no separate value; write ${previous}=${arg}`)
      }
      return yield* fail(`unexpected argument ${JSON.stringify(arg)}: options are given as --name value or --name=value (see --help)`)
    }
    const eq = arg.indexOf("=")
    const flag = eq < 0 ? arg : arg.slice(0, eq)
    const inline = eq < 0 ? undefined : arg.slice(eq + 1)
    // The next argument, unless it is another flag: a value may start with "--" itself (one Fernet
    // key in 4,096 does, base64url having "-" among its letters).
    const nextValue = (): string | undefined => {
      const next = argv[i + 1]
      if (next === undefined || next === "--" || isConfigFlag(next)) return undefined
      i++
      return next
    }
    const key = flagKey(flag)
    const configScope = scopeNames.find((scope) => key === `config_${scope}`)
    if (configScope !== undefined) {
      if (!roleScopes[role].includes(configScope)) return yield* fail(`${flag}: ${role} does not read ${iniFile[configScope]}`)
      const path = inline ?? nextValue()
      if (path === undefined || path === "") return yield* fail(`${flag} needs a file path`)
      configPaths[configScope] = path
      continue
    }
    if (!isOptionName(key)) return yield* fail(`unknown flag ${flag} (see --help)`)
    const def = defOf(key)
    if (!roleScopes[role].includes(def.scope)) return yield* fail(`${flag}: ${key} is an option of the ${def.scope} node; ${role} does not use it`)
    const raw = def.kind.metavar === "" ? (inline ?? "true") : (inline ?? nextValue())
    if (raw === undefined) return yield* fail(`${flag} needs a value: ${flag} ${def.kind.metavar} or ${flag}=${def.kind.metavar}`)
    layer.set(key, yield* decode(key, raw, `flag ${flag}`))
  }
  return { layer, configPaths }
})

// ---------------------------------------------------------------------------------------------
// Merging and derivation

/** Applies groups of layers in order; within a group, the layers must agree. */
const merge = Effect.fnUntraced(function*(role: Role, groups: ReadonlyArray<ReadonlyArray<Source>>) {
  const merged: Source = new Map()
  for (const group of groups) {
    const seen: Source = new Map()
    for (const layer of group) {
      for (const [name, entry] of layer) {
        const other = seen.get(name)
        if (other !== undefined && spell(name, other.value) !== spell(name, entry.value)) {
          return yield* fail(
            `${name}: ${shown(name, spell(name, other.value))} (from ${other.source}) and ${shown(name, spell(name, entry.value))} (from ${entry.source}) disagree; ${role} reads both, so set it once`
          )
        }
        seen.set(name, entry)
      }
    }
    for (const [name, entry] of seen) merged.set(name, entry)
  }
  return Object.fromEntries(
    optionNames.map((name) => [name, merged.has(name) ? merged.get(name)?.value : defOf(name).default()])
  ) as unknown as OptionValues
})

const DEFAULT_PORT: Readonly<Record<string, number>> = { http: 80, https: 443 }
const urlHost = (host: string): string => (host.includes(":") && !host.startsWith("[") ? `[${host}]` : host)

/** The router URL built from its parts, as when `router_url` is unset. */
export const builtRouterUrl = (parts: {
  readonly routerScheme: string
  readonly routerHostname: string | undefined
  readonly hostname: string
  readonly routerPort: number
}): string => `${parts.routerScheme}://${urlHost(parts.routerHostname ?? parts.hostname)}:${parts.routerPort}`

/**
 * Settings from option values: derives `endpoint_url` and `router_url` when unset, resolves
 * `data_dir` and a file `event_log` against `cwd`, freezes everything.
 */
const deriveSettings = (v: OptionValues, cwd: string): Settings => {
  const derived: Partial<Record<OptionName, unknown>> = {
    endpoint_url:
      v.endpoint_url ??
      `${v.endpoint_scheme}://${urlHost(v.endpoint_hostname)}${v.endpoint_port === DEFAULT_PORT[v.endpoint_scheme] ? "" : `:${v.endpoint_port}`}`,
    router_url: v.router_url ??
      builtRouterUrl({ routerScheme: v.router_scheme, routerHostname: v.router_hostname, hostname: v.hostname, routerPort: v.router_port }),
    data_dir: resolve(cwd, v.data_dir),
    event_log: v.event_log === undefined || v.event_log === "-" ? v.event_log : resolve(cwd, v.event_log)
  }
  const settings = Object.fromEntries(
    optionNames.map((name) => {
      const value = Object.hasOwn(derived, name) ? derived[name] : v[name]
      return [camel(name), Array.isArray(value) ? Object.freeze([...value]) : value]
    })
  )
  return Object.freeze(settings) as unknown as Settings
}

/** Defaults with some options replaced, without reading any source: for tests and embedding. */
export const makeSettings = (overrides: Partial<OptionValues> = {}, cwd: string = process.cwd()): Settings =>
  deriveSettings(
    { ...(Object.fromEntries(optionNames.map((name) => [name, defOf(name).default()])) as unknown as OptionValues), ...overrides },
    cwd
  )

/** Reads every source of `input.role` and returns its settings. */
export const loadSettings = (input: LoadInput): Effect.Effect<Settings, ConfigError | HelpRequested> =>
  Effect.map(loadSettingsAndFiles(input), ({ settings }) => settings)

/** `loadSettings`, and the ini files that were read (in reading order), for the start-up log. */
export const loadSettingsAndFiles = Effect.fn("loadSettings")(function*(
  input: LoadInput
): Effect.fn.Return<
  { readonly settings: Settings; readonly files: ReadonlyArray<string>; readonly given: ReadonlySet<OptionName> },
  ConfigError | HelpRequested
> {
  const { role } = input
  if (input.argv.includes("--help") || input.argv.includes("-h")) return yield* new HelpRequested({ text: helpText(role) })
  const flags = yield* flagLayer(role, input.argv)
  const env = yield* envLayers(role, input.env)
  const files: Array<string> = []
  const iniShared = yield* iniLayer(input, "shared", flags.configPaths.shared, files)
  const nodeScopes = roleScopes[role].filter((scope) => scope !== "shared")
  const iniNodes: Array<Source> = []
  for (const scope of nodeScopes) iniNodes.push(yield* iniLayer(input, scope, flags.configPaths[scope], files))
  const groups = [
    [iniShared],
    iniNodes,
    [env.plain],
    [env.byScope.shared],
    nodeScopes.map((scope) => env.byScope[scope]),
    [flags.layer]
  ]
  const values = yield* merge(role, groups)
  // The options some source set (a default left alone is not given), for checks that need to know.
  const given = new Set(groups.flatMap((group) => group.flatMap((layer) => [...layer.keys()])))
  return { settings: deriveSettings(values, input.cwd), files, given }
})

/**
 * Fails naming every secret that is empty and where it can be set. Which secrets are required
 * depends on the entrypoint (the all-in-one generates and persists its own keys).
 */
export const requireSecrets = (settings: Settings, names: ReadonlyArray<RequiredSecret>): Effect.Effect<void, ConfigError> => {
  const missing = names.filter((name) => (settings[camel(name)]?.length ?? 0) === 0)
  if (missing.length === 0) return Effect.void
  return fail(missing.map(secretHint).join("; "))
}

/**
 * Where a missing secret goes: a file named by its `_FILE` variable, or its ini file — never a flag,
 * which every user of the machine can read in the process list.
 */
const secretHint = (name: RequiredSecret): string =>
  `${name} is required: put it in a file only this service can read (make one with autokey) and name the file with ${secretFileVar(name)}, or set it in ${iniFile[defOf(name).scope]}`

/**
 * The options whose value differs from its default (as `redactedSettings` shows them): what the
 * start-up log records, so that what was configured stands out.
 */
export const changedSettings = (settings: Settings, cwd: string = process.cwd()): Readonly<Partial<Record<OptionName, unknown>>> => {
  const current = redactedSettings(settings)
  const defaults = redactedSettings(makeSettings({}, cwd))
  return Object.fromEntries(
    optionNames.filter((name) => JSON.stringify(current[name]) !== JSON.stringify(defaults[name])).map((name) => [name, current[name]])
  )
}

/** Settings for the startup log, keyed by option name: secrets replaced, durations in seconds. */
export const redactedSettings = (settings: Settings): Readonly<Record<OptionName, unknown>> =>
  Object.fromEntries(
    optionNames.map((name) => {
      const value: unknown = settings[camel(name)]
      if (defOf(name).secret) {
        const count = Array.isArray(value) ? value.length : value === undefined ? 0 : 1
        return [name, `[redacted: ${count} key${count === 1 ? "" : "s"}]`]
      }
      return [name, Duration.isDuration(value) ? Duration.toSeconds(value) : (value ?? null)]
    })
  ) as Record<OptionName, unknown>
