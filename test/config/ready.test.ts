/**
 * The start-up "ready" line: the URLs to use, whether the web console is public, asks for a token
 * or is off (never the token itself), and every port the node listens on with its bind address —
 * "private" only for a loopback or private address.
 */
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { listeningPorts, readyLine } from "../../src/bin/app.ts"
import { isPrivateBind } from "../../src/platform/addresses.ts"
import { sandbox } from "./sandbox.ts"

describe("ready line", () => {
  it.effect("says whether the console is public, token-guarded or off", () =>
    Effect.gen(function*() {
      const box = sandbox()
      const line = (argv: ReadonlyArray<string>) => Effect.map(box.load("autopush", { argv }), (s) => readyLine("autopush", s))
      assert.isTrue(
        (yield* line([])).startsWith(
          "ready: WebSocket ws://localhost:8080/ · Web Push API http://localhost:8082/wpush/… · web console http://localhost:8082/ (public) · storage "
        )
      )
      const guarded = yield* line(["--console-token", "s3cret-console"])
      assert.include(guarded, "· web console http://localhost:8082/?token=… (console_token required) ·")
      assert.notInclude(guarded, "s3cret-console")
      assert.include(yield* line(["--console=false"]), "· web console off ·")
      const endpointNode = yield* Effect.map(box.load("autoendpoint", { argv: ["--console=false"] }), (s) => readyLine("autoendpoint", s))
      assert.isTrue(endpointNode.startsWith("ready: Web Push API http://localhost:8082/wpush/… · web console off · listening: "), endpointNode)
      const connectionNode = yield* Effect.map(box.load("autoconnect"), (s) => readyLine("autoconnect", s))
      assert.notInclude(connectionNode, "console")
    }))

  it.effect("an https endpoint (its own TLS) still advertises the plain ws:// the WebSocket port speaks; websocket_url as given", () =>
    Effect.gen(function*() {
      const box = sandbox()
      const line = (argv: ReadonlyArray<string>) => Effect.map(box.load("autopush", { argv }), (s) => readyLine("autopush", s))
      assert.isTrue(
        (yield* line(["--endpoint-scheme", "https", "--endpoint-port", "443"])).startsWith("ready: WebSocket ws://localhost:8080/ · Web Push API https://localhost/wpush/…")
      )
      assert.isTrue((yield* line(["--endpoint-scheme", "https", "--websocket-url", "wss://push.example.com/"])).startsWith("ready: WebSocket wss://push.example.com/ · "))
    }))

  it.effect("the all-in-one names every port: public ones, its router port on the loopback, and the embedded store's (a dynalite port for an earlier version's data, the SQLite file otherwise)", () =>
    Effect.gen(function*() {
      const settings = yield* sandbox().load("autopush")
      assert.include(
        readyLine("autopush", settings, { store: "http://127.0.0.1:41234" }),
        "· listening: WebSocket on 0.0.0.0:8080, Web Push API on 0.0.0.0:8082, router on 127.0.0.1:8081 (private), embedded storage on 127.0.0.1:41234 (private)"
      )
      // Run as workers: each worker's router port, skipping the public ones.
      assert.include(
        readyLine("autopush", settings, { workers: 3, store: "http://127.0.0.1:8000" }),
        "· 3 workers · listening: WebSocket on 0.0.0.0:8080, Web Push API on 0.0.0.0:8082, router on 127.0.0.1:8081, 8083, 8084 (private), embedded storage on 127.0.0.1:8000 (private)"
      )
      // The default embedded store is a file: named, with no port.
      assert.include(
        readyLine("autopush", settings),
        `· storage ${join(settings.dataDir, "autopush.sqlite")} (SQLite, no port) · listening: WebSocket on 0.0.0.0:8080, Web Push API on 0.0.0.0:8082, router on 127.0.0.1:8081 (private)`
      )
    }))

  it.effect("a node on a database server names it: PostgreSQL's host, port and database (never its user or password), DynamoDB's endpoint", () =>
    Effect.gen(function*() {
      const box = sandbox()
      const dsn = "postgres://autopush:s3cret-pw@db.internal:5432/pushes?sslmode=verify-full"
      for (const role of ["autoconnect", "autoendpoint", "autopush"] as const) {
        const line = readyLine(role, yield* box.load(role, { argv: ["--db-dsn", dsn] }))
        assert.include(line, " · storage PostgreSQL at db.internal:5432/pushes · listening: ", role)
        for (const secret of ["s3cret-pw", "autopush@", "sslmode"]) assert.notInclude(line, secret, role)
      }
      const onDynamo = readyLine("autoconnect", yield* box.load("autoconnect", { argv: ["--storage-endpoint", "http://10.0.0.7:8000"] }))
      assert.include(onDynamo, " · storage DynamoDB at http://10.0.0.7:8000 · listening: ")
      assert.notInclude(onDynamo, "SQLite")
    }))

  it.effect("a node on its own: a private port bound to every interface is not called private; private_bind_host makes it so", () =>
    Effect.gen(function*() {
      const box = sandbox()
      const connection = yield* box.load("autoconnect", { argv: ["--endpoint-url", "https://push.example.com"] })
      const line = readyLine("autoconnect", connection)
      assert.include(line, "· endpoints https://push.example.com/wpush/… ·", "the endpoint URL it hands out")
      assert.include(line, "router on 0.0.0.0:8081 (every interface, NOT private: keep it off the internet or set private_bind_host)")
      assert.notInclude(line, "(private)")
      const inside = yield* box.load("autoconnect", { argv: ["--private-bind-host", "10.0.0.6", "--router-hostname", "10.0.0.6"] })
      assert.include(readyLine("autoconnect", inside), "· router URL http://10.0.0.6:8081 · listening: WebSocket on 0.0.0.0:8080, router on 10.0.0.6:8081 (private)")
      assert.include(
        readyLine("autoconnect", yield* box.load("autoconnect", { argv: ["--private-bind-host", "203.0.113.7"] })),
        "router on 203.0.113.7:8081 (not a private address, NOT private"
      )

      const endpoint = yield* box.load("autoendpoint")
      const endpointLine = readyLine("autoendpoint", endpoint)
      assert.include(endpointLine, "· listening: Web Push API on 0.0.0.0:8082, metrics on 0.0.0.0:8083 (every interface, NOT private", "its metrics port is named")
      assert.include(endpointLine, "its push client connects to ws://<the host it was loaded from>:8080/ (set websocket_url)")
      const withWs = yield* box.load("autoendpoint", { argv: ["--websocket-url", "wss://ws.example.com/", "--private-bind-host", "::1"] })
      assert.include(readyLine("autoendpoint", withWs), "its push client connects to wss://ws.example.com/")
      assert.include(readyLine("autoendpoint", withWs), "metrics on [::1]:8083 (private)")
    }))

  it.effect("every port named: one entry per listener a role opens", () =>
    Effect.gen(function*() {
      const settings = yield* sandbox().load("autopush")
      assert.deepStrictEqual(listeningPorts("autopush", settings, 1, "http://127.0.0.1:9").map((l) => l.what), ["WebSocket", "Web Push API", "router", "embedded storage"])
      assert.deepStrictEqual(listeningPorts("autoconnect", settings, 1, undefined).map((l) => l.what), ["WebSocket", "router"])
      assert.deepStrictEqual(listeningPorts("autoendpoint", settings, 2, undefined).map((l) => [l.what, l.ports]), [["Web Push API", [8082]], ["metrics", [8083, 8084]]])
    }))

  it("private means loopback, private or link-local address space", () => {
    for (const host of ["127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost", "10.0.0.6", "172.20.1.1", "192.168.1.10", "fd00::5", "fe80::1", "::ffff:10.1.1.1"]) {
      assert.isTrue(isPrivateBind(host), host)
    }
    for (const host of ["0.0.0.0", "::", "203.0.113.7", "8.8.8.8", "2001:db8::1", "push.example.com", "172.32.0.1"]) {
      assert.isFalse(isPrivateBind(host), host)
    }
  })
})
