/**
 * A node that cannot start says why in one line that names the option to change, exits 1, and
 * prints no stack trace: a port in use, embedded data in use or unusable, DynamoDB out of reach, a
 * bad crypto key, unusable bridge credentials.
 */
import { spawn } from "node:child_process"
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { createServer, type Server } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect, Exit, Scope } from "effect"
import { afterAll, describe, expect, it } from "vitest"
import { generateFernetKey } from "../../src/crypto/fernet.ts"
import { startDynalite } from "../../src/storage/dynalite/embedded.ts"
import { freePort, freePorts } from "./servers.ts"

const root = new URL("../../", import.meta.url).pathname

/** Run an entrypoint until it exits (it must, by itself, within 30 s). */
const run = (script: string, args: ReadonlyArray<string>, cwd = mkdtempSync(join(tmpdir(), "autopush-startup-"))) =>
  new Promise<{ readonly code: number | null; readonly stderr: string; readonly stdout: string }>((resolve) => {
    const child = spawn(process.execPath, [join(root, "src/bin", script), ...args], { cwd, stdio: ["ignore", "pipe", "pipe"] })
    let stderr = ""
    let stdout = ""
    child.stdout.on("data", (c: Buffer) => (stdout += c.toString()))
    child.stderr.on("data", (c: Buffer) => (stderr += c.toString()))
    const timer = setTimeout(() => child.kill("SIGKILL"), 30_000)
    child.on("exit", (code) => {
      clearTimeout(timer)
      resolve({ code, stderr, stdout })
    })
  })

/** Exit 1 with exactly one stderr line that says `expected`, and no stack trace anywhere. */
const expectOneLine = (result: { code: number | null; stderr: string; stdout: string }, expected: RegExp) => {
  expect(result.code, result.stderr).toBe(1)
  const lines = result.stderr.trim().split("\n")
  expect(lines, result.stderr).toHaveLength(1)
  expect(lines[0]).toMatch(expected)
  expect(result.stderr + result.stdout).not.toMatch(/^\s+at /m)
}

const held: Array<Server> = []
const holdPort = async (): Promise<number> => {
  const port = await freePort()
  const server = createServer()
  await new Promise<void>((resolve) => server.listen(port, "127.0.0.1", resolve))
  held.push(server)
  return port
}
afterAll(() => {
  for (const server of held) server.close()
})

const ports = async () => {
  const [port, router, endpoint] = await freePorts(3)
  return ["--port", String(port), "--router-port", String(router), "--endpoint-port", String(endpoint)]
}

describe("start-up failures: one line naming the option, exit 1, no stack", () => {
  it("a port in use (each listener names its option)", async () => {
    for (const [flag, option] of [["--port", "port"], ["--router-port", "router_port"], ["--endpoint-port", "endpoint_port"]] as const) {
      const taken = await holdPort()
      const args = [...(await ports()), "--bind-host", "127.0.0.1", "--private-bind-host", "127.0.0.1"]
      args[args.indexOf(flag) + 1] = String(taken)
      expectOneLine(await run("autopush.ts", args), new RegExp(`^autopush: cannot start: port ${taken} is in use \\(option ${option}\\)`))
    }
  }, 120_000)

  it("embedded data in use by another process, or not usable", async () => {
    // Dynalite data of an earlier version, held by another process (LevelDB's lock).
    const legacy = mkdtempSync(join(tmpdir(), "autopush-startup-"))
    const scope = Effect.runSync(Scope.make())
    await Effect.runPromise(Scope.provide(startDynalite(join(legacy, "data", "dynalite")), scope))
    try {
      expectOneLine(await run("autopush.ts", await ports(), legacy), /in use by another process \(option data_dir: stop the other process/)
    } finally {
      await Effect.runPromise(Scope.close(scope, Exit.void))
    }
    // A SQLite database that is not one.
    const cwd = mkdtempSync(join(tmpdir(), "autopush-startup-"))
    mkdirSync(join(cwd, "data"))
    writeFileSync(join(cwd, "data", "autopush.sqlite"), "not a database ".repeat(100))
    expectOneLine(await run("autopush.ts", await ports(), cwd), /^autopush: cannot start: the embedded storage \(embedded SQLite database .*autopush\.sqlite\) did not start \(option data_dir\): .*not a database/)
    writeFileSync(join(cwd, "a-file"), "")
    expectOneLine(await run("autopush.ts", [...(await ports()), "--data-dir", "a-file/data"], cwd), /\(option data_dir\)/)
  }, 120_000)

  it("a corrupt secrets.json is refused in one line, never replaced by new keys", async () => {
    const cwd = mkdtempSync(join(tmpdir(), "autopush-startup-"))
    mkdirSync(join(cwd, "data"))
    for (const [content, why] of [["{\"crypto_key\": [\"abc", /not JSON/], ["{\"crypto_key\": []}", /lists of keys/]] as const) {
      writeFileSync(join(cwd, "data/secrets.json"), content)
      expectOneLine(
        await run("autopush.ts", await ports(), cwd),
        new RegExp(`^autopush: cannot start: .*secrets\\.json is not usable \\(.*${why.source}\\): restore it from a backup`)
      )
      expect(readFileSync(join(cwd, "data/secrets.json"), "utf8")).toBe(content)
    }
  }, 60_000)

  it("DynamoDB out of reach", async () => {
    const result = await run("autoconnect.ts", [
      "--port", String(await freePort()),
      "--router-port", String(await freePort()),
      "--storage-endpoint", `http://127.0.0.1:${await freePort()}`,
      "--crypto-key", generateFernetKey(),
      "--endpoint-url", "http://127.0.0.1:8082"
    ])
    expectOneLine(result, /^autoconnect: cannot start: DynamoDB at http:\/\/127\.0\.0\.1:\d+ cannot be used \(option storage_endpoint\)/)
  }, 60_000)

  it("a node on its own without storage_endpoint (its store would be its alone), unless embedded_storage says so", async () => {
    const [a, b, c] = await freePorts(3)
    const portsOf = { "autoconnect.ts": ["--port", String(a), "--router-port", String(b)], "autoendpoint.ts": ["--endpoint-port", String(c)] }
    for (const script of ["autoconnect.ts", "autoendpoint.ts"] as const) {
      const role = script.replace(".ts", "")
      expectOneLine(
        await run(script, [...portsOf[script], "--crypto-key", generateFernetKey(), "--auth-keys", "k"]),
        new RegExp(`^${role}: cannot start: no storage_endpoint: the connection and endpoint nodes must share one store\\. Run \`npm run storage`)
      )
    }
    // Asked for: it gets past that check (and stops at the next: a port held by someone else).
    const taken = await holdPort()
    const [router] = await freePorts(1)
    expectOneLine(
      await run("autoconnect.ts", ["--port", String(taken), "--router-port", String(router), "--crypto-key", generateFernetKey(), "--embedded-storage", "--bind-host", "127.0.0.1", "--endpoint-url", "http://127.0.0.1:8082"]),
      new RegExp(`^autoconnect: cannot start: port ${taken} is in use \\(option port\\)`)
    )
  }, 60_000)

  it("a connection node on its own without the endpoint nodes' URL (it would hand out localhost endpoints)", async () => {
    const [port, router] = await freePorts(2)
    const args = ["--port", String(port), "--router-port", String(router), "--crypto-key", generateFernetKey(), "--storage-endpoint", `http://127.0.0.1:${await freePort()}`]
    expectOneLine(await run("autoconnect.ts", args), /^autoconnect: cannot start: no endpoint_url: .*Set endpoint_url to the URL app servers reach the endpoint nodes at/)
    // Given (as a URL, or as a host name): it gets past that check (and stops at the next: no storage there).
    for (const given of [["--endpoint-url", "https://push.example.com"], ["--endpoint-hostname", "push.example.com"]]) {
      expectOneLine(await run("autoconnect.ts", [...args, ...given]), /^autoconnect: cannot start: DynamoDB at .* \(option storage_endpoint\)/)
    }
  }, 60_000)

  it("the embedded dynalite store's port (storage_port: data of an earlier version) in use", async () => {
    // Dynalite data of an earlier version, which the all-in-one serves on storage_port.
    const legacy = mkdtempSync(join(tmpdir(), "autopush-startup-"))
    const scope = Effect.runSync(Scope.make())
    await Effect.runPromise(Scope.provide(startDynalite(join(legacy, "data", "dynalite")), scope))
    await Effect.runPromise(Scope.close(scope, Exit.void))
    const taken = await holdPort()
    expectOneLine(await run("autopush.ts", [...(await ports()), "--storage-port", String(taken)], legacy), new RegExp(`^autopush: cannot start: port ${taken} is in use \\(option storage_port\\)`))
  }, 60_000)

  it("a crypto key that is not one", async () => {
    expectOneLine(await run("autoconnect.ts", ["--crypto-key", "not-a-key"]), /^autoconnect: configuration error: crypto_key: /)
  }, 60_000)

  it("bridge credentials that cannot be used (and are not echoed)", async () => {
    const cwd = mkdtempSync(join(tmpdir(), "autopush-startup-"))
    const result = await run("autopush.ts", [
      ...(await ports()),
      "--bind-host", "127.0.0.1",
      "--fcm-credentials", '{"app": {"project_id": "p", "credential": "{secret-but-broken"}}'
    ], cwd)
    rmSync(cwd, { recursive: true, force: true })
    expectOneLine(result, /^autopush: cannot start: option fcm_credentials is not usable: app credential is not valid JSON$/)
    expect(result.stderr + result.stdout).not.toContain("secret-but-broken")
  }, 60_000)
})
