/**
 * The PostgreSQL server the PostgreSQL tests run against: `AUTOPUSH_TEST_POSTGRES_DSN` when set
 * (CI sets it: `.ci/run` starts a cluster with `.ci/postgres.sh`); otherwise, where PostgreSQL's
 * binaries are installed (`/usr/lib/postgresql/<version>/bin`), a throwaway cluster this file
 * starts through the same script, stopped when the run ends (`test/setup/postgres.ts`; one that
 * was running already is left running). Under CI=true the variable must be set: the lane cannot
 * vanish silently. With neither, the tests fail, saying what they need.
 */
import { execFileSync } from "node:child_process"
import { existsSync, readdirSync } from "node:fs"
import { createServer } from "node:net"
import { join } from "node:path"
import { assert, describe, it } from "vitest"

const SCRIPT = join(import.meta.dirname, "..", "..", ".ci", "postgres.sh")

const hasPostgresBinaries = (): boolean =>
  existsSync("/usr/lib/postgresql") && readdirSync("/usr/lib/postgresql").some((v) => existsSync(`/usr/lib/postgresql/${v}/bin/pg_ctl`))

/** Run the script with these settings; the DSN it prints last. */
const script = (env: Readonly<Record<string, string>>, args: ReadonlyArray<string> = []): string => {
  const out = execFileSync(SCRIPT, args, { env: { ...process.env, ...env }, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"], timeout: 120_000 })
  return out.trim().split("\n").at(-1)?.replace(/^AUTOPUSH_TEST_POSTGRES_DSN=/, "") ?? ""
}

/** The DSN of the shared test server, or why there is none. */
export const testPostgres = (): { readonly dsn: string } | { readonly missing: string } => {
  const given = process.env["AUTOPUSH_TEST_POSTGRES_DSN"]
  if (given !== undefined && given !== "") return { dsn: given }
  if (process.env["CI"] === "true") {
    return { missing: "AUTOPUSH_TEST_POSTGRES_DSN is not set under CI=true: .ci/run starts PostgreSQL with .ci/postgres.sh and sets it" }
  }
  if (!hasPostgresBinaries()) {
    return { missing: "these tests need PostgreSQL: set AUTOPUSH_TEST_POSTGRES_DSN=postgres://…, or install Debian's postgresql (.ci/postgres.sh starts a throwaway cluster)" }
  }
  return { dsn: script({}) }
}

/**
 * The suite `name` with the shared test server's DSN; without one, the suite is one failing test
 * saying what it needs (never skipped).
 */
export const describePostgres = (name: string, body: (dsn: string) => void): void => {
  const server = testPostgres()
  if ("missing" in server) {
    describe(name, () => {
      it("needs a PostgreSQL server", () => {
        assert.fail(server.missing)
      })
    })
  } else body(server.dsn)
}

/** A free TCP port on 127.0.0.1 (taken and given back). */
const freePort = () =>
  new Promise<number>((resolve, reject) => {
    const server = createServer()
    server.once("error", reject)
    server.listen(0, "127.0.0.1", () => {
      const address = server.address()
      server.close(() => resolve(typeof address === "object" && address !== null ? address.port : 0))
    })
  })

/** A cluster of its own (a test that stops and starts its server), on a free port: its DSN, and how to stop, start and remove it. */
export const privatePostgres = async () => {
  const port = await freePort()
  const dir = `/tmp/autopush-postgres-private-${port}`
  const env = { AUTOPUSH_TEST_POSTGRES_PORT: String(port), AUTOPUSH_TEST_POSTGRES_DIR: dir }
  const dsn = script(env)
  return {
    dsn,
    port,
    stop: () => void script(env, ["stop"]),
    start: () => void script(env),
    remove: () => {
      script(env, ["stop"])
      execFileSync("rm", ["-rf", dir, `${dir}.lock`])
    }
  }
}
