import { hostname } from "node:os"
import { join } from "node:path"
import { Duration, Effect } from "effect"
import { assert, describe, it } from "@effect/vitest"
import { makeSettings, redactedSettings, requireSecrets } from "../../src/config/load.ts"
import { DASHED_KEY, KEY1, KEY2, sandbox } from "./sandbox.ts"

describe("defaults", () => {
  it.effect("every option has its default and the derived URLs are built", () =>
    Effect.gen(function*() {
      const box = sandbox()
      const s = yield* box.load("autopush")
      assert.strictEqual(s.hostname, hostname())
      assert.deepStrictEqual(s.cryptoKey, [])
      assert.deepStrictEqual(s.authKeys, [])
      assert.strictEqual(s.routerTablename, "router")
      assert.strictEqual(s.messageTablename, "message")
      assert.strictEqual(s.noTableRotation, false)
      assert.strictEqual(s.storageEndpoint, undefined)
      assert.strictEqual(s.awsRegion, "us-east-1")
      assert.strictEqual(s.dataDir, join(box.cwd, "data"))
      assert.strictEqual(s.endpointScheme, "http")
      assert.strictEqual(s.endpointHostname, "localhost")
      assert.strictEqual(s.endpointPort, 8082)
      assert.strictEqual(s.endpointUrl, "http://localhost:8082")
      assert.strictEqual(s.bindHost, "0.0.0.0")
      assert.strictEqual(s.statsdHost, undefined)
      assert.strictEqual(s.statsdPort, 8125)
      // Lines for a terminal, records for a pipe (the test runner's stdout is either).
      assert.strictEqual(s.humanLogs, process.stdout.isTTY === true)
      assert.strictEqual(s.logLevel, "info")
      assert.strictEqual(Duration.toSeconds(s.maxNotificationTtl), 2_592_000)
      assert.strictEqual(Duration.toSeconds(s.shutdownTimeout), 10)
      assert.strictEqual(s.eventLog, undefined)
      assert.strictEqual(s.port, 8080)
      assert.strictEqual(s.routerPort, 8081)
      assert.strictEqual(s.routerScheme, "http")
      assert.strictEqual(s.routerHostname, undefined)
      assert.strictEqual(s.routerUrl, `http://${hostname()}:8081`)
      assert.strictEqual(Duration.toSeconds(s.helloTimeout), 5)
      assert.strictEqual(Duration.toSeconds(s.autoPingInterval), 300)
      assert.strictEqual(Duration.toSeconds(s.autoPingTimeout), 4)
      assert.strictEqual(Duration.toSeconds(s.minPingInterval), 45)
      assert.strictEqual(s.msgLimit, 100)
      assert.strictEqual(s.clientChannelCapacity, 128)
      assert.strictEqual(Duration.toSeconds(s.closeGrace), 1)
      assert.strictEqual(s.maxDataBytes, 4096)
      assert.strictEqual(Duration.toSeconds(s.connectionTimeout), 1)
      assert.strictEqual(Duration.toSeconds(s.requestTimeout), 3)
    }))

  it.effect("settings and their lists are frozen", () =>
    Effect.gen(function*() {
      const s = yield* sandbox().load("autoconnect", { env: { CRYPTO_KEY: KEY1 } })
      assert.isTrue(Object.isFrozen(s))
      assert.isTrue(Object.isFrozen(s.cryptoKey))
    }))

  it("makeSettings applies overrides and derives from them", () => {
    const s = makeSettings({ endpoint_hostname: "push.example.com", endpoint_scheme: "https", endpoint_port: 443, router_port: 9001 })
    assert.strictEqual(s.endpointUrl, "https://push.example.com")
    assert.strictEqual(s.routerUrl, `http://${hostname()}:9001`)
    assert.strictEqual(s.port, 8080)
  })
})

describe("precedence: defaults < ini < environment < flags", () => {
  const run = (box: ReturnType<typeof sandbox>, env: boolean, flag: boolean) =>
    box.load("autoconnect", {
      env: env ? { AUTOCONNECT__ROUTER_PORT: "1002" } : {},
      argv: flag ? ["--router-port", "1003"] : []
    })

  it.effect("each higher source wins", () =>
    Effect.gen(function*() {
      const box = sandbox()
      assert.strictEqual((yield* run(box, false, false)).routerPort, 8081)
      box.write(join(box.cwd, ".autopush_connection.ini"), "router_port = 1001\n")
      assert.strictEqual((yield* run(box, false, false)).routerPort, 1001)
      assert.strictEqual((yield* run(box, true, false)).routerPort, 1002)
      assert.strictEqual((yield* run(box, true, true)).routerPort, 1003)
      assert.strictEqual((yield* run(box, false, true)).routerPort, 1003)
    }))

  it.effect("within the environment: plain aliases < AUTOPUSH__ < the node's prefix", () =>
    Effect.gen(function*() {
      const box = sandbox()
      const env: Record<string, string> = { CRYPTO_KEY: KEY1 }
      assert.deepStrictEqual((yield* box.load("autoconnect", { env })).cryptoKey, [KEY1])
      env.AUTOPUSH__CRYPTO_KEY = KEY2
      assert.deepStrictEqual((yield* box.load("autoconnect", { env })).cryptoKey, [KEY2])
      env.AUTOCONNECT__CRYPTO_KEY = `${KEY1},${KEY2}`
      assert.deepStrictEqual((yield* box.load("autoconnect", { env })).cryptoKey, [KEY1, KEY2])
    }))

  it.effect("a secret from a file: KEY_FILE (Docker and systemd secrets), for every name of every secret option", () =>
    Effect.gen(function*() {
      const box = sandbox()
      const keys = box.write(join(box.cwd, "secrets/crypto_keys"), `${KEY1},${KEY2}\n`)
      const auth = box.write(join(box.cwd, "secrets/auth"), "one,two")
      const s = yield* box.load("autoendpoint", { env: { AUTOEND__CRYPTO_KEYS_FILE: keys, AUTOPUSH__AUTH_KEYS_FILE: auth } })
      assert.deepStrictEqual(s.cryptoKey, [KEY1, KEY2], "one trailing newline dropped")
      assert.deepStrictEqual(s.authKeys, ["one", "two"])
      assert.deepStrictEqual((yield* box.load("autoconnect", { env: { CRYPTO_KEY_FILE: keys } })).cryptoKey, [KEY1, KEY2])
      const both = yield* box.fail("autoconnect", { env: { CRYPTO_KEY_FILE: keys, CRYPTO_KEY: KEY1 } })
      assert.include(both.message, "CRYPTO_KEY_FILE and CRYPTO_KEY are both set")
      const missing = yield* box.fail("autoconnect", { env: { AUTOCONNECT__CRYPTO_KEY_FILE: join(box.cwd, "nope") } })
      assert.include(missing.message, "AUTOCONNECT__CRYPTO_KEY_FILE: cannot read")
      assert.include(missing.message, "ENOENT")
      // Only secrets come from files: anything else named *_FILE is an unknown variable.
      const port = yield* box.fail("autoconnect", { env: { AUTOCONNECT__PORT_FILE: keys } })
      assert.include(port.message, "unknown environment variable AUTOCONNECT__PORT_FILE")
    }))

  it.effect("a shared option in the node's ini file overrides autopush_shared.ini", () =>
    Effect.gen(function*() {
      const box = sandbox()
      box.write(join(box.cwd, ".autopush_shared.ini"), "hostname = shared-file\n")
      assert.strictEqual((yield* box.load("autoendpoint")).hostname, "shared-file")
      box.write(join(box.etc, "autopush_endpoint.ini"), "hostname = endpoint-file\n")
      assert.strictEqual((yield* box.load("autoendpoint")).hostname, "endpoint-file")
      assert.strictEqual((yield* box.load("autoconnect")).hostname, "shared-file")
    }))
})

describe("ini files", () => {
  it.effect("all four locations are read, later ones override earlier", () =>
    Effect.gen(function*() {
      const box = sandbox()
      const paths = [
        join(box.etc, "autopush_shared.ini"),
        join(box.home, ".autopush_shared.ini"),
        join(box.cwd, ".autopush_shared.ini"),
        join(box.cwd, "configs", "autopush_shared.ini")
      ]
      const options = ["aws_region", "router_tablename", "message_tablename", "statsd_host"]
      // File i sets options i.. with its own name, so each option ends with the last file that sets it.
      paths.forEach((path, i) => box.write(path, options.slice(i).map((o) => `${o} = f${i}`).join("\n")))
      const s = yield* box.load("autoendpoint")
      assert.deepStrictEqual([s.awsRegion, s.routerTablename, s.messageTablename, s.statsdHost], ["f0", "f1", "f2", "f3"])
    }))

  it.effect("format: key = value, key: value, sections, comments, bare booleans, dashes, quotes, CRLF, empty = default", () =>
    Effect.gen(function*() {
      const box = sandbox()
      box.write(
        join(box.cwd, "configs", "autopush_connection.ini"),
        [
          "# comment",
          "; router_port = 1",
          "[autoconnect]",
          "port: 9000",
          "Router-Port = 9001",
          "human_logs",
          "no-table-rotation = yes",
          "router_hostname = 'node1.internal'",
          "msg_limit =",
          "  hello_timeout = 2.5  ",
          ""
        ].join("\r\n")
      )
      const s = yield* box.load("autoconnect")
      assert.strictEqual(s.port, 9000)
      assert.strictEqual(s.routerPort, 9001)
      assert.strictEqual(s.humanLogs, true)
      assert.strictEqual(s.noTableRotation, true)
      assert.strictEqual(s.routerUrl, "http://node1.internal:9001")
      assert.strictEqual(s.msgLimit, 100)
      assert.strictEqual(Duration.toMillis(s.helloTimeout), 2500)
    }))

  it.effect("--config-* names the only file read; relative paths are relative to cwd", () =>
    Effect.gen(function*() {
      const box = sandbox()
      box.write(join(box.etc, "autopush_shared.ini"), "aws_region = from-etc\nrouter_tablename = etc-table\n")
      box.write(join(box.cwd, "my", "shared.ini"), "aws_region = named\n")
      box.write(join(box.home, "conn.ini"), "port = 9999\n")
      const s = yield* box.load("autoconnect", {
        argv: ["--config-shared", "my/shared.ini", `--config-connection=${join(box.home, "conn.ini")}`]
      })
      assert.strictEqual(s.awsRegion, "named")
      assert.strictEqual(s.routerTablename, "router")
      assert.strictEqual(s.port, 9999)
    }))

  it.effect("each role reads only its files", () =>
    Effect.gen(function*() {
      const box = sandbox()
      box.write(join(box.cwd, ".autopush_connection.ini"), "port = not-a-port\n")
      box.write(join(box.cwd, ".autopush_endpoint.ini"), "max_data_bytes = 5000\n")
      assert.strictEqual((yield* box.load("autoendpoint")).maxDataBytes, 5000)
      const err = yield* box.fail("autoconnect")
      assert.include(err.message, "port: \"not-a-port\"")
    }))

  it.effect("the all-in-one reads both node files; a shared option must agree between them", () =>
    Effect.gen(function*() {
      const box = sandbox()
      const conn = box.write(join(box.cwd, ".autopush_connection.ini"), "port = 7000\nhostname = a\n")
      const end = box.write(join(box.cwd, ".autopush_endpoint.ini"), "max_data_bytes = 5000\nhostname = a\n")
      const s = yield* box.load("autopush")
      assert.deepStrictEqual([s.port, s.maxDataBytes, s.hostname], [7000, 5000, "a"])
      box.write(end, "hostname = b\n")
      const err = yield* box.fail("autopush")
      assert.strictEqual(
        err.message,
        `hostname: "a" (from ${conn} line 2) and "b" (from ${end} line 1) disagree; autopush reads both, so set it once`
      )
    }))
})

describe("environment", () => {
  it.effect("AUTOPUSH__ sets shared options, AUTOCONNECT__ / AUTOEND__ their node's and shared ones", () =>
    Effect.gen(function*() {
      const box = sandbox()
      const env = {
        AUTOPUSH__AWS_REGION: "eu-west-1",
        AUTOCONNECT__PORT: "9000",
        AUTOCONNECT__HUMAN_LOGS: "true",
        AUTOEND__MAX_DATA_BYTES: "8192",
        AUTOEND__LOG_LEVEL: "debug",
        PATH: "/usr/bin",
        HOME: "/root"
      }
      const connection = yield* box.load("autoconnect", { env })
      assert.deepStrictEqual(
        [connection.awsRegion, connection.port, connection.humanLogs, connection.maxDataBytes, connection.logLevel],
        ["eu-west-1", 9000, true, 4096, "info"]
      )
      const endpoint = yield* box.load("autoendpoint", { env })
      assert.deepStrictEqual(
        [endpoint.awsRegion, endpoint.port, endpoint.humanLogs, endpoint.maxDataBytes, endpoint.logLevel],
        ["eu-west-1", 8080, false, 8192, "debug"]
      )
      const all = yield* box.load("autopush", { env })
      assert.deepStrictEqual([all.port, all.humanLogs, all.maxDataBytes, all.logLevel], [9000, true, 8192, "debug"])
    }))

  it.effect("autopush-rs' endpoint names: AUTOEND__PORT, __HOST, __SCHEME, __ENDPOINT_URL (canonical names win)", () =>
    Effect.gen(function*() {
      const box = sandbox()
      const env = { AUTOEND__PORT: "9082", AUTOEND__HOST: "push.example.com", AUTOEND__SCHEME: "https" }
      const endpoint = yield* box.load("autoendpoint", { env })
      assert.deepStrictEqual(
        [endpoint.endpointPort, endpoint.endpointHostname, endpoint.endpointScheme, endpoint.endpointUrl, endpoint.port],
        [9082, "push.example.com", "https", "https://push.example.com:9082", 8080]
      )
      const url = yield* box.load("autoendpoint", { env: { ...env, AUTOEND__ENDPOINT_URL: "https://push.example.org" } })
      assert.strictEqual(url.endpointUrl, "https://push.example.org")
      const canonical = yield* box.load("autoendpoint", { env: { ...env, AUTOEND__ENDPOINT_PORT: "9999" } })
      assert.strictEqual(canonical.endpointPort, 9999)
    }))

  it.effect("the all-in-one rejects AUTOCONNECT__ and AUTOEND__ values that disagree", () =>
    Effect.gen(function*() {
      const box = sandbox()
      const env = { AUTOCONNECT__HOSTNAME: "a", AUTOEND__HOSTNAME: "a" }
      assert.strictEqual((yield* box.load("autopush", { env })).hostname, "a")
      const err = yield* box.fail("autopush", { env: { ...env, AUTOEND__HOSTNAME: "b" } })
      assert.strictEqual(
        err.message,
        `hostname: "a" (from environment AUTOCONNECT__HOSTNAME) and "b" (from environment AUTOEND__HOSTNAME) disagree; autopush reads both, so set it once`
      )
      const secret = yield* box.fail("autopush", { env: { AUTOCONNECT__CRYPTO_KEY: KEY1, AUTOEND__CRYPTO_KEY: KEY2 } })
      assert.include(secret.message, "crypto_key: (secret value) (from environment AUTOCONNECT__CRYPTO_KEY)")
      assert.notInclude(secret.message, KEY1)
    }))

  it.effect("aliases: CRYPTO_KEY, AUTOEND__CRYPTO_KEYS, AUTOEND__AUTH_KEYS, AUTOCONNECT__OPEN_HANDSHAKE_TIMEOUT, AWS_*", () =>
    Effect.gen(function*() {
      const box = sandbox()
      const env = {
        CRYPTO_KEY: KEY1,
        AUTOEND__CRYPTO_KEYS: `[${KEY2}]`,
        AUTOEND__AUTH_KEYS: "[one,two]",
        AUTOCONNECT__OPEN_HANDSHAKE_TIMEOUT: "7",
        AWS_REGION: "ap-south-1",
        AWS_ENDPOINT_URL_DYNAMODB: "http://dynamodb:8000/"
      }
      const connection = yield* box.load("autoconnect", { env })
      assert.deepStrictEqual(connection.cryptoKey, [KEY1])
      assert.deepStrictEqual(connection.authKeys, [])
      assert.strictEqual(Duration.toSeconds(connection.helloTimeout), 7)
      assert.strictEqual(connection.awsRegion, "ap-south-1")
      assert.strictEqual(connection.storageEndpoint, "http://dynamodb:8000")
      const endpoint = yield* box.load("autoendpoint", { env })
      assert.deepStrictEqual(endpoint.cryptoKey, [KEY2])
      assert.deepStrictEqual(endpoint.authKeys, ["one", "two"])
    }))

  it.effect("a canonical name wins over its alias; AUTOPUSH__STORAGE_ENDPOINT over AWS_ENDPOINT_URL_DYNAMODB", () =>
    Effect.gen(function*() {
      const s = yield* sandbox().load("autoconnect", {
        env: {
          AUTOCONNECT__OPEN_HANDSHAKE_TIMEOUT: "7",
          AUTOCONNECT__HELLO_TIMEOUT: "3",
          AWS_ENDPOINT_URL_DYNAMODB: "http://aws-var:8000",
          AUTOPUSH__STORAGE_ENDPOINT: "http://autopush-var:8000"
        }
      })
      assert.strictEqual(Duration.toSeconds(s.helloTimeout), 3)
      assert.strictEqual(s.storageEndpoint, "http://autopush-var:8000")
    }))

  it.effect("an empty variable resets the option to its default", () =>
    Effect.gen(function*() {
      const box = sandbox()
      box.write(join(box.cwd, ".autopush_shared.ini"), "statsd_host = statsd\n")
      const s = yield* box.load("autoconnect", { env: { AUTOPUSH__STATSD_HOST: "" } })
      assert.strictEqual(s.statsdHost, undefined)
    }))
})

describe("trusted_proxies", () => {
  it.effect("addresses and CIDR blocks of both families; anything else is a configuration error", () =>
    Effect.gen(function*() {
      const box = sandbox()
      const s = yield* box.load("autoendpoint", { argv: ["--trusted-proxies", "10.0.0.0/8, 192.0.2.1, fd00::/8, ::1"] })
      assert.deepStrictEqual(s.trustedProxies, ["10.0.0.0/8", "192.0.2.1", "fd00::/8", "::1"])
      for (const bad of ["10.0.0.0/33", "proxy.example.com", "10.0.0.1/8/1", "fd00::/129"]) {
        const error = yield* box.fail("autoendpoint", { argv: ["--trusted-proxies", bad] })
        assert.include(error.message, "trusted_proxies", bad)
        assert.include(error.message, "a list of IP addresses or CIDR blocks", bad)
      }
    }))
})

describe("human_logs", () => {
  const withStdoutTty = <A, E, R>(tty: boolean, effect: Effect.Effect<A, E, R>) =>
    Effect.acquireUseRelease(
      Effect.sync(() => {
        const was = process.stdout.isTTY
        process.stdout.isTTY = tty
        return was
      }),
      () => effect,
      (was) => Effect.sync(() => void (process.stdout.isTTY = was))
    )

  it.effect("lines on a terminal, records on a pipe, unless set", () =>
    Effect.gen(function*() {
      const box = sandbox()
      assert.strictEqual((yield* withStdoutTty(true, box.load("autopush"))).humanLogs, true)
      assert.strictEqual((yield* withStdoutTty(false, box.load("autopush"))).humanLogs, false)
      const forced = yield* withStdoutTty(true, box.load("autopush", { argv: ["--human-logs=false"] }))
      assert.strictEqual(forced.humanLogs, false)
      const asked = yield* withStdoutTty(false, box.load("autopush", { env: { AUTOPUSH__HUMAN_LOGS: "true" } }))
      assert.strictEqual(asked.humanLogs, true)
    }))
})

describe("flags", () => {
  it.effect("--name value, --name=value, underscores, booleans with an optional value", () =>
    Effect.gen(function*() {
      const box = sandbox()
      const s = yield* box.load("autoconnect", {
        argv: ["--port", "9000", "--router-port=9001", "--msg_limit", "5", "--human-logs", "--no-table-rotation=false", "--event-log", "-"]
      })
      assert.deepStrictEqual([s.port, s.routerPort, s.msgLimit, s.humanLogs, s.noTableRotation, s.eventLog], [9000, 9001, 5, true, false, "-"])
      const t = yield* box.load("autoconnect", { argv: ["--no-table-rotation", "--human-logs=off", "--port=1", "--port=2"] })
      assert.deepStrictEqual([t.noTableRotation, t.humanLogs, t.port], [true, false, 2])
    }))

  it.effect("--help asks for the help text of the role", () =>
    Effect.gen(function*() {
      const err = yield* sandbox().fail("autoendpoint", { argv: ["--port", "x", "--help"] })
      assert.strictEqual(err._tag, "HelpRequested")
      if (err._tag === "HelpRequested") assert.include(err.text, "--max-data-bytes N")
    }))
})

describe("errors name the option and the source", () => {
  const cases: ReadonlyArray<readonly [string, string, string]> = [
    ["port", "abc", `port: "abc" is not an integer between 1 and 65535`],
    ["port", "0", `port: "0" is not an integer between 1 and 65535`],
    ["router_port", "70000", `router_port: "70000" is not an integer between 1 and 65535`],
    ["msg_limit", "1.5", `msg_limit: "1.5" is not an integer of at least 1`],
    ["msg_limit", "0", `msg_limit: "0" is not an integer of at least 1`],
    ["hello_timeout", "soon", `hello_timeout: "soon" is not a number of seconds (like 5, 0.5, 300ms, 30d)`],
    ["hello_timeout", "-1", `hello_timeout: "-1" is not a number of seconds (like 5, 0.5, 300ms, 30d)`],
    ["human_logs", "maybe", `human_logs: "maybe" is not a boolean (true/false, yes/no, on/off, 1/0)`],
    ["log_level", "loud", `log_level: "loud" is not one of trace, debug, info, warn, error`],
    ["router_scheme", "ftp", `router_scheme: "ftp" is not one of http, https`],
    ["router_url", "not a url", `router_url: "not a url" is not an http(s) URL`],
    ["storage_endpoint", "ftp://x", `storage_endpoint: "ftp://x" is not an http(s) URL`],
    ["bind_host", "bad host", `bind_host: "bad host" is not a host name or IP address`],
    ["crypto_key", "[not-a-key]", `crypto_key: (secret value) is not a list of Fernet keys`]
  ]

  it.effect("bad values, from a file line", () =>
    Effect.gen(function*() {
      for (const [option, raw, message] of cases) {
        const box = sandbox()
        const file = box.write(join(box.cwd, ".autopush_connection.ini"), `# first\n${option} = ${raw}\n`)
        const err = yield* box.fail("autoconnect")
        assert.include(err.message, message)
        assert.include(err.message, `(from ${file} line 2)`)
      }
    }))

  it.effect("bad values, from the environment and from flags", () =>
    Effect.gen(function*() {
      for (const [option, raw, message] of cases) {
        const box = sandbox()
        const variable = `AUTOCONNECT__${option.toUpperCase()}`
        const fromEnv = yield* box.fail("autoconnect", { env: { [variable]: raw } })
        assert.include(fromEnv.message, message)
        assert.include(fromEnv.message, `(from environment ${variable})`)
        const flag = `--${option.replaceAll("_", "-")}`
        const fromFlag = yield* box.fail("autoconnect", { argv: [`${flag}=${raw}`] })
        assert.include(fromFlag.message, message)
        assert.include(fromFlag.message, `(from flag ${flag})`)
      }
    }))

  it.effect("exact message of a bad integer", () =>
    Effect.gen(function*() {
      const box = sandbox()
      const file = box.write(join(box.etc, "autopush_connection.ini"), "\n\nport = abc\n")
      assert.strictEqual((yield* box.fail("autoconnect")).message, `port: "abc" is not an integer between 1 and 65535 (from ${file} line 3)`)
      assert.strictEqual(
        (yield* box.fail("autoconnect", { env: { AUTOCONNECT__PORT: "abc" } })).message,
        `port: "abc" is not an integer between 1 and 65535 (from environment AUTOCONNECT__PORT)`
      )
    }))

  it.effect("secret values are never echoed", () =>
    Effect.gen(function*() {
      const err = yield* sandbox().fail("autoconnect", { env: { CRYPTO_KEY: "[top-secret-but-wrong]" } })
      assert.notInclude(err.message, "top-secret")
      assert.include(err.message, "(from environment CRYPTO_KEY)")
    }))

  it.effect("unknown option, misplaced option and bare non-boolean in a file", () =>
    Effect.gen(function*() {
      const box = sandbox()
      const shared = box.write(join(box.home, ".autopush_shared.ini"), "hostname = h\nfoo_bar = 1\n")
      assert.strictEqual((yield* box.fail("autoconnect")).message, `unknown option "foo_bar" (from ${shared} line 2)`)
      box.write(shared, "max_data_bytes = 5000\n")
      assert.strictEqual(
        (yield* box.fail("autoendpoint")).message,
        `max_data_bytes: belongs in autopush_endpoint.ini, not autopush_shared.ini (from ${shared} line 1)`
      )
      box.write(shared, "")
      const endpoint = box.write(join(box.cwd, "configs", "autopush_endpoint.ini"), "port = 8080\n")
      assert.strictEqual(
        (yield* box.fail("autoendpoint")).message,
        `port: belongs in autopush_connection.ini, not autopush_endpoint.ini (from ${endpoint} line 1)`
      )
      box.write(endpoint, "max_data_bytes\n")
      assert.strictEqual((yield* box.fail("autoendpoint")).message, `max_data_bytes: needs a value, as in "max_data_bytes = …" (from ${endpoint} line 1)`)
    }))

  it.effect("a named file that does not exist", () =>
    Effect.gen(function*() {
      const box = sandbox()
      const err = yield* box.fail("autoendpoint", { argv: ["--config-endpoint", "missing.ini"] })
      assert.strictEqual(err.message, `--config-endpoint: ${join(box.cwd, "missing.ini")} does not exist`)
    }))

  it.effect("unknown or misplaced environment variables", () =>
    Effect.gen(function*() {
      const box = sandbox()
      const message = (env: Record<string, string>) => box.fail("autoconnect", { env }).pipe(Effect.map((e) => e.message))
      assert.strictEqual(yield* message({ AUTOPUSH__FOO: "1" }), `unknown environment variable AUTOPUSH__FOO: there is no option "foo"`)
      assert.strictEqual(yield* message({ AUTOEND__FOO: "1" }), `unknown environment variable AUTOEND__FOO: there is no option "foo"`)
      assert.strictEqual(yield* message({ AUTOPUSH__PORT: "1" }), "AUTOPUSH__PORT: port is an option of the connection node; set AUTOCONNECT__PORT instead")
      assert.strictEqual(
        yield* message({ AUTOCONNECT__MAX_DATA_BYTES: "1" }),
        "AUTOCONNECT__MAX_DATA_BYTES: max_data_bytes is an option of the endpoint node; set AUTOEND__MAX_DATA_BYTES instead"
      )
      // Known options of the other node are ignored, so one env file can serve both.
      assert.strictEqual((yield* box.load("autoconnect", { env: { AUTOEND__MAX_DATA_BYTES: "not even a number" } })).maxDataBytes, 4096)
    }))

  it.effect("unknown, misplaced and incomplete flags", () =>
    Effect.gen(function*() {
      const box = sandbox()
      const message = (...argv: Array<string>) => box.fail("autoconnect", { argv }).pipe(Effect.map((e) => e.message))
      assert.strictEqual(yield* message("--prot", "1"), "unknown flag --prot (see --help)")
      assert.strictEqual(yield* message("--max-data-bytes", "1"), "--max-data-bytes: max_data_bytes is an option of the endpoint node; autoconnect does not use it")
      assert.strictEqual(yield* message("--config-endpoint", "x.ini"), "--config-endpoint: autoconnect does not read autopush_endpoint.ini")
      assert.strictEqual(yield* message("--port"), "--port needs a value: --port N or --port=N")
      assert.strictEqual(yield* message("--port", "--human-logs"), "--port needs a value: --port N or --port=N")
      assert.strictEqual(yield* message("--config-shared"), "--config-shared needs a file path")
      assert.strictEqual(yield* message("8080"), `unexpected argument "8080": options are given as --name value or --name=value (see --help)`)
      assert.strictEqual(yield* message("--human-logs", "false"), `unexpected argument "false": --human-logs takes no separate value; write --human-logs=false`)
    }))
})

describe("crypto_key spellings", () => {
  const spellings = [
    `[${KEY1},${KEY2}]`,
    `[ "${KEY1}", "${KEY2}" ]`,
    `['${KEY1}','${KEY2}']`,
    `"[${KEY1}, ${KEY2}]"`,
    `${KEY1},${KEY2}`,
    ` ${KEY1} , ${KEY2} ,`
  ]
  it.effect("bracketed, quoted, comma-separated; in files, environment and flags", () =>
    Effect.gen(function*() {
      for (const spelling of spellings) {
        const box = sandbox()
        const file = box.write(join(box.cwd, "shared.ini"), `crypto_key = ${spelling}\n`)
        assert.deepStrictEqual((yield* box.load("autoconnect", { argv: ["--config-shared", file] })).cryptoKey, [KEY1, KEY2], spelling)
        assert.deepStrictEqual((yield* box.load("autoconnect", { env: { CRYPTO_KEY: spelling } })).cryptoKey, [KEY1, KEY2], spelling)
        assert.deepStrictEqual((yield* box.load("autoconnect", { argv: [`--crypto-key=${spelling}`] })).cryptoKey, [KEY1, KEY2], spelling)
      }
      const single = yield* sandbox().load("autoendpoint", { env: { AUTOEND__CRYPTO_KEYS: KEY1 } })
      assert.deepStrictEqual(single.cryptoKey, [KEY1])
    }))

  it.effect("a key that starts with -- is the value of --crypto-key given apart; a flag after it is not", () =>
    Effect.gen(function*() {
      assert.isTrue(DASHED_KEY.startsWith("--"))
      assert.deepStrictEqual((yield* sandbox().load("autoconnect", { argv: ["--crypto-key", DASHED_KEY, "--port", "9000"] })).cryptoKey, [DASHED_KEY])
      const refused = yield* sandbox().fail("autoconnect", { argv: ["--crypto-key", "--port", "9000"] })
      assert.strictEqual(refused.message, "--crypto-key needs a value: --crypto-key LIST or --crypto-key=LIST")
      const configFile = yield* sandbox().fail("autoconnect", { argv: ["--crypto-key", "--config-shared=x.ini"] })
      assert.strictEqual(configFile.message, "--crypto-key needs a value: --crypto-key LIST or --crypto-key=LIST")
    }))
})

describe("derived URLs", () => {
  const urls = (argv: Array<string>, env: Record<string, string> = {}) =>
    sandbox().load("autopush", { argv, env }).pipe(Effect.map((s) => [s.endpointUrl, s.routerUrl]))

  it.effect("endpoint_url omits the port when it is the scheme's default", () =>
    Effect.gen(function*() {
      const h = hostname()
      assert.deepStrictEqual(yield* urls([]), ["http://localhost:8082", `http://${h}:8081`])
      assert.deepStrictEqual(yield* urls(["--endpoint-port=80"]), ["http://localhost", `http://${h}:8081`])
      assert.deepStrictEqual(yield* urls(["--endpoint-scheme=https", "--endpoint-port=443"]), ["https://localhost", `http://${h}:8081`])
      assert.deepStrictEqual(yield* urls(["--endpoint-scheme=HTTPS", "--endpoint-port=80"]), ["https://localhost:80", `http://${h}:8081`])
      assert.deepStrictEqual(
        yield* urls(["--endpoint-hostname", "push.example.com", "--endpoint-port", "8443", "--endpoint-scheme", "https"]),
        ["https://push.example.com:8443", `http://${h}:8081`]
      )
    }))

  it.effect("router_url from router_hostname or hostname; IPv6 hosts bracketed", () =>
    Effect.gen(function*() {
      assert.deepStrictEqual(yield* urls(["--hostname", "node7", "--router-port", "9000"]), ["http://localhost:8082", "http://node7:9000"])
      assert.deepStrictEqual(
        yield* urls(["--hostname", "node7", "--router-hostname", "10.0.0.7", "--router-scheme", "https"]),
        ["http://localhost:8082", "https://10.0.0.7:8081"]
      )
      assert.deepStrictEqual(yield* urls(["--router-hostname", "::1", "--endpoint-hostname", "fe80::1"]), ["http://[fe80::1]:8082", "http://[::1]:8081"])
    }))

  it.effect("set URLs override the parts; a trailing slash is dropped", () =>
    Effect.gen(function*() {
      assert.deepStrictEqual(
        yield* urls(["--endpoint-port", "9999"], { AUTOPUSH__ENDPOINT_URL: "https://push.example.com/", AUTOCONNECT__ROUTER_URL: "http://10.1.2.3:7000" }),
        ["https://push.example.com", "http://10.1.2.3:7000"]
      )
    }))
})

describe("secrets", () => {
  it.effect("requireSecrets names each missing secret and where to set it", () =>
    Effect.gen(function*() {
      const empty = makeSettings()
      const one = yield* Effect.flip(requireSecrets(empty, ["crypto_key"]))
      assert.strictEqual(
        one.message,
        "crypto_key is required: put it in a file only this service can read (make one with autokey) and name the file with CRYPTO_KEY_FILE, or set it in autopush_shared.ini"
      )
      const both = yield* Effect.flip(requireSecrets(empty, ["crypto_key", "auth_keys"]))
      assert.strictEqual(
        both.message,
        "crypto_key is required: put it in a file only this service can read (make one with autokey) and name the file with CRYPTO_KEY_FILE, or set it in autopush_shared.ini; " +
          "auth_keys is required: put it in a file only this service can read (make one with autokey) and name the file with AUTOEND__AUTH_KEYS_FILE, or set it in autopush_shared.ini"
      )
      assert.notMatch(both.message, /--/, "no secret on a command line")
      yield* requireSecrets(makeSettings({ crypto_key: [KEY1], auth_keys: ["k"] }), ["crypto_key", "auth_keys"])
    }))

  it("redactedSettings hides the keys and flattens durations", () => {
    const log = redactedSettings(makeSettings({ crypto_key: [KEY1, KEY2], auth_keys: ["secret-auth"] }))
    assert.strictEqual(log.crypto_key, "[redacted: 2 keys]")
    assert.strictEqual(log.auth_keys, "[redacted: 1 key]")
    assert.strictEqual(log.hello_timeout, 5)
    assert.strictEqual(log.statsd_host, null)
    assert.strictEqual(log.port, 8080)
    const json = JSON.stringify(log)
    assert.notInclude(json, KEY1)
    assert.notInclude(json, "secret-auth")
  })
})
