/**
 * The PostgreSQL server the PostgreSQL tests run against: `AUTOPUSH_TEST_POSTGRES_DSN` when set
 * (CI sets it: `.ci/run` starts a cluster with `.ci/postgres.sh`); otherwise, where PostgreSQL's
 * binaries are installed (`/usr/lib/postgresql/<version>/bin`), a throwaway cluster this file
 * starts through the same script. Under CI=true the variable must be set: the lane cannot vanish
 * silently. With neither, the tests fail, saying what they need.
 */
import { execFile, execFileSync } from "node:child_process"
import { existsSync, readdirSync } from "node:fs"
import { createServer } from "node:net"
import { join } from "node:path"
import pg from "pg"
import { assert, describe, it } from "vitest"

const SCRIPT = join(import.meta.dirname, "..", "..", ".ci", "postgres.sh")

const hasPostgresBinaries = (): boolean =>
  existsSync("/usr/lib/postgresql") && readdirSync("/usr/lib/postgresql").some((v) => existsSync(`/usr/lib/postgresql/${v}/bin/pg_ctl`))

const scriptOptions = (env: Readonly<Record<string, string>>) => ({ env: { ...process.env, ...env }, encoding: "utf8" as const, timeout: 120_000 })

/** Run the script with these settings; the DSN it prints last. */
const script = (env: Readonly<Record<string, string>>, args: ReadonlyArray<string> = []): string => {
  const out = execFileSync(SCRIPT, args, { ...scriptOptions(env), stdio: ["ignore", "pipe", "pipe"] })
  return out.trim().split("\n").at(-1)?.replace(/^AUTOPUSH_TEST_POSTGRES_DSN=/, "") ?? ""
}

/** Run the script with these settings without blocking the test's event loop (its load goes on meanwhile). */
const scriptInBackground = (env: Readonly<Record<string, string>>, args: ReadonlyArray<string>): Promise<void> =>
  new Promise((resolve, reject) =>
    execFile(SCRIPT, args, scriptOptions(env), (error, _stdout, stderr) => error === null ? resolve() : reject(new Error(`${error.message}\n${stderr}`)))
  )

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

/** A cluster on a free port under `/tmp` (`kind` names its directory), made by the script with `extra` settings. */
const clusterOnFreePort = async (kind: string, extra: Readonly<Record<string, string>> = {}) => {
  const port = await freePort()
  const dir = `/tmp/autopush-postgres-${kind}-${port}`
  const env = { AUTOPUSH_TEST_POSTGRES_PORT: String(port), AUTOPUSH_TEST_POSTGRES_DIR: dir, ...extra }
  const dsn = script(env)
  return {
    dsn,
    port,
    stop: () => void script(env, ["stop"]),
    start: () => void script(env),
    /** Stopped as by a crash (`pg_ctl stop -m immediate`): no shutdown checkpoint, every connection cut. */
    kill: () => scriptInBackground(env, ["kill"]),
    /** A standby made the primary (`pg_ctl promote`), once it accepts writes. */
    promote: () => scriptInBackground(env, ["promote"]),
    remove: () => {
      script(env, ["stop"])
      execFileSync("rm", ["-rf", dir, `${dir}.lock`])
    }
  }
}

/** A cluster of its own (a test that stops and starts its server), on a free port: its DSN, and how to stop, start and remove it. */
export const privatePostgres = () => clusterOnFreePort("private")

/**
 * A primary and a streaming-replication standby of it (named `standby`), each a cluster of its
 * own on a free port; with `synchronous`, the primary answers a commit once the standby has it
 * (`synchronous_standby_names`, set once the standby streams: set before, the setup's own commits
 * would wait for a standby not there yet). The standby's settings do not name a standby: promoted,
 * it commits alone.
 */
export const replicatedPostgres = async (options: { readonly synchronous: boolean }) => {
  const primary = await clusterOnFreePort("primary")
  try {
    const standby = await clusterOnFreePort("standby", { AUTOPUSH_TEST_POSTGRES_PRIMARY_PORT: String(primary.port) })
    if (options.synchronous) {
      const client = new pg.Client({ connectionString: primary.dsn })
      await client.connect()
      try {
        await client.query("ALTER SYSTEM SET synchronous_standby_names = 'standby'")
        await client.query("SELECT pg_reload_conf()")
      } finally {
        await client.end()
      }
    }
    return { primary, standby }
  } catch (error) {
    primary.remove()
    throw error
  }
}
