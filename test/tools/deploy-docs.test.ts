/**
 * The deployment recipes agree: the systemd unit's commented proxy lines (and docs/systemd.md) set
 * every option docs/tls.md sets for a server behind a TLS proxy — `trusted_proxies` among them,
 * without which no sender has a per-address rate limit — and the values parse.
 */
import { readFileSync } from "node:fs"
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import { loadSettings } from "../../src/config/index.ts"

const read = (path: string) => readFileSync(new URL(`../../${path}`, import.meta.url), "utf8")

/** `name = value` lines of the first ```ini block of docs/tls.md. */
const tlsIni = (): Map<string, string> => {
  const block = /```ini\n([\s\S]*?)```/.exec(read("docs/tls.md"))?.[1] ?? ""
  return new Map(block.split("\n").filter((l) => l.includes("=")).map((l) => l.split("=").map((p) => p.trim()) as [string, string]))
}

/** `AUTOPUSH__NAME=value` of the `Environment=` lines of `text`, commented or not. */
const environment = (text: string): Map<string, string> =>
  new Map([...text.matchAll(/^\s*#?\s*Environment=AUTOPUSH__([A-Z_]+)=(\S+)$/gm)].map((m) => [m[1]!.toLowerCase(), m[2]!]))

describe("deployment recipes", () => {
  it("the systemd unit and docs/systemd.md set what docs/tls.md sets behind a proxy, trusted_proxies included", async () => {
    const ini = tlsIni()
    expect([...ini.keys()]).toContain("trusted_proxies")
    for (const source of ["deploy/autopush.service", "docs/systemd.md"]) {
      const env = environment(read(source))
      for (const [name, value] of ini) expect(env.get(name), `${source}: ${name}`).toBe(value)
    }
    const settings = await Effect.runPromise(loadSettings({
      role: "autopush",
      argv: [],
      env: Object.fromEntries([...environment(read("deploy/autopush.service"))].map(([k, v]) => [`AUTOPUSH__${k.toUpperCase()}`, v])),
      cwd: "/nonexistent",
      home: "/nonexistent"
    }))
    expect(settings.trustedProxies).toEqual(["127.0.0.1"])
    expect(settings.endpointUrl).toBe("https://push.example.com")
  })
})
