/** What `/__version__`, `/status` and the health routes report. */
import { readFileSync } from "node:fs"

const pkg = JSON.parse(readFileSync(new URL("../../package.json", import.meta.url), "utf8")) as { version: string }

export const VERSION: string = pkg.version

export const versionInfo = {
  source: "https://github.com/autopush-ts/autopush-ts",
  version: VERSION,
  commit: process.env["AUTOPUSH_COMMIT"] ?? "unknown",
  build: process.env["AUTOPUSH_BUILD"] ?? "local"
} as const
