/**
 * What a new user sees when starting the all-in-one: one "ready" line with the URLs to use, a
 * start-up record with only the settings that differ from the defaults and the ini files read,
 * `/__version__` with the real version and commit, the console at `/`, and the JSON error body
 * for an unknown path.
 */
import { execFileSync, spawn } from "node:child_process"
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { freePorts } from "./servers.ts"

const root = new URL("../../", import.meta.url).pathname

interface LogLine {
  readonly Fields: Readonly<Record<string, unknown>> & { readonly msg: string }
}

describe("first run of npm start", () => {
  const cwd = mkdtempSync(join(tmpdir(), "autopush-first-run-"))
  const lines: Array<LogLine> = []
  let child: ReturnType<typeof spawn>
  let ports: { ws: number; router: number; endpoint: number }

  beforeAll(async () => {
    const [ws, router, endpoint] = (await freePorts(3)) as [number, number, number]
    ports = { ws, router, endpoint }
    // An ini file in the working directory, as a user would keep one.
    writeFileSync(join(cwd, ".autopush_connection.ini"), "msg_limit = 50\n")
    child = spawn(process.execPath, [
      join(root, "src/bin/autopush.ts"),
      "--port", String(ports.ws), "--router-port", String(ports.router), "--endpoint-port", String(ports.endpoint),
      "--endpoint-hostname", "127.0.0.1", "--bind-host", "127.0.0.1"
    ], { cwd, stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, HOME: cwd, AUTOPUSH_COMMIT: "" } })
    let rest = ""
    child.stdout!.on("data", (chunk: Buffer) => {
      const parts = (rest + chunk.toString()).split("\n")
      rest = parts.pop() ?? ""
      for (const part of parts) if (part.startsWith("{")) lines.push(JSON.parse(part) as LogLine)
    })
    const deadline = Date.now() + 30_000
    while (!lines.some((l) => l.Fields.msg.startsWith("ready:"))) {
      if (Date.now() > deadline || child.exitCode !== null) throw new Error(`no ready line; got ${JSON.stringify(lines)}`)
      await new Promise((r) => setTimeout(r, 100))
    }
  }, 60_000)
  afterAll(async () => {
    if (child !== undefined && child.exitCode === null) {
      const exited = new Promise((resolve) => child.once("exit", resolve))
      child.kill("SIGTERM")
      await exited
    }
    rmSync(cwd, { recursive: true, force: true })
  })

  it("says it is ready in one line, with the WebSocket, the Web Push API and the console URLs, and every port it listens on", async () => {
    const ready = lines.filter((l) => l.Fields.msg.startsWith("ready:"))
    expect(ready).toHaveLength(1)
    const line = ready[0]!.Fields.msg
    expect(line.startsWith(
      `ready: WebSocket ws://127.0.0.1:${ports.ws}/ · Web Push API http://127.0.0.1:${ports.endpoint}/wpush/… · web console http://127.0.0.1:${ports.endpoint}/ (public) · ` +
        `storage ${join(cwd, "data", "autopush.sqlite")} (SQLite, no port) · listening: ` +
        `WebSocket on 127.0.0.1:${ports.ws}, Web Push API on 127.0.0.1:${ports.endpoint}, router on 127.0.0.1:${ports.router} (private)`
    ), line).toBe(true)
    // The store is the file it names.
    expect(existsSync(join(cwd, "data", "autopush.sqlite"))).toBe(true)
  })

  it("logs the ini files it read and only the settings that differ from the defaults", () => {
    const starting = lines.find((l) => l.Fields.msg === "starting")!
    expect(starting.Fields["config_files"]).toEqual([join(cwd, ".autopush_connection.ini")])
    const changed = starting.Fields["settings_changed"] as Record<string, unknown>
    expect(changed["msg_limit"]).toBe(50)
    expect(changed["port"]).toBe(ports.ws)
    expect(changed["endpoint_url"]).toBe(`http://127.0.0.1:${ports.endpoint}`)
    expect(changed["crypto_key"]).toBe("[redacted: 1 key]")
    expect(changed).not.toHaveProperty("hello_timeout")
    expect(changed).not.toHaveProperty("router_tablename")
    expect(Object.keys(changed).length).toBeLessThan(15)
    expect(JSON.stringify(starting)).not.toContain(JSON.parse(readFileSync(join(cwd, "data/secrets.json"), "utf8")).crypto_key[0])
  })

  it("/__version__ reports the package version and the checkout's commit", async () => {
    const version = await (await fetch(`http://127.0.0.1:${ports.endpoint}/__version__`)).json() as Record<string, string>
    expect(version["version"]).toBe((JSON.parse(readFileSync(join(root, "package.json"), "utf8")) as { version: string }).version)
    expect(version["commit"]).toBe(execFileSync("git", ["rev-parse", "HEAD"], { cwd: root, encoding: "utf8" }).trim())
  })

  it("serves the console at / (and 204 for the browser's favicon) and answers an unknown path with the JSON error body", async () => {
    const page = await fetch(`http://127.0.0.1:${ports.endpoint}/`)
    expect(page.status).toBe(200)
    expect(await page.text()).toContain("autopush-ts console")
    expect((await fetch(`http://127.0.0.1:${ports.endpoint}/favicon.ico`)).status).toBe(204)
    const unknown = await fetch(`http://127.0.0.1:${ports.endpoint}/no-such-page`)
    expect(unknown.status).toBe(404)
    expect(await unknown.json()).toMatchObject({ code: 404, errno: null, error: "Not Found" })
  })
})
