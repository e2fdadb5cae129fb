/** What `/__version__`, `/status` and the health routes report. */
import { readFileSync } from "node:fs"
import { resolve } from "node:path"
import { fileURLToPath, pathToFileURL } from "node:url"

const root = new URL("../../", import.meta.url)

const pkg = JSON.parse(readFileSync(new URL("package.json", root), "utf8")) as { version: string }

export const VERSION: string = pkg.version

/**
 * The commit this runs: `AUTOPUSH_COMMIT` (set by the Docker build), else the checkout's HEAD, else
 * "unknown" (not a checkout). HEAD is read from `.git` rather than by running git (a process spawn
 * at every start): a branch ref is a file, or a line of `packed-refs`.
 */
const commitOf = (): string => {
  const fromEnv = process.env["AUTOPUSH_COMMIT"]
  if (fromEnv !== undefined && fromEnv !== "" && fromEnv !== "unknown") return fromEnv
  try {
    const gitDir = gitDirOf(new URL(".git", root))
    const head = readFileSync(new URL("HEAD", gitDir), "utf8").trim()
    if (!head.startsWith("ref: ")) return SHA.test(head) ? head : "unknown"
    const ref = head.slice("ref: ".length)
    const commonDir = commonDirOf(gitDir)
    for (const dir of [gitDir, commonDir]) {
      try {
        const sha = readFileSync(new URL(ref, dir), "utf8").trim()
        if (SHA.test(sha)) return sha
      } catch {
        // not a loose ref here
      }
    }
    const packed = readFileSync(new URL("packed-refs", commonDir), "utf8").split("\n").find((line) => line.endsWith(` ${ref}`))
    const sha = packed?.slice(0, 40) ?? ""
    return SHA.test(sha) ? sha : "unknown"
  } catch {
    return "unknown"
  }
}

const SHA = /^[0-9a-f]{40}$/

/** `.git` is a directory, or (a worktree, a submodule) a file naming the directory. */
const gitDirOf = (dotGit: URL): URL => {
  try {
    const text = readFileSync(dotGit, "utf8")
    const path = text.startsWith("gitdir: ") ? text.slice("gitdir: ".length).trim() : undefined
    if (path !== undefined) return pathToFileURL(`${resolve(fileURLToPath(root), path)}/`)
  } catch {
    // a directory
  }
  return new URL(`${dotGit.href}/`)
}

/** Where a worktree's shared refs are (`commondir`), else the git directory itself. */
const commonDirOf = (gitDir: URL): URL => {
  try {
    return pathToFileURL(`${resolve(fileURLToPath(gitDir), readFileSync(new URL("commondir", gitDir), "utf8").trim())}/`)
  } catch {
    return gitDir
  }
}

export const versionInfo = {
  source: "https://github.com/autopush-ts/autopush-ts",
  version: VERSION,
  commit: commitOf(),
  build: process.env["AUTOPUSH_BUILD"] ?? "local"
} as const
