/**
 * docs/configuration.md from the option table: `npm run docs:config` (node src/config/write-docs.ts).
 * A test compares the file with `configurationMarkdown()`, so the table in the docs cannot drift.
 */
import { writeFileSync } from "node:fs"
import { optionsTable } from "./docs.ts"
import { envPrefix, iniFile, type OptionDef, options, type Scope, scopeNames } from "./options.ts"

const heading: Readonly<Record<Scope, string>> = {
  shared: "Shared options",
  connection: "Connection node options",
  endpoint: "Endpoint node options"
}

const intro: Readonly<Record<Scope, string>> = {
  shared:
    "Read by every process: `autoconnect`, `autoendpoint`, the all-in-one `autopush` and the tools. " +
    "They may be set in any of the three ini files, and under any of the three environment prefixes " +
    "(`AUTOCONNECT__` and `AUTOEND__` reach only their own node).",
  connection: `Read by \`autoconnect\` and the all-in-one: \`${iniFile.connection}\`, \`${envPrefix.connection}<OPTION>\`.`,
  endpoint: `Read by \`autoendpoint\` and the all-in-one: \`${iniFile.endpoint}\`, \`${envPrefix.endpoint}<OPTION>\`.`
}

/** A table cell: pipes escaped, line breaks flattened. */
const cell = (text: string): string => text.replaceAll("|", "\\|").replaceAll("\n", " ")
const code = (text: string): string => `\`${text}\``

export const configurationMarkdown = (): string => {
  const rows = optionsTable()
  const lines = [
    "# Configuration",
    "",
    "<!-- Generated from src/config/options.ts by `npm run docs:config`: edit the option table, not this file. -->",
    "",
    "Every option of every process, generated from the one option table (`src/config/options.ts`) that",
    "also drives parsing, `--help` and the sample ini files in `config/`.",
    "",
    "Sources, lowest to highest precedence:",
    "",
    "1. the defaults below;",
    "2. the ini files `autopush_shared.ini`, `autopush_connection.ini`, `autopush_endpoint.ini`, each read",
    "   from `/etc/NAME`, `~/.NAME`, `./.NAME` and `./configs/NAME` (all that exist, later ones win), or",
    "   only the file given by `--config-shared`, `--config-connection` or `--config-endpoint`;",
    "3. the environment: the plain aliases (`CRYPTO_KEY`, `AWS_REGION`, `AWS_ENDPOINT_URL_DYNAMODB`), then",
    "   `AUTOPUSH__<OPTION>`, then `AUTOCONNECT__<OPTION>` / `AUTOEND__<OPTION>` (autopush-rs style);",
    "4. command-line flags: `--router-port 8081` or `--router-port=8081`; booleans alone (`--human-logs`)",
    "   or with a value (`--human-logs=false`). A value given apart is the next argument unless that is",
    "   itself a flag, so a value may start with `--` (as one generated key in 4,096 does).",
    "",
    "Values: durations are seconds (fractions allowed) or take a unit (`300ms`, `5m`, `30d`); lists are",
    "`[a,b]` or `a,b`; booleans `true/false`, `yes/no`, `on/off`, `1/0`. An empty value means the default.",
    "An unknown option, a bad value or a missing required secret stops the process at start with a",
    "message naming the option and where the value came from. Secret options are never logged.",
    ""
  ]
  for (const scope of scopeNames) {
    lines.push(`## ${heading[scope]}`, "", intro[scope], "")
    lines.push("| option | flag | type | default | environment | description |", "| --- | --- | --- | --- | --- | --- |")
    for (const row of rows.filter((r) => r.scope === scope)) {
      const def: OptionDef = options[row.name]
      const env = [`${envPrefix[scope]}${row.name.toUpperCase()}`, ...def.env].map(code).join(", ")
      const dflt = def.defaultText !== undefined || row.default === "empty" ? row.default : code(row.default)
      const description = `${row.description}${row.secret ? " **Secret.**" : ""}`
      lines.push(`| ${code(row.name)} | ${code(row.flag)} | ${cell(row.type)} | ${cell(dflt)} | ${env} | ${cell(description)} |`)
    }
    lines.push("")
  }
  return lines.join("\n")
}

if (import.meta.main) {
  const path = new URL("../../docs/configuration.md", import.meta.url)
  writeFileSync(path, configurationMarkdown())
  console.log(`wrote ${path.pathname}`)
}
