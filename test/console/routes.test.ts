/**
 * The console's routes on the endpoint server: the page and its files with a strict
 * Content-Security-Policy, the WebSocket URL derived from the host the page was loaded from (plain
 * ws://, as the connection port speaks, even with an https endpoint; or as configured), the status
 * JSON counting accepted pushes, and nothing at all when the console is off.
 */
import { assert, describe, it as plain, layer } from "@effect/vitest"
import { Effect, Layer, Logger, Redacted, References } from "effect"
import { loggablePath } from "../../src/endpoint/edge.ts"
import { MORE_INFO } from "../../src/domain/errors.ts"
import { Metrics } from "../../src/observability/Metrics.ts"
import { endpointWith, FakeNodeClient, options, request } from "../endpoint/harness.ts"

const consoleOptions = { websocketPort: 8080, endpointUrl: options.endpointUrl, maxDataBytes: 4096, version: "1.2.3-test", commit: "abc123" }

describe("web console routes", () => {
  layer(endpointWith(FakeNodeClient, { ...options, console: consoleOptions }), { excludeTestServices: true })((it) => {
    it.effect("GET / and the page's files, each with the CSP: scripts and styles from self only, connections to self, the WebSocket and the endpoint", () =>
      Effect.gen(function*() {
        const page = yield* request({ method: "GET", path: "/", headers: { host: "push.test:8082" } })
        assert.strictEqual(page.status, 200)
        assert.strictEqual(page.headers["content-type"], "text/html; charset=utf-8")
        assert.include(page.text, '<script type="module" src="/console/app.js"></script>')
        assert.notMatch(page.text, /<script(?![^>]*\bsrc=)[^>]*>/, "no inline script")
        assert.notMatch(page.text, /(src|href)="(https?:)?\/\//, "no third-party asset")
        for (const id of ["send-result", "receipts-status", "sent-empty", "sent"]) assert.include(page.text, `id="${id}"`, "the sent list, with each push's state")
        const csp = String(page.headers["content-security-policy"])
        assert.include(csp, "default-src 'none'")
        assert.include(csp, "script-src 'self'")
        assert.include(csp, "style-src 'self'")
        assert.include(csp, `connect-src 'self' ws://push.test:8080 ${new URL(options.endpointUrl).origin}`)
        assert.notInclude(csp, "unsafe-inline")
        assert.strictEqual(page.headers["x-content-type-options"], "nosniff")
        const files = [["/console/app.js", "text/javascript"], ["/console/webpush.js", "text/javascript"], ["/console/receipts.js", "text/javascript"], ["/console/checks.js", "text/javascript"], ["/console/style.css", "text/css"]]
        for (const [path, type] of files) {
          const file = yield* request({ method: "GET", path: path! })
          assert.strictEqual(file.status, 200, path)
          assert.strictEqual(file.headers["content-type"], `${type}; charset=utf-8`)
          assert.isString(file.headers["content-security-policy"])
        }
        const app = yield* request({ method: "GET", path: "/console/app.js" })
        assert.include(app.text, 'from "./receipts.js"')
        assert.include(app.text, "new EventSource(subscription)", "receipts come as server-sent events")
        assert.include(app.text, 'from "./checks.js"', "the page checks where it was opened before making keys")
        assert.include(page.text, '<p id="page-problem" class="problem" role="alert" hidden></p>', "where it says why it cannot work")
        for (const types of ["/console/webpush.d.ts", "/console/receipts.d.ts", "/console/checks.d.ts"]) {
          const missing = yield* request({ method: "GET", path: types })
          assert.strictEqual(missing.status, 404, types)
        }
      }))

    it.effect("config.json: the WebSocket on the page's host and the connection node's port, and the largest body", () =>
      Effect.gen(function*() {
        const local = yield* request({ method: "GET", path: "/console/config.json", headers: { host: "127.0.0.1:8082" } })
        assert.deepStrictEqual(local.json(), { websocketUrl: "ws://127.0.0.1:8080/", endpointUrl: options.endpointUrl, maxDataBytes: 4096 })
        const v6 = yield* request({ method: "GET", path: "/console/config.json", headers: { host: "[::1]:8082" } })
        assert.strictEqual(v6.json().websocketUrl, "ws://[::1]:8080/")
      }))

    it.effect("status.json: version, commit, uptime, accepted pushes and connections from the metrics; null connections on an endpoint without a connection node", () =>
      Effect.gen(function*() {
        const before = (yield* request({ method: "GET", path: "/console/status.json" })).json()
        assert.strictEqual(before.version, "1.2.3-test")
        assert.strictEqual(before.commit, "abc123")
        assert.isAtLeast(before.uptime, 0)
        assert.isNull(before.connections)
        // What the observability layer records from the events of accepted pushes and sessions:
        const metrics = yield* Metrics
        metrics.counter("notification.received").inc(2)
        metrics.gauge("ua.connections").set(3)
        const after = (yield* request({ method: "GET", path: "/console/status.json" })).json()
        assert.strictEqual(after.notifications, before.notifications + 2)
        assert.strictEqual(after.connections, 3)
      }))
  })

  layer(endpointWith(FakeNodeClient, { ...options, console: { ...consoleOptions, endpointUrl: "https://push.test:8082" } }), { excludeTestServices: true })((it) => {
    it.effect("an https endpoint (its own TLS): the derived WebSocket is still ws://, what the connection port speaks", () =>
      Effect.gen(function*() {
        const config = yield* request({ method: "GET", path: "/console/config.json", headers: { host: "push.test:8082" } })
        assert.strictEqual(config.json().websocketUrl, "ws://push.test:8080/")
        assert.include(String(config.headers["content-security-policy"]), "connect-src 'self' ws://push.test:8080 https://push.test:8082")
      }))
  })

  layer(endpointWith(FakeNodeClient, { ...options, console: { ...consoleOptions, websocketUrl: "wss://push.example.com/ws" } }), { excludeTestServices: true })((it) => {
    it.effect("a configured websocket_url is used as it is, and in the CSP", () =>
      Effect.gen(function*() {
        const config = yield* request({ method: "GET", path: "/console/config.json", headers: { host: "127.0.0.1:8082" } })
        assert.strictEqual(config.json().websocketUrl, "wss://push.example.com/ws")
        assert.include(String(config.headers["content-security-policy"]), "connect-src 'self' wss://push.example.com ")
      }))
  })

  layer(endpointWith(FakeNodeClient, { ...options, console: { ...consoleOptions, token: Redacted.make("s3cret-console") } }), { excludeTestServices: true })((it) => {
    it.effect("console_token: the page and its JSON answer only to the token (?token= or Bearer); the scripts stay public", () =>
      Effect.gen(function*() {
        const refused = { code: 401, errno: 109, error: "Unauthorized", message: "Invalid console token: open the console as /?token=<console_token>", more_info: MORE_INFO }
        for (const path of ["/", "/?token=wrong", "/?token=", "/console/config.json", "/console/status.json", "/console/status.json?token=s3cret-consol"]) {
          const reply = yield* request({ method: "GET", path })
          assert.strictEqual(reply.status, 401, path)
          assert.deepStrictEqual(reply.json(), refused, path)
        }
        const wrongBearer = yield* request({ method: "GET", path: "/console/status.json", headers: { authorization: "Bearer s3cret-consolE" } })
        assert.strictEqual(wrongBearer.status, 401)

        const page = yield* request({ method: "GET", path: "/?token=s3cret-console" })
        assert.strictEqual(page.status, 200)
        assert.include(page.text, "<title>")
        for (const path of ["/console/config.json", "/console/status.json"]) {
          const reply = yield* request({ method: "GET", path, headers: { authorization: "Bearer s3cret-console" } })
          assert.strictEqual(reply.status, 200, path)
        }
        assert.strictEqual((yield* request({ method: "GET", path: "/console/app.js" })).status, 200)
      }))
  })

  layer(endpointWith(FakeNodeClient, options), { excludeTestServices: true })((it) => {
    it.effect("console off: GET / and the console paths are 404 error JSON", () =>
      Effect.gen(function*() {
        for (const path of ["/", "/console/app.js", "/console/status.json", "/console/demo/", "/console/demo-sw.js"]) {
          const reply = yield* request({ method: "GET", path })
          assert.strictEqual(reply.status, 404, path)
          assert.deepStrictEqual(reply.json(), { code: 404, errno: null, error: "Not Found", message: "Not Found", more_info: MORE_INFO })
        }
      }))
  })
})

/** Log lines the server writes, structured (level, message, annotations). */
const logged: Array<{ readonly level: string; readonly message: unknown; readonly annotations: Readonly<Record<string, unknown>> }> = []
const captureLogs = Layer.mergeAll(
  Logger.layer([Logger.make((options) => void logged.push(Logger.formatStructured.log(options)))]),
  Layer.succeed(References.MinimumLogLevel, "Debug")
)

describe("the browser's favicon, and paths no route answers", () => {
  layer(endpointWith(FakeNodeClient, { ...options, console: consoleOptions }).pipe(Layer.provide(captureLogs)), { excludeTestServices: true })((it) => {
    it.effect("GET /favicon.ico is answered 204 (remembered a day), logging nothing", () =>
      Effect.gen(function*() {
        logged.length = 0
        const icon = yield* request({ method: "GET", path: "/favicon.ico" })
        assert.strictEqual(icon.status, 204)
        assert.strictEqual(icon.headers["cache-control"], "max-age=86400")
        assert.deepStrictEqual(logged.filter((l) => String(l.message).includes("request rejected")), [])
      }))

    it.effect("a 404 is logged at debug with its path, token-like segments elided; other rejections stay at info without it", () =>
      Effect.gen(function*() {
        logged.length = 0
        const token = "gAAAAABk" + "x".repeat(80)
        const missing = yield* request({ method: "GET", path: `/apple-touch-icon.png?v=2` })
        assert.strictEqual(missing.status, 404)
        yield* request({ method: "POST", path: `/wpush/v1/${token}/extra` })
        const rejected = logged.filter((l) => String(l.message).includes("request rejected"))
        assert.deepStrictEqual(rejected.map((l) => [l.level, l.annotations["path"]]), [["DEBUG", "/apple-touch-icon.png"], ["DEBUG", "/wpush/v1/…/extra"]])
        assert.notInclude(JSON.stringify(logged), token)
        logged.length = 0
        yield* request({ method: "POST", path: `/wpush/v1/${token}` }) // a token that does not open: 404/102, a rejection of the API
        const api = logged.filter((l) => String(l.message).includes("request rejected"))
        assert.strictEqual(api[0]?.level, "INFO")
        assert.isUndefined(api[0]?.annotations["path"])
      }))
  })

  plain("loggablePath: no query, opaque segments elided, bounded", () => {
    assert.strictEqual(loggablePath("/favicon.ico"), "/favicon.ico")
    assert.strictEqual(loggablePath("/m/" + "a".repeat(30) + "?x=1#y"), "/m/…")
    assert.strictEqual(loggablePath("/" + "a/".repeat(200)).length, 200)
  })
})
