/** A small WebSocket push client for tests over real sockets, a raw HTTP helper, and test node options. */
import { request } from "node:http"
import WebSocket from "ws"
import { connectionNodeOptions } from "../../src/bin/app.ts"
import { makeSettings } from "../../src/config/index.ts"
import type { ConnectionNodeOptions } from "../../src/connection/node.ts"
import { encodeTransportNotification } from "../../src/domain/router-wire.ts"
import * as Redacted from "effect/Redacted"
import { TEST_CRYPTO_KEY } from "../../src/crypto/endpoint.ts"
import { makeRouterAuth, ROUTER_AUTH_HEADER } from "../../src/crypto/routerAuth.ts"

/** A connection node on free ports with short timers, for tests over real sockets. */
export const nodeOptions: Omit<ConnectionNodeOptions, "routerUrl"> = {
  ...connectionNodeOptions(makeSettings()),
  port: 0,
  routerPort: 0,
  bindHost: "127.0.0.1",
  helloTimeoutMs: 2_000,
  closeGraceMs: 200,
  tickMs: 100,
  shutdownTimeoutMs: 2_000
}

/** The body of a delivery on the router port (`PUT /push/{uaid}`): a small payload, TTL 60, accepted now. */
export const routerDelivery = (channelId: string, version: string): string =>
  encodeTransportNotification({
    channelId,
    version,
    ttl: 60,
    timestamp: Math.floor(Date.now() / 1000),
    data: "aGVsbG8",
    headers: { encoding: "aes128gcm" }
  })

export interface TestClient {
  readonly ws: WebSocket
  readonly received: Array<Record<string, unknown>>
  readonly closed: Promise<{ readonly code: number; readonly reason: string }>
  readonly send: (message: unknown) => void
  /** The next frame (after those already taken) matching `predicate`, within `timeoutMs`. */
  readonly next: (predicate?: (frame: Record<string, unknown>) => boolean, timeoutMs?: number) => Promise<Record<string, unknown>>
  /** Resolves true if no frame matching `predicate` arrives within `ms`. */
  readonly quiet: (ms: number, predicate?: (frame: Record<string, unknown>) => boolean) => Promise<boolean>
  readonly close: () => Promise<void>
}

export const openClient = (url: string): Promise<TestClient> =>
  new Promise((resolve, reject) => {
    const ws = new WebSocket(url, "push-notification")
    const received: Array<Record<string, unknown>> = []
    const waiters = new Set<() => void>()
    let taken = 0
    ws.on("message", (data) => {
      received.push(JSON.parse(data.toString()) as Record<string, unknown>)
      for (const wake of waiters) wake()
    })
    const closed = new Promise<{ code: number; reason: string }>((done) =>
      ws.on("close", (code, reason) => done({ code, reason: reason.toString() }))
    )
    // A frame that should come is waited for generously: it comes in milliseconds, seconds late on
    // a loaded machine; one that never comes fails the same, only later.
    const next: TestClient["next"] = (predicate = () => true, timeoutMs = 15_000) =>
      new Promise((done, fail) => {
        const check = () => {
          while (taken < received.length) {
            const frame = received[taken++]!
            if (predicate(frame)) {
              waiters.delete(check)
              clearTimeout(timer)
              done(frame)
              return
            }
          }
        }
        const timer = setTimeout(() => {
          waiters.delete(check)
          fail(new Error(`no matching frame within ${timeoutMs} ms; got ${JSON.stringify(received)}`))
        }, timeoutMs)
        waiters.add(check)
        check()
      })
    ws.once("error", reject)
    ws.once("open", () =>
      resolve({
        ws,
        received,
        closed,
        send: (message) => ws.send(typeof message === "string" ? message : JSON.stringify(message)),
        next,
        quiet: (ms, predicate = () => true) =>
          new Promise((done) => {
            const start = received.length
            setTimeout(() => done(!received.slice(start).some(predicate)), ms)
          }),
        close: () =>
          new Promise((done) => {
            if (ws.readyState === ws.CLOSED) return done()
            ws.once("close", () => done())
            ws.close()
          })
      })
    )
  })

export const httpRequest = (
  method: string,
  url: string,
  body?: string,
  headers: Record<string, string> = {}
): Promise<{ readonly status: number; readonly body: string; readonly headers: Record<string, string | Array<string> | undefined> }> =>
  new Promise((resolve, reject) => {
    const req = request(url, { method, headers }, (res) => {
      const chunks: Array<Buffer> = []
      res.on("data", (c: Buffer) => chunks.push(c))
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString(), headers: res.headers }))
    })
    req.on("error", reject)
    req.end(body)
  })

/** Signatures of the test deployment (the test crypto key), as its endpoint nodes make them. */
export const testRouterAuth = makeRouterAuth({ keys: Redacted.make([TEST_CRYPTO_KEY]), acceptUnsigned: false })

/** The `Autopush-Router-Auth` header of a router API request, signed now. */
export const routerSignature = (method: string, path: string, body?: string, connectedAt?: string): Record<string, string> => ({
  [ROUTER_AUTH_HEADER]: testRouterAuth.sign(Date.now(), method, path, connectedAt, body)
})

/** `httpRequest` to a router API route, signed as a node of the test deployment signs it. */
export const routerRequest = (method: string, url: string, body?: string, headers: Record<string, string> = {}) => {
  const { pathname, search } = new URL(url)
  return httpRequest(method, url, body, { ...headers, ...routerSignature(method, pathname + search, body, headers["autopush-connected-at"]) })
}
