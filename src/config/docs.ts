/**
 * Documentation generated from the option table: `--help`, the README table, the sample ini files.
 */
import {
  defaultSpelling,
  envNamesOf,
  envPrefix,
  flagOf,
  iniFile,
  options,
  optionsOf,
  roleScopes,
  secretNote,
  scopeNames
} from "./options.ts"
import type { OptionDef, OptionName, Role, Scope } from "./options.ts"

interface OptionRow {
  readonly name: OptionName
  readonly scope: Scope
  readonly file: string
  readonly type: string
  readonly default: string
  readonly description: string
  readonly secret: boolean
  readonly env: ReadonlyArray<string>
  readonly flag: string
}

const defaultText = (name: OptionName): string => {
  const def: OptionDef = options[name]
  return def.defaultText ?? (defaultSpelling(name) || "empty")
}

/** One row per option, in table order. */
export const optionsTable = (): ReadonlyArray<OptionRow> =>
  optionsOf(scopeNames).map((name) => {
    const def: OptionDef = options[name]
    return {
      name,
      scope: def.scope,
      file: iniFile[def.scope],
      type: def.kind.type,
      default: defaultText(name),
      description: def.description,
      secret: def.secret,
      env: envNamesOf(name),
      flag: flagOf(name)
    }
  })

const heading: Readonly<Record<Scope, string>> = {
  shared: "Shared options",
  connection: "Connection node options",
  endpoint: "Endpoint node options"
}

const row = (left: string, right: string): string => `  ${left.padEnd(30)}${left.length >= 30 ? "\n" + " ".repeat(32) : ""}${right}`

/** The text of `--help` for one process. */
export const helpText = (role: Role): string => {
  const scopes = roleScopes[role]
  const files = scopes.map((scope) => iniFile[scope]).join(", ")
  const prefixes = scopes.map((scope) => `${envPrefix[scope]}<OPTION>`).join(", ")
  const lines = [
    `Usage: ${role} [--option value | --option=value]...`,
    "",
    "Settings come from, lowest to highest precedence: defaults; the ini files",
    `${files}, each read from /etc/NAME, ~/.NAME, ./.NAME and ./configs/NAME`,
    "(or only the file named by --config-*); environment variables",
    `${prefixes} (${envPrefix.shared} takes shared options only); these flags.`,
    "Durations are seconds (fractions allowed) or take a unit: 300ms, 5m, 30d.",
    "",
    row("--help", "show this text"),
    ...scopes.map((scope) => row(`--config-${scope} PATH`, `read only PATH instead of looking up ${iniFile[scope]}`))
  ]
  for (const scope of scopes) {
    lines.push("", `${heading[scope]}:`)
    for (const name of optionsOf([scope])) {
      const def: OptionDef = options[name]
      const flag = def.kind.metavar === "" ? `${flagOf(name)}[=BOOL]` : `${flagOf(name)} ${def.kind.metavar}`
      lines.push(row(flag, `${def.description}${def.secret ? secretNote(name) : ""}`))
      lines.push(row("", `default: ${defaultText(name)}; env: ${envNamesOf(name, role).join(", ")}`))
    }
  }
  return lines.join("\n") + "\n"
}

const sampleHeader: Readonly<Record<Scope, string>> = {
  shared: "Options shared by both nodes. Read by autoconnect, autoendpoint and the all-in-one autopush;\n# a shared option may also be set in the connection or endpoint file.",
  connection: "Options of the connection node (autoconnect, and the all-in-one autopush).",
  endpoint: "Options of the endpoint node (autoendpoint, and the all-in-one autopush)."
}

/** The sample ini file of a scope: every option commented out with its default. */
export const sampleIni = (scope: Scope): string => {
  const name = iniFile[scope]
  const lines = [
    `# ${name}`,
    `# ${sampleHeader[scope]}`,
    "#",
    `# Looked up in /etc/${name}, ~/.${name},`,
    `# ./.${name} and ./configs/${name} (all that exist are read, later ones win),`,
    `# or only the file given by --config-${scope}.`,
    "# Lines are `option = value` (or `option: value`); a bare `option` means true for booleans;",
    "# lines starting with # or ; are comments; an empty value means the default.",
    `# Environment variables (${envPrefix[scope]}<OPTION>) and flags (--option) override this file.`,
    "# Durations are seconds (fractions allowed) or take a unit: 300ms, 5m, 30d.",
    "#",
    "# Generated from src/config/options.ts (node src/config/write-samples.ts); edit the table, not this file."
  ]
  for (const option of optionsOf([scope])) {
    const def: OptionDef = options[option]
    const notes = [def.kind.type, ...(def.secret ? ["secret"] : []), ...(defaultSpelling(option) === "" ? [`default: ${defaultText(option)}`] : [])]
    lines.push("", `# ${def.description} [${notes.join("; ")}]`, `;${option} = ${defaultSpelling(option)}`.trimEnd())
  }
  return lines.join("\n") + "\n"
}
