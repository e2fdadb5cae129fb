import { Duration, Option, Schema } from "effect"
import { assert, describe, it } from "@effect/vitest"
import { helpText, optionsTable } from "../../src/config/docs.ts"
import {
  boolean,
  envNamesOf,
  fernetKeys,
  flagOf,
  host,
  integer,
  oneOf,
  optionNames,
  options,
  optionsOf,
  roleScopes,
  secretOptionNames,
  seconds,
  splitList,
  url
} from "../../src/config/options.ts"
import type { Kind, SecretOption } from "../../src/config/options.ts"
import { makeSettings } from "../../src/config/load.ts"
import { KEY1 } from "./sandbox.ts"

const decode = <A>(kind: Kind<A>, raw: string): A | undefined => Option.getOrUndefined(Schema.decodeUnknownOption(kind.codec)(raw))

describe("kinds", () => {
  it("integers within their range", () => {
    const k = integer(1, 10)
    assert.deepStrictEqual(["1", "10", "+7", "0", "11", "1.5", "1e1", "0x5", "", " 5"].map((raw) => decode(k, raw)), [1, 10, 7, undefined, undefined, undefined, undefined, undefined, undefined, undefined])
  })

  it("seconds, with fractions and units", () => {
    const ms = (raw: string) => {
      const d = decode(seconds, raw)
      return d === undefined ? undefined : Duration.toMillis(d)
    }
    assert.deepStrictEqual(
      ["5", "0.5", ".25", "300ms", "2 s", "5m", "1h", "30d", "0", "-1", "5x", "soon", "1.2.3"].map(ms),
      [5000, 500, 250, 300, 2000, 300_000, 3_600_000, 2_592_000_000, 0, undefined, undefined, undefined, undefined]
    )
    assert.strictEqual(Schema.encodeSync(seconds.codec)(Duration.millis(1500)), "1.5")
  })

  it("booleans", () => {
    assert.deepStrictEqual(
      ["true", "FALSE", "yes", "no", "on", "off", "1", "0", "maybe"].map((raw) => decode(boolean, raw)),
      [true, false, true, false, true, false, true, false, undefined]
    )
  })

  it("enums are case-insensitive", () => {
    const k = oneOf(["http", "https"])
    assert.deepStrictEqual(["http", "HTTPS", "ftp"].map((raw) => decode(k, raw)), ["http", "https", undefined])
  })

  it("urls: http(s) only, trailing slash dropped", () => {
    assert.deepStrictEqual(
      ["http://a:1/", "https://push.example.com/base//", "ftp://a", "localhost:8000", "nope"].map((raw) => decode(url, raw)),
      ["http://a:1", "https://push.example.com/base", undefined, undefined, undefined]
    )
  })

  it("hosts", () => {
    assert.deepStrictEqual(
      ["localhost", "push-1.example.com", "10.0.0.1", "::", "[::1]", "fe80::1", "bad host", "a/b", "-x"].map((raw) => decode(host, raw) !== undefined),
      [true, true, true, true, true, true, false, false, false]
    )
  })

  it("lists and Fernet keys", () => {
    assert.deepStrictEqual(splitList(`[a, "b" ,'c',]`), ["a", "b", "c"])
    assert.deepStrictEqual(splitList("a"), ["a"])
    assert.deepStrictEqual(splitList("[]"), [])
    assert.deepStrictEqual(decode(fernetKeys, `[${KEY1}]`), [KEY1])
    assert.deepStrictEqual(decode(fernetKeys, KEY1.slice(0, -1)), [KEY1.slice(0, -1)])
    assert.strictEqual(decode(fernetKeys, `${KEY1},short`), undefined)
    assert.strictEqual(decode(fernetKeys, KEY1.replace("h", "+")), undefined)
  })
})

describe("the table", () => {
  it("the SecretOption type lists exactly the secret options", () => {
    const secrets: ReadonlyArray<SecretOption> = ["crypto_key", "auth_keys", "megaphone_api_token", "broadcast_admin_tokens", "console_token", "fcm_credentials", "apns_channels", "adm_credentials", "endpoint_tls_key", "db_dsn"]
    assert.deepStrictEqual([...secretOptionNames].sort(), [...secrets].sort())
  })

  it("names, flags and environment names are unique; every option is described", () => {
    const envs = optionNames.flatMap((name) => envNamesOf(name))
    assert.strictEqual(new Set(envs).size, envs.length)
    assert.strictEqual(new Set(optionNames.map(flagOf)).size, optionNames.length)
    for (const name of optionNames) {
      assert.match(name, /^[a-z][a-z0-9_]*$/)
      assert.isAbove(options[name].description.length, 10, name)
    }
  })

  it("optionsTable has one row per option, with env names and flag", () => {
    const rows = optionsTable()
    assert.deepStrictEqual(rows.map((row) => row.name), [...optionNames])
    const port = rows.find((row) => row.name === "port")
    assert.deepStrictEqual(port && { ...port }, {
      name: "port",
      scope: "connection",
      file: "autopush_connection.ini",
      type: "integer 1-65535",
      default: "8080",
      description: "Port of the public WebSocket server",
      secret: false,
      env: ["AUTOCONNECT__PORT"],
      flag: "--port"
    })
    const crypto = rows.find((row) => row.name === "crypto_key")
    assert.deepStrictEqual(crypto?.env, ["AUTOPUSH__CRYPTO_KEY", "AUTOCONNECT__CRYPTO_KEY", "AUTOEND__CRYPTO_KEY", "CRYPTO_KEY", "AUTOEND__CRYPTO_KEYS"])
    assert.strictEqual(rows.find((row) => row.name === "hostname")?.default, "this machine's hostname")
    assert.strictEqual(rows.find((row) => row.name === "max_notification_ttl")?.default, "2592000")
  })

  it("helpText lists exactly the options of the role, with defaults", () => {
    for (const role of ["autopush", "autoconnect", "autoendpoint"] as const) {
      const text = helpText(role)
      const mine = new Set(optionsOf(roleScopes[role]))
      for (const name of optionNames) {
        // The whole flag: `--max-connections` is not `--max-connections-per-address`.
        assert.strictEqual(new RegExp(`^  ${flagOf(name)}(?![\\w-])`, "m").test(text), mine.has(name), `${role} ${name}`)
      }
    }
    assert.include(helpText("autoconnect"), "default: 8080; env: AUTOCONNECT__PORT")
    assert.include(helpText("autoconnect"), "env: AUTOPUSH__CRYPTO_KEY, AUTOCONNECT__CRYPTO_KEY, CRYPTO_KEY\n")
    assert.include(helpText("autoendpoint"), "--config-endpoint PATH")
    assert.notInclude(helpText("autoendpoint"), "--config-connection")
  })
})

describe("Settings type", () => {
  it("fields are typed from the table", () => {
    const s = makeSettings()
    const typed: {
      port: number
      helloTimeout: Duration.Duration
      cryptoKey: ReadonlyArray<string>
      statsdHost: string | undefined
      endpointScheme: "http" | "https"
      logLevel: "trace" | "debug" | "info" | "warn" | "error"
      endpointUrl: string
      routerUrl: string
      noTableRotation: boolean
    } = s
    assert.strictEqual(typed.port, 8080)
    // @ts-expect-error unset options stay optional in the type
    const host: string = s.statsdHost
    assert.strictEqual(host, undefined)
  })
})
