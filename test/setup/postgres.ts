/**
 * Vitest global setup: a PostgreSQL cluster the run's tests start through `.ci/postgres.sh` (the
 * throwaway one `test/storage/postgresServer.ts` starts when no DSN is given, and private ones a
 * test failed to remove) is stopped when the run ends. A cluster that was running before the run
 * is left running: the script lists only the clusters it started itself. Listed after
 * `tmpdir.ts`, whose directory holds the list: teardowns run in reverse order.
 */
import { execFileSync } from "node:child_process"
import { existsSync, readFileSync } from "node:fs"
import { join } from "node:path"

const SCRIPT = join(import.meta.dirname, "..", "..", ".ci", "postgres.sh")

export default function setup(): () => void {
  const list = join(process.env["TMPDIR"] ?? "/tmp", "postgres-started")
  process.env["AUTOPUSH_TEST_POSTGRES_STARTED"] = list
  return () => {
    if (!existsSync(list)) return
    const dirs = new Set(readFileSync(list, "utf8").split("\n").filter((dir) => dir !== "" && existsSync(dir)))
    for (const dir of dirs) {
      execFileSync(SCRIPT, ["stop"], { env: { ...process.env, AUTOPUSH_TEST_POSTGRES_DIR: dir }, stdio: ["ignore", "ignore", "inherit"], timeout: 120_000 })
    }
  }
}
