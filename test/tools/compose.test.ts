/**
 * docker-compose.yml and the Dockerfile, checked without Docker (it does not run here): the three
 * services, images and build, published and private ports, the shared CRYPTO_KEY, an auth key of
 * its own, storage on the PostgreSQL service, every AUTO*__ variable a known option, and the
 * settings each node would actually load from its environment after compose's interpolation.
 */
import { existsSync, mkdtempSync, readdirSync, readFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import { parse } from "yaml"
import { loadSettings } from "../../src/config/index.ts"
import { envNamesOf, optionNames, type Role } from "../../src/config/options.ts"
import { generateFernetKey } from "../../src/crypto/fernet.ts"

const root = new URL("../../", import.meta.url).pathname
const read = (path: string): string => readFileSync(join(root, path), "utf8")

interface Service {
  readonly image?: string
  readonly build?: string | { readonly context: string }
  readonly command?: ReadonlyArray<string> | string
  readonly environment?: Readonly<Record<string, string>>
  readonly ports?: ReadonlyArray<string>
  readonly expose?: ReadonlyArray<string>
  readonly depends_on?: Readonly<Record<string, { readonly condition: string }>>
  readonly healthcheck?: { readonly test: ReadonlyArray<string> }
  readonly volumes?: ReadonlyArray<string>
}

const compose = parse(read("docker-compose.yml")) as { services: Record<string, Service>; volumes?: Record<string, unknown> }
const services = compose.services
const nodes = { autoconnect: services["autoconnect"]!, autoendpoint: services["autoendpoint"]! } as const

/**
 * Compose's interpolation: `$$`, `${VAR}`, `${VAR:-default}`, `${VAR-default}`, `${VAR:?error}`,
 * `${VAR?error}`, nested defaults, and `$VAR`.
 */
const interpolate = (text: string, env: Readonly<Record<string, string | undefined>>): string => {
  let out = ""
  for (let i = 0; i < text.length; i++) {
    const c = text[i]
    if (c !== "$") {
      out += c
      continue
    }
    const next = text[i + 1]
    if (next === "$") {
      out += "$"
      i++
    } else if (next === "{") {
      let depth = 1
      let j = i + 2
      for (; j < text.length && depth > 0; j++) {
        if (text[j] === "{") depth++
        else if (text[j] === "}") depth--
      }
      if (depth !== 0) throw new Error(`unterminated \${ in ${text}`)
      const body = text.slice(i + 2, j - 1)
      const [, name = "", op, rest = ""] = /^([A-Za-z_][A-Za-z0-9_]*)(:?[-?])?(.*)$/s.exec(body) ?? []
      if (name === "") throw new Error(`bad variable \${${body}}`)
      const value = env[name]
      const unset = op?.startsWith(":") ? value === undefined || value === "" : value === undefined
      if (op === undefined) out += value ?? ""
      else if (op.endsWith("-")) out += unset ? interpolate(rest, env) : value
      else if (unset) throw new Error(`required variable ${name} is missing: ${interpolate(rest, env)}`)
      else out += value
      i = j - 1
    } else {
      const [name = ""] = /^[A-Za-z_][A-Za-z0-9_]*/.exec(text.slice(i + 1)) ?? []
      out += env[name] ?? ""
      i += name.length
    }
  }
  return out
}

const environmentOf = (service: Service, env: Readonly<Record<string, string>>): Record<string, string> =>
  Object.fromEntries(Object.entries(service.environment ?? {}).map(([key, value]) => [key, interpolate(String(value), env)]))

/** `[ip:]host:container` → container port, and the host part. */
const portMapping = (spec: string) => {
  const parts = spec.split(":")
  return { container: parts.at(-1)!, host: parts.at(-2), ip: parts.length === 3 ? parts[0] : undefined }
}

const settingsOf = (role: Role, env: Record<string, string>, argv: ReadonlyArray<string> = []) => {
  const dir = mkdtempSync(join(tmpdir(), "autopush-compose-"))
  return Effect.runPromise(loadSettings({ role, argv, env, cwd: dir, home: dir, etcDir: dir }))
}

describe("docker-compose.yml", () => {
  it("has a connection node, an endpoint node and PostgreSQL (the official image), started once it answers", () => {
    expect(Object.keys(services).sort()).toEqual(["autoconnect", "autoendpoint", "postgres"])
    expect(services["postgres"]?.image).toMatch(/^postgres:\d+$/)
    expect(services["postgres"]?.healthcheck?.test).toEqual(expect.arrayContaining(["pg_isready"]))
    for (const [name, node] of Object.entries(nodes)) {
      const context = typeof node.build === "string" ? node.build : node.build?.context
      expect(context, name).toBe(".")
      expect(node.depends_on?.["postgres"]?.condition, name).toBe("service_healthy")
    }
  })

  it("keeps PostgreSQL's data on a named volume (docker compose down keeps the subscriptions)", () => {
    const mounts = (services["postgres"]?.volumes ?? []).map((spec) => spec.split(":"))
    const volume = mounts.find(([, target]) => target === "/var/lib/postgresql/data")?.[0]
    expect(volume, "a volume mounted at /var/lib/postgresql/data").toBeDefined()
    expect(Object.keys(compose.volumes ?? {})).toContain(volume)
  })

  it("runs the entrypoints that exist, one per node", () => {
    expect(nodes.autoconnect.command).toEqual(["node", "src/bin/autoconnect.ts"])
    expect(nodes.autoendpoint.command).toEqual(["node", "src/bin/autoendpoint.ts"])
    for (const node of Object.values(nodes)) expect(existsSync(join(root, String(node.command?.[1])))).toBe(true)
  })

  it("publishes 8080 and 8082 as autopush does; the router port 8081 stays on the compose network", () => {
    expect(nodes.autoconnect.ports?.map(portMapping)).toEqual([{ container: "8080", host: "8080", ip: undefined }])
    expect(nodes.autoendpoint.ports?.map(portMapping)).toEqual([{ container: "8082", host: "8082", ip: undefined }])
    expect(nodes.autoconnect.expose).toEqual(["8081"])
    for (const service of Object.values(services)) {
      for (const spec of service.ports ?? []) expect(portMapping(spec).container).not.toBe("8081")
    }
    // PostgreSQL, for the tools, on the loopback only.
    expect(services["postgres"]?.ports?.map(portMapping)).toEqual([{ container: "5432", host: "5432", ip: "127.0.0.1" }])
  })

  it("shares one CRYPTO_KEY from the environment, and refuses to start without it", () => {
    const raw = nodes.autoconnect.environment?.["CRYPTO_KEY"]
    expect(raw).toMatch(/^\$\{CRYPTO_KEY:\?[^}]+\}$/)
    expect(nodes.autoendpoint.environment?.["CRYPTO_KEY"]).toBe(raw)
    expect(() => environmentOf(nodes.autoconnect, {})).toThrow(/required variable CRYPTO_KEY is missing: .*npm run autokey/)
  })

  it("uses only AUTO*__ variables that are options the node reads", () => {
    for (const [role, node] of Object.entries(nodes) as Array<[Role, Service]>) {
      const known = new Set(optionNames.flatMap((name) => envNamesOf(name, role)))
      for (const key of Object.keys(node.environment ?? {})) {
        expect(known.has(key), `${role}: ${key}`).toBe(true)
      }
    }
  })

  it("gives the endpoint node an auth key of its own, and refuses to start without it (never the crypto key)", () => {
    expect(nodes.autoendpoint.environment?.["AUTOEND__AUTH_KEYS"]).toMatch(/^\$\{AUTH_KEYS:\?[^}]+\}$/)
    expect(() => environmentOf(nodes.autoendpoint, { CRYPTO_KEY: generateFernetKey(), POSTGRES_PASSWORD: "p" })).toThrow(/required variable AUTH_KEYS is missing/)
  })

  it("gives each node settings that load: storage on the PostgreSQL service, same key and endpoint URL, ports as published", async () => {
    const key = generateFernetKey()
    const authKey = generateFernetKey()
    const password = generateFernetKey()
    const env = { CRYPTO_KEY: key, AUTH_KEYS: authKey, POSTGRES_PASSWORD: password }
    expect(() => environmentOf(nodes.autoconnect, { CRYPTO_KEY: key })).toThrow(/required variable POSTGRES_PASSWORD is missing/)
    expect(environmentOf(services["postgres"]!, env)["POSTGRES_PASSWORD"]).toBe(password)
    const connection = await settingsOf("autoconnect", environmentOf(nodes.autoconnect, env))
    const endpoint = await settingsOf("autoendpoint", environmentOf(nodes.autoendpoint, env))
    const postgres = environmentOf(services["postgres"]!, env)
    for (const settings of [connection, endpoint]) {
      const dsn = new URL(settings.dbDsn ?? "")
      expect(dsn.protocol).toBe("postgres:")
      expect(dsn.host).toBe("postgres:5432")
      expect(decodeURIComponent(dsn.username)).toBe(postgres["POSTGRES_USER"])
      expect(decodeURIComponent(dsn.password)).toBe(password)
      expect(dsn.pathname).toBe(`/${postgres["POSTGRES_DB"]}`)
      expect(settings.storageEndpoint).toBeUndefined()
      expect(settings.cryptoKey).toEqual([key])
      expect(settings.endpointUrl).toBe("http://localhost:8082")
    }
    expect(connection.port).toBe(8080)
    expect(connection.routerUrl).toBe("http://autoconnect:8081")
    expect(endpoint.endpointPort).toBe(8082)
    expect(endpoint.authKeys).toEqual([authKey])
    const own = await settingsOf("autoendpoint", environmentOf(nodes.autoendpoint, { ...env, AUTH_KEYS: "[a,b]", ENDPOINT_HOSTNAME: "push.example.com" }))
    expect(own.authKeys).toEqual(["a", "b"])
    expect(own.endpointUrl).toBe("http://push.example.com:8082")
  })

  it("interpolates as compose does", () => {
    expect(interpolate("a$$b ${X} ${Y:-d} ${Z-${X}} $X", { X: "x", Z: "" })).toBe("a$b x d  x")
    expect(interpolate("${Y:-${X:-q}}", {})).toBe("q")
    expect(() => interpolate("${Y?gone}", {})).toThrow("gone")
  })
})

describe("Dockerfile", () => {
  const dockerfile = read("Dockerfile")
  const instructions = dockerfile
    .replace(/\\\n/g, " ")
    .split("\n")
    .map((line) => line.trim())
    .filter((line) => line !== "" && !line.startsWith("#"))
  const args = (instruction: string) => instructions.filter((line) => line.startsWith(`${instruction} `)).map((line) => line.slice(instruction.length + 1))

  it("builds on node:24 with npm ci and copies sources that exist", () => {
    expect(args("FROM")).toEqual([expect.stringMatching(/^node:24(-[a-z]+)*$/)])
    expect(args("RUN").some((run) => /\bnpm ci\b/.test(run))).toBe(true)
    // The base image's Node runs it: the `node` package's install script would download another.
    expect(args("RUN").filter((run) => /\bnpm ci\b/.test(run)).every((run) => run.includes("--ignore-scripts"))).toBe(true)
    const copies = args("COPY").flatMap((copy) => copy.split(/\s+/).slice(0, -1))
    expect(copies).toEqual(expect.arrayContaining(["package.json", "package-lock.json", "src"]))
    for (const path of copies) expect(existsSync(join(root, path)), path).toBe(true)
    expect(args("EXPOSE")).toEqual(["8080 8081 8082"])
  })

  it("runs an entrypoint that exists; every package src/ imports survives npm ci --omit=dev", () => {
    const cmd = JSON.parse(args("CMD")[0] ?? "[]") as Array<string>
    expect(cmd[0]).toBe("node")
    expect(existsSync(join(root, cmd[1] ?? ""))).toBe(true)
    expect(args("RUN").some((run) => run.includes("--omit=dev"))).toBe(true)
    const pkg = JSON.parse(read("package.json")) as { dependencies: Record<string, string> }
    const imported = new Set<string>()
    for (const file of readdirSync(join(root, "src"), { recursive: true, encoding: "utf8" })) {
      if (!file.endsWith(".ts") || file.endsWith(".d.ts")) continue
      const source = read(join("src", file))
      const specs = [
        ...source.matchAll(/^\s*(?:import|export)\b[\s\S]*?\bfrom\s+["']([^"']+)["']/gm),
        ...source.matchAll(/^\s*import\s+["']([^"']+)["']/gm),
        ...source.matchAll(/\bimport\(\s*["']([^"']+)["']\s*\)/g)
      ].map((match) => match[1] ?? "")
      for (const spec of specs) {
        if (spec.startsWith(".") || spec.startsWith("node:")) continue
        imported.add(spec.startsWith("@") ? spec.split("/").slice(0, 2).join("/") : spec.split("/")[0]!)
      }
    }
    expect([...imported]).toEqual(expect.arrayContaining(["effect", "@aws-sdk/client-dynamodb", "dynalite"]))
    for (const name of imported) expect(Object.keys(pkg.dependencies), name).toContain(name)
  })

  it("keeps node_modules, data and the git history out of the build context", () => {
    const ignored = read(".dockerignore").split("\n").map((line) => line.trim())
    expect(ignored).toEqual(expect.arrayContaining([".git", "node_modules", "data"]))
  })
})
