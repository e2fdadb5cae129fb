/**
 * The endpoint server as a whole: health and Dockerflow routes, CORS, 404/405 as error JSON,
 * the bridge registration routes (400/108 until the bridges exist), the log check.
 */
import { assert, describe, layer } from "@effect/vitest"
import { request as httpRequest } from "node:http"
import { Effect, Layer, Logger } from "effect"
import { errorAnswers, MORE_INFO } from "../../src/domain/errors.ts"
import { boundPort } from "../../src/endpoint/server.ts"
import { Storage } from "../../src/storage/Storage.ts"
import { monthTableName } from "../../src/storage/tables.ts"
import { rawHttp } from "../connection/raw.ts"
import { endpointWith, FakeNodeClient, options, request, subscribe, TestEndpoint, withStorageFaults } from "./harness.ts"

const errorBody = (code: number, errno: number | null, error: string, message: string) => ({
  code,
  errno,
  error,
  message,
  more_info: MORE_INFO
})

describe("endpoint server", () => {
  layer(TestEndpoint, { excludeTestServices: true })((it) => {
    it.effect("GET /errors: the error reference every error's more_info names, with each status and errno the API answers", () =>
      Effect.gen(function*() {
        const reply = yield* request({ method: "GET", path: MORE_INFO })
        assert.strictEqual(reply.status, 200)
        assert.match(String(reply.headers["content-type"]), /text\/html/)
        const rows = [...reply.text.matchAll(/<tr><td>([^<]+)<\/td><td>([^<]+)<\/td>/g)].map(([, status, errno]) => `${status} ${errno}`)
        for (const { status, errno } of errorAnswers) {
          assert.isTrue(rows.some((row) => row.includes(String(status)) && row.endsWith(` ${errno ?? "null"}`)), `${status} ${errno}`)
        }
      }))

    it.effect("GET /health and /__heartbeat__ report version and storage", () =>
      Effect.gen(function*() {
        for (const path of ["/health", "/__heartbeat__"]) {
          const reply = yield* request({ method: "GET", path })
          assert.strictEqual(reply.status, 200)
          assert.match(String(reply.headers["content-type"]), /application\/json/)
          assert.deepStrictEqual(reply.json(), {
            status: "OK",
            version: options.version,
            router_table: { status: "OK" },
            message_table: { status: "OK" },
            routers: { webpush: true, fcm: false, apns: false, adm: false }
          })
        }
      }))

    it.effect("/__heartbeat__ is 503 with the cause when storage fails", () =>
      Effect.gen(function*() {
        const reply = yield* withStorageFaults(["checkTables"], request({ method: "GET", path: "/__heartbeat__" }))
        assert.strictEqual(reply.status, 503)
        const body = reply.json()
        assert.strictEqual(body.status, "ERROR")
        assert.strictEqual(body.router_table.status, "NOT OK")
        assert.strictEqual(body.message_table.cause, "storage is unavailable: injected fault")
      }))

    it.effect("/__heartbeat__ is 503 naming the table while next month's message table is missing, 200 once it is back", () =>
      Effect.gen(function*() {
        const storage = yield* Storage
        const next = (yield* storage.activeMessageTables)[2] as string
        assert.strictEqual(next, monthTableName("message", Date.UTC(new Date().getUTCFullYear(), new Date().getUTCMonth() + 1, 1)))
        yield* storage.dropMessageTable(next)
        const missing = yield* request({ method: "GET", path: "/__heartbeat__" })
        assert.strictEqual(missing.status, 503)
        assert.strictEqual(missing.json().router_table.status, "OK")
        assert.deepStrictEqual(missing.json().message_table, { status: "NOT OK", cause: `${next}: table not found` })
        yield* storage.createTables([next])
        assert.strictEqual((yield* request({ method: "GET", path: "/__heartbeat__" })).status, 200)
      }))

    it.effect("/__lbheartbeat__, /status, /__version__", () =>
      Effect.gen(function*() {
        const lb = yield* request({ method: "GET", path: "/__lbheartbeat__" })
        assert.strictEqual(lb.status, 200)
        assert.strictEqual(lb.text, "")
        const status = yield* request({ method: "GET", path: "/status" })
        assert.deepStrictEqual(status.json(), { status: "OK", version: options.version })
        const version = yield* request({ method: "GET", path: "/__version__" })
        assert.deepStrictEqual(Object.keys(version.json()).sort(), ["build", "commit", "source", "version"])
        assert.strictEqual(version.json().version, options.version)
      }))

    it.effect("a defect is answered 500/999 error JSON", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        const reply = yield* withStorageFaults(["hasChannel"], request({ path: sub.path, headers: { ttl: 60 } }), "die")
        assert.strictEqual(reply.status, 500)
        assert.deepStrictEqual(reply.json(), errorBody(500, 999, "Internal Server Error", "An internal error occurred"))
      }))

    it.effect("unknown paths are 404 error JSON", () =>
      Effect.gen(function*() {
        for (const [method, path] of [["GET", "/nope"], ["POST", "/wpush"], ["DELETE", "/m"], ["GET", "/"]] as const) {
          const reply = yield* request({ method, path })
          assert.strictEqual(reply.status, 404, `${method} ${path}`)
          assert.deepStrictEqual(reply.json(), errorBody(404, null, "Not Found", "Not Found"))
        }
      }))

    it.effect("known paths with another method are 405 error JSON", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        const cases = [
          ["GET", sub.path],
          ["PUT", sub.path],
          ["POST", "/m/abc"],
          ["POST", "/health"],
          ["DELETE", "/status"],
          ["PATCH", "/__heartbeat__"],
          ["PROPFIND", sub.path],
          ["PROPFIND", "/nope"]
        ] as const
        for (const [method, path] of cases) {
          const reply = yield* request({ method, path })
          assert.strictEqual(reply.status, 405, `${method} ${path}`)
          assert.deepStrictEqual(reply.json(), errorBody(405, null, "Method Not Allowed", "Method Not Allowed"))
        }
      }))

    it.effect("bridge registration routes answer 400/108 for now", () =>
      Effect.gen(function*() {
        const uaid = "8e29d41e-6a7b-4f0c-9b3a-4fbd2d1a9f60"
        const cases = [
          ["POST", "/v1/fcm/app/registration"],
          ["POST", "/v1/apns/app/registration"],
          ["POST", "/v1/adm/app/registration"],
          ["GET", `/v1/fcm/app/registration/${uaid}`],
          ["PUT", `/v1/fcm/app/registration/${uaid}`],
          ["DELETE", `/v1/fcm/app/registration/${uaid}`],
          ["POST", `/v1/fcm/app/registration/${uaid}/subscription`],
          ["DELETE", `/v1/fcm/app/registration/${uaid}/subscription/${uaid}`]
        ] as const
        for (const [method, path] of cases) {
          const reply = yield* request({ method, path, body: "{}" })
          assert.strictEqual(reply.status, 400, `${method} ${path}`)
          assert.deepStrictEqual(reply.json(), errorBody(400, 108, "Bad Request", "Invalid router type"))
        }
      }))

    it.effect("CORS: any origin, Location and TTL exposed, preflights answered", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        const post = yield* request({ path: sub.path, headers: { ttl: 60, origin: "https://app.example" } })
        assert.strictEqual(post.status, 201)
        assert.strictEqual(post.headers["access-control-allow-origin"], "*")
        assert.deepStrictEqual(String(post.headers["access-control-expose-headers"]).split(","), ["location", "ttl", "link", "autopush-warning"])

        const error = yield* request({ method: "GET", path: "/nope", headers: { origin: "https://app.example" } })
        assert.strictEqual(error.headers["access-control-allow-origin"], "*")

        const preflight = yield* request({
          method: "OPTIONS",
          path: sub.path,
          headers: {
            origin: "https://app.example",
            "access-control-request-method": "POST",
            "access-control-request-headers": "ttl,topic,content-encoding,authorization"
          }
        })
        assert.strictEqual(preflight.status, 204)
        assert.strictEqual(preflight.headers["access-control-allow-origin"], "*")
        assert.strictEqual(preflight.headers["access-control-allow-methods"], "DELETE, GET, POST, PUT")
        assert.strictEqual(preflight.headers["access-control-max-age"], "3600")
        assert.strictEqual(preflight.headers["access-control-allow-headers"], "ttl,topic,content-encoding,authorization")
      }))
  })
})

/** Log lines the server writes, captured. */
const logged: Array<{ readonly level: string; readonly message: string }> = []
const captureLogs = Logger.layer([
  Logger.make(({ logLevel, message }) => void logged.push({ level: logLevel, message: JSON.stringify(message) }))
])

describe("log check", () => {
  layer(TestEndpoint.pipe(Layer.provide(captureLogs)), { excludeTestServices: true })((it) => {
    it.effect("/__error__ and /v1/err answer 418/999 and log an error line", () =>
      Effect.gen(function*() {
        for (const path of ["/__error__", "/v1/err"]) {
          logged.length = 0
          const reply = yield* request({ method: "GET", path })
          assert.strictEqual(reply.status, 418)
          assert.deepStrictEqual(reply.json(), errorBody(418, 999, "I'm a teapot", "LogCheck"))
          assert.deepStrictEqual(logged.filter((l) => l.level === "Error"), [{ level: "Error", message: JSON.stringify(["Test Critical Message"]) }])
        }
      }))
  })
})

describe("requests Node's HTTP server cannot hand to the API", () => {
  layer(TestEndpoint, { excludeTestServices: true })((it) => {
    it.effect("a request the parser refuses, headers over its limit, CONNECT, a chunked upgrade request: the error JSON, then the connection closed", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        const port = yield* boundPort
        const cases: ReadonlyArray<readonly [string, number, string]> = [
          [`POST ${sub.path} HTTP/1.1\r\nHost: x\r\nTTL: 60\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n`, 400, "The request could not be parsed"],
          [`POST ${sub.path} HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n`, 400, "The request could not be parsed"],
          [`POST ${sub.path} HTTP/1.1\r\nHost: x\r\nX-Filler: ${"x".repeat(20_000)}\r\n\r\n`, 400, "The request headers are too large"],
          ["CONNECT /health HTTP/1.1\r\nHost: x\r\n\r\n", 405, "Method Not Allowed"]
        ]
        for (const [head, status, message] of cases) {
          const reply = yield* Effect.promise(() => rawHttp(port, head, "", 1_000))
          assert.match(reply.text, new RegExp(`^HTTP/1\\.1 ${status} `), head.slice(0, 40))
          assert.strictEqual(JSON.parse(reply.text.slice(reply.text.indexOf("\r\n\r\n") + 4)).message, message)
          assert.isTrue(reply.closed, "the connection is closed")
        }
        // There is no upgrade route: a request asking for one is an ordinary request.
        const upgrade = yield* Effect.promise(() =>
          rawHttp(port, `POST ${sub.path} HTTP/1.1\r\nHost: x\r\nTTL: 60\r\nConnection: Upgrade\r\nUpgrade: h2c\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n`, "", 1_000, (data) => data.includes("\r\n\r\n"))
        )
        assert.match(upgrade.text, /^HTTP\/1\.1 201 /)
      }))
  })
})

describe("the push route, however its URL is spelled", () => {
  layer(TestEndpoint, { excludeTestServices: true })((it) => {
    it.effect("a query string, a trailing slash, a percent escape or no version segment reach the same handler and rules", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        const token = sub.path.slice("/wpush/v1/".length)
        const spellings = [
          sub.path,
          `${sub.path}?from=app`,
          `${sub.path}/`,
          `/wpush/v1/${token.slice(0, 5)}%${token.charCodeAt(5).toString(16).toUpperCase()}${token.slice(6)}`,
          `/wpush/${token}`
        ]
        for (const path of spellings) {
          const created = yield* request({ path, headers: { ttl: 60 } })
          assert.strictEqual(created.status, 201, path)
          assert.match(String(created.headers["location"]), /\/m\/gAAAA/, path)
          assert.strictEqual(created.headers["access-control-allow-origin"], "*", path)
          const refused = yield* request({ path })
          assert.strictEqual(refused.status, 400, path)
          assert.strictEqual(refused.json().errno, 111, path)
        }
        const unknownVersion = yield* request({ path: `/wpush/v9/${token}`, headers: { ttl: 60 } })
        assert.strictEqual(unknownVersion.status, 404)
        assert.strictEqual(unknownVersion.json().errno, 102)
      }))
  })
})

describe("max_in_flight_requests", () => {
  layer(endpointWith(FakeNodeClient, { ...options, maxInFlightRequests: 1, clientRequestTimeoutMs: 500 }), { excludeTestServices: true })((it) => {
    it.effect("beyond the limit a push or any other request is answered 503/201 with Retry-After at once; a slot freed is used again", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        const port = yield* boundPort
        // This push holds the only slot until its body times out.
        const holder = Effect.runPromise(Effect.promise(() =>
          rawHttp(port, `POST ${sub.path} HTTP/1.1\r\nHost: x\r\nTTL: 60\r\nContent-Length: 100\r\n\r\n`, "half", 3_000)
        ))
        yield* Effect.sleep("100 millis")
        for (const [method, path] of [["POST", sub.path], ["POST", `${sub.path}?q=1`], ["GET", "/health"]] as const) {
          const refused = yield* request({ method, path, headers: { ttl: 60 } })
          assert.strictEqual(refused.status, 503, `${method} ${path}`)
          assert.strictEqual(refused.json().errno, 201)
          assert.strictEqual(refused.headers["retry-after"], "120")
        }
        assert.match((yield* Effect.promise(() => holder)).text, /^HTTP\/1\.1 408 /)
        assert.strictEqual((yield* request({ path: sub.path, headers: { ttl: 60 } })).status, 201)
      }))
  })
})

describe("slow bodies", () => {
  layer(endpointWith(FakeNodeClient, { ...options, clientRequestTimeoutMs: 300 }), { excludeTestServices: true })((it) => {
    it.effect("a push whose body stalls is answered 408 within client_request_timeout, and the connection closed", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        const port = yield* boundPort
        const started = Date.now()
        const reply = yield* Effect.promise(() =>
          rawHttp(port, `POST ${sub.path} HTTP/1.1\r\nHost: x\r\nTTL: 60\r\nContent-Length: 100\r\n\r\n`, "half a bo")
        )
        assert.match(reply.text, /^HTTP\/1\.1 408 /)
        assert.include(reply.text, JSON.stringify(errorBody(408, null, "Request Timeout", "The request body did not arrive in time")))
        assert.isTrue(reply.closed, "the connection is closed")
        assert.isBelow(Date.now() - started, 2_000)
      }))

    it.effect("headers that stall are answered 408 soon after client_request_timeout, and the connection closed", () =>
      Effect.gen(function*() {
        const port = yield* boundPort
        const started = Date.now()
        const reply = yield* Effect.promise(() => rawHttp(port, "GET /status HTTP/1.1\r\nHost: x\r\nX-Half: a", "", 5_000))
        assert.match(reply.text, /^HTTP\/1\.1 408 /)
        assert.include(reply.text, "\"errno\":null")
        assert.isTrue(reply.closed, "the connection is closed")
        assert.isBelow(Date.now() - started, 2_000)
      }))
  })
})

describe("bodies over max_data_bytes", () => {
  /** A push of `bytes` sent whole (Content-Length) or in chunks, as a client that writes all before it reads. */
  const bigPush = (port: number, path: string, bytes: number, chunked: boolean) =>
    new Promise<{ readonly status: number | undefined; readonly body: string; readonly error: string | undefined }>((resolve) => {
      const body = Buffer.alloc(bytes, 7)
      let status: number | undefined
      let text = ""
      let error: string | undefined
      const req = httpRequest({
        host: "127.0.0.1",
        port,
        path,
        method: "POST",
        headers: chunked ? { ttl: "60", "content-encoding": "aes128gcm" } : { ttl: "60", "content-encoding": "aes128gcm", "content-length": bytes }
      }, (res) => {
        status = res.statusCode
        res.on("data", (chunk: Buffer) => void (text += chunk.toString()))
        res.on("end", () => setTimeout(() => resolve({ status, body: text, error }), 50))
      })
      req.on("error", (e: NodeJS.ErrnoException) => {
        error = e.code ?? e.message
        if (status === undefined) resolve({ status, body: text, error })
      })
      if (chunked) {
        for (let at = 0; at < bytes; at += 65_536) req.write(body.subarray(at, at + 65_536))
        req.end()
      } else req.end(body)
    })

  layer(TestEndpoint, { excludeTestServices: true })((it) => {
    it.effect("10 MB, whole, chunked or 20 at once: answered 413/104 and readable; the client's write is never cut", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        const port = yield* boundPort
        const tooLarge = JSON.stringify(errorBody(413, 104, "Payload Too Large", `Data payload must be smaller than ${options.maxDataBytes} bytes`))
        const replies = yield* Effect.promise(() =>
          Promise.all([
            bigPush(port, sub.path, 10_000_000, false),
            bigPush(port, sub.path, 10_000_000, true),
            ...Array.from({ length: 20 }, () => bigPush(port, sub.path, 10_000_000, false))
          ])
        )
        for (const reply of replies) {
          assert.strictEqual(reply.status, 413)
          assert.strictEqual(reply.body, tooLarge)
          assert.isUndefined(reply.error, "the connection was reset while the client was sending")
        }
        // The endpoint still takes pushes.
        assert.strictEqual((yield* request({ path: sub.path, headers: { ttl: 60 } })).status, 201)
      }), 60_000)
  })
})
