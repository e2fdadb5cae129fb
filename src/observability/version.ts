/** What `/__version__`, `/status` and the health routes report. */
import { execFileSync } from "node:child_process"
import { readFileSync } from "node:fs"

const root = new URL("../../", import.meta.url)

const pkg = JSON.parse(readFileSync(new URL("package.json", root), "utf8")) as { version: string }

export const VERSION: string = pkg.version

/**
 * The commit this runs: `AUTOPUSH_COMMIT` (set by the Docker build), else the checkout's HEAD, else
 * "unknown" (no git, or not a checkout).
 */
const commitOf = (): string => {
  const fromEnv = process.env["AUTOPUSH_COMMIT"]
  if (fromEnv !== undefined && fromEnv !== "" && fromEnv !== "unknown") return fromEnv
  try {
    const head = execFileSync("git", ["rev-parse", "HEAD"], { cwd: root, encoding: "utf8", stdio: ["ignore", "pipe", "ignore"], timeout: 2_000 }).trim()
    return /^[0-9a-f]{40}$/.test(head) ? head : "unknown"
  } catch {
    return "unknown"
  }
}

export const versionInfo = {
  source: "https://github.com/autopush-ts/autopush-ts",
  version: VERSION,
  commit: commitOf(),
  build: process.env["AUTOPUSH_BUILD"] ?? "local"
} as const
