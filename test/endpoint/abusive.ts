/**
 * The most expensive requests of each of the endpoint port's routes, at the size limits of each
 * protocol: one header as long as the rest of the request leaves room for (HTTP/1.1: Node's 16 KiB
 * of headers; HTTP/2: the 64 KiB header list of the endpoint's settings), made of a long run of the
 * one character that would make a backtracking pattern retry at every position, of unicode, or of
 * many repeated headers; JSON bodies of many keys or deep nesting up to the body limit. Sent over
 * either protocol (`send`), timed from the first byte sent to the answer's end. Used by
 * `cost.test.ts` (each answered within a bound while another client pushes) and `bench:abuse`
 * (the worst time per route, and the victim's p99 meanwhile).
 */
import * as http from "node:http"
import * as http2 from "node:http2"

export type Protocol = "HTTP/1.1" | "HTTP/2"

export const PROTOCOLS: ReadonlyArray<Protocol> = ["HTTP/1.1", "HTTP/2"]

/**
 * Bytes of one header value that fit with the request line and the other headers of these
 * requests: HTTP/1.1 takes 16,384 bytes of headers (Node's `maxHeaderSize`), HTTP/2 a header list of
 * 65,535 (`maxHeaderListSize`, each field counted with 32 bytes more), four times as much.
 */
export const HEADER_ROOM: Readonly<Record<Protocol, number>> = { "HTTP/1.1": 15_600, "HTTP/2": 64_600 }

/** Header fields one HTTP/2 request may carry (Node's `maxHeaderListPairs`, less the pseudo-headers and ours). */
const HTTP2_FIELDS = 100

/** Registration bodies are read up to 8 KiB. */
const REGISTRATION_BODY = 8 * 1024

export interface AbusiveRequest {
  readonly method: string
  readonly path: string
  readonly headers: Readonly<Record<string, string | ReadonlyArray<string>>>
  readonly body?: string | Buffer
}

/** What the requests name: a subscription of the abuser's own, a message id, a bridged user. */
export interface Targets {
  /** Path of a push endpoint (`/wpush/v1/…`). */
  readonly pushPath: string
  /** A message id (`Location` of a push answered 201). */
  readonly messageId: string
  /** A bridged user made through the registration API of the stub bridge, and its secret (absent: made-up ones). */
  readonly bridged?: { readonly uaid: string; readonly secret: string } | undefined
}

export interface RouteAbuse {
  /** The route, as the README's route table names it. */
  readonly route: string
  readonly name: string
  readonly request: (room: number, protocol: Protocol, targets: Targets) => AbusiveRequest
}

const BODY = Buffer.alloc(64, 1)

/** A P-256 public key (anyone's): a VAPID token then reaches its signature check. */
const SOME_KEY = "BBK8TCxQXMff4QNKMIrwhRuXS4RS8UJAwDJVgQfb-hDh4EnXPTR-xGnjplAoh-MSjWSfy66qw0kAaXaxgVmrfYY"

/** `prefix`, a run of `char` and `suffix`, `room` bytes in all (UTF-8). */
const run = (prefix: string, char: string, room: number, suffix = "x"): string =>
  prefix + char.repeat(Math.max(0, Math.floor((room - prefix.length - suffix.length) / Buffer.byteLength(char)))) + suffix

/** A push with a body and these headers (TTL, and aesgcm unless they say otherwise). */
const push = (targets: Targets, headers: Record<string, string | ReadonlyArray<string>>): AbusiveRequest => ({
  method: "POST",
  path: targets.pushPath,
  headers: { ttl: "60", "content-encoding": "aesgcm", encryption: "salt=c2FsdA", "crypto-key": "dh=ZGg", ...headers },
  body: BODY
})

/** `count` copies of `value` as repeated fields, `room` bytes in all (HTTP/2: at most `HTTP2_FIELDS` fields). */
const repeated = (value: (size: number) => string, room: number, protocol: Protocol): ReadonlyArray<string> => {
  const count = protocol === "HTTP/2" ? HTTP2_FIELDS : 1_000
  const size = Math.floor(room / count) - (protocol === "HTTP/2" ? 48 : 16)
  return Array.from({ length: count }, () => value(size))
}

const bridgedPath = (targets: Targets) => `/v1/stub/app/registration/${targets.bridged?.uaid ?? "0".repeat(32)}`

/** JSON of `{"token": …}` and many small keys, up to `bytes`. */
const manyKeys = (bytes: number): string => {
  const keys: Array<string> = []
  let size = 30
  for (let i = 0; size + 12 < bytes; i++) {
    const entry = `"k${i}":${i}`
    keys.push(entry)
    size += entry.length + 1
  }
  return `{"token":"abcdefghijk",${keys.join(",")}}`
}

/** JSON with a token and an array nested as deep as `bytes` allow. */
const deep = (bytes: number): string => {
  const depth = Math.floor((bytes - 40) / 2)
  return `{"token":"abcdefghijk","a":${"[".repeat(depth)}${"]".repeat(depth)}}`
}

export const ROUTE_ABUSES: ReadonlyArray<RouteAbuse> = [
  // The push route: every header it reads, parsed with the whole header list at its limit.
  { route: "POST /wpush/{version}/{token}", name: "Encryption: salt= and a run of base64url", request: (room, _, t) => push(t, { encryption: run("salt=", "a", room) }) },
  { route: "POST /wpush/{version}/{token}", name: "Encryption: a run of =", request: (room, _, t) => push(t, { encryption: run("salt=a", "=", room) }) },
  { route: "POST /wpush/{version}/{token}", name: "Crypto-Key: a value with a run of spaces inside", request: (room, _, t) => push(t, { "crypto-key": run("dh=x", " ", room) }) },
  { route: "POST /wpush/{version}/{token}", name: "Crypto-Key: a run of ; (empty items)", request: (room, _, t) => push(t, { "crypto-key": run("dh=x", ";", room) }) },
  { route: "POST /wpush/{version}/{token}", name: "Crypto-Key: repeated fields", request: (room, protocol, t) => push(t, { "crypto-key": repeated((n) => run("dh=", "a", n), room, protocol) }) },
  {
    route: "POST /wpush/{version}/{token}",
    name: "Content-Type: the HPKE type and a run of spaces (no Content-Encoding)",
    request: (room, _, t) => ({ method: "POST", path: t.pushPath, headers: { ttl: "60", "content-type": run("application/webpush-message", " ", room) }, body: BODY })
  },
  { route: "POST /wpush/{version}/{token}", name: "Encryption: unicode", request: (room, _, t) => push(t, { encryption: run("salt=", "é", room) }) },
  { route: "POST /wpush/{version}/{token}", name: "Authorization vapid k= a run of =", request: (room, _, t) => push(t, { authorization: run("vapid t=a.b.c,k=", "=", room) }) },
  { route: "POST /wpush/{version}/{token}", name: "Authorization vapid: a valid key, a token of one character repeated", request: (room, _, t) => push(t, { authorization: run(`vapid k=${SOME_KEY},t=`, "a", room, ".a.a") }) },
  { route: "POST /wpush/{version}/{token}", name: "Authorization vapid: a valid key, a token of dots", request: (room, _, t) => push(t, { authorization: run(`vapid k=${SOME_KEY},t=a`, ".", room, "a") }) },
  { route: "POST /wpush/{version}/{token}", name: "Authorization vapid: a run of ,", request: (room, _, t) => push(t, { authorization: run("vapid t=a.b.c", ",", room) }) },
  { route: "POST /wpush/{version}/{token}", name: "Authorization webpush, Crypto-Key p256ecdsa= with a run of spaces", request: (room, _, t) => push(t, { authorization: "webpush a.b.c", "crypto-key": run("p256ecdsa=x", " ", room) }) },
  { route: "POST /wpush/{version}/{token}", name: "TTL: a run of digits", request: (room, _, t) => push(t, { ttl: run("1", "0", room, "1") }) },
  { route: "POST /wpush/{version}/{token}", name: "TTL: a run of leading zeros", request: (room, _, t) => push(t, { ttl: run("", "0", room, "60") }) },
  { route: "POST /wpush/{version}/{token}", name: "Topic and Urgency: runs", request: (room, _, t) => push(t, { topic: run("", "a", room / 2), urgency: run("", " ", room / 2) }) },
  { route: "POST /wpush/{version}/{token}", name: "X-Forwarded-For: a run of addresses", request: (room, _, t) => push(t, { "x-forwarded-for": run("", "10.0.0.1,", room, "10.0.0.2") }) },
  { route: "POST /wpush/{version}/{token}", name: "traceparent: a run of hex", request: (room, _, t) => push(t, { traceparent: run("00-", "a", room) }) },
  { route: "POST /wpush/{version}/{token}", name: "a token percent-encoded, with a query (through the router)", request: (room) => ({ method: "POST", path: run("/wpush/v1/", "%41", room / 2, "?") + "a=".repeat(room / 4), headers: { ttl: "60" }, body: BODY }) },
  { route: "POST /wpush/{token}", name: "a token of one character repeated", request: (room) => ({ method: "POST", path: run("/wpush/", "A", room, ""), headers: { ttl: "60" }, body: BODY }) },
  // The message resource, receipts.
  { route: "DELETE /m/{message_id}", name: "a message id of one character repeated", request: (room) => ({ method: "DELETE", path: run("/m/", "g", room, ""), headers: {} }) },
  { route: "GET /m/{message_id}", name: "a message id of one character repeated", request: (room) => ({ method: "GET", path: run("/m/", "g", room, ""), headers: {} }) },
  { route: "GET /m/{message_id}", name: "a message's status (from the trace)", request: (room, _, t) => ({ method: "GET", path: `/m/${t.messageId}`, headers: { "x-filler": run("", "a", room - 300) } }) },
  { route: "POST /receipts", name: "X-Forwarded-For: a run of commas", request: (room) => ({ method: "POST", path: "/receipts", headers: { "x-forwarded-for": run("", ",", room, "10.0.0.2") } }) },
  { route: "GET /receipts/{id}", name: "an id of one character repeated, a Prefer of spaces", request: (room) => ({ method: "GET", path: run("/receipts/", "a", room / 2, ""), headers: { prefer: run("wait=", " ", room / 2), accept: "application/json" } }) },
  // The registration API (the stub bridge).
  { route: "POST /v1/{routerType}/{appId}/registration", name: "a body of many keys", request: () => ({ method: "POST", path: "/v1/stub/app/registration", headers: { "content-type": "application/json" }, body: manyKeys(REGISTRATION_BODY) }) },
  { route: "POST /v1/{routerType}/{appId}/registration", name: "a body nested deep", request: () => ({ method: "POST", path: "/v1/stub/app/registration", headers: { "content-type": "application/json" }, body: deep(REGISTRATION_BODY) }) },
  { route: "POST /v1/{routerType}/{appId}/registration", name: "a token of unicode", request: () => ({ method: "POST", path: "/v1/stub/app/registration", headers: { "content-type": "application/json" }, body: JSON.stringify({ token: run("", "é", REGISTRATION_BODY - 20, "") }) }) },
  { route: "GET PUT DELETE /v1/{routerType}/{appId}/registration/{uaid}", name: "Authorization: Bearer and a run of spaces", request: (room, _, t) => ({ method: "GET", path: bridgedPath(t), headers: { authorization: run("Bearer ", " ", room) } }) },
  { route: "GET PUT DELETE /v1/{routerType}/{appId}/registration/{uaid}", name: "PUT a body of many keys", request: (_, __, t) => ({ method: "PUT", path: bridgedPath(t), headers: { authorization: `Bearer ${t.bridged?.secret ?? "x"}`, "content-type": "application/json" }, body: manyKeys(REGISTRATION_BODY) }) },
  { route: "POST /v1/{routerType}/{appId}/registration/{uaid}/subscription", name: "a body nested deep", request: (_, __, t) => ({ method: "POST", path: `${bridgedPath(t)}/subscription`, headers: { authorization: `Bearer ${t.bridged?.secret ?? "x"}`, "content-type": "application/json" }, body: deep(REGISTRATION_BODY) }) },
  { route: "DELETE /v1/{routerType}/{appId}/registration/{uaid}/subscription/{chid}", name: "a channel id of one character repeated", request: (room, _, t) => ({ method: "DELETE", path: run(`${bridgedPath(t)}/subscription/`, "a", room, ""), headers: { authorization: `Bearer ${t.bridged?.secret ?? "x"}` } }) },
  // Broadcast admin, health, anything else.
  { route: "PUT DELETE /v1/broadcasts/{id}", name: "Authorization: a run of spaces", request: (room) => ({ method: "PUT", path: "/v1/broadcasts/a", headers: { authorization: run("Bearer ", " ", room) }, body: "{}" }) },
  { route: "GET /__heartbeat__", name: "a query of one character repeated", request: (room) => ({ method: "GET", path: run("/__heartbeat__?", "a", room, ""), headers: {} }) },
  { route: "GET /__lbheartbeat__", name: "a header of unicode", request: (room) => ({ method: "GET", path: "/__lbheartbeat__", headers: { "x-filler": run("", "é", room) } }) },
  { route: "(no route)", name: "a path of many segments", request: (room) => ({ method: "GET", path: run("/", "a/", room, "a"), headers: {} }) }
]

/** Whether a protocol could not carry the request (a header list over its limit): the abuse was not what it says. */
export const refusedAsTooLarge = (status: number): boolean => status === 431 || status === -1

/**
 * Send `request` to `127.0.0.1:port` on a connection of its own and wait for the whole answer: its
 * status (-1: the stream was refused) and the milliseconds from the first byte sent to the last received.
 */
export const send = (port: number, protocol: Protocol, request: AbusiveRequest): Promise<{ readonly status: number; readonly ms: number }> =>
  protocol === "HTTP/1.1" ? sendHttp1(port, request) : sendHttp2(port, request)

const sendHttp1 = (port: number, request: AbusiveRequest) =>
  new Promise<{ readonly status: number; readonly ms: number }>((resolve, reject) => {
    const body = request.body
    const headers: Record<string, string | Array<string> | number> = { ...(request.headers as Record<string, string | Array<string>>), connection: "close" }
    if (body !== undefined) headers["content-length"] = Buffer.byteLength(body)
    const started = performance.now()
    const req = http.request({ host: "127.0.0.1", port, method: request.method, path: request.path, headers, agent: false }, (res) => {
      res.resume()
      res.on("end", () => resolve({ status: res.statusCode ?? 0, ms: performance.now() - started }))
    })
    req.on("error", reject)
    req.end(body)
  })

const sendHttp2 = (port: number, request: AbusiveRequest) =>
  new Promise<{ readonly status: number; readonly ms: number }>((resolve, reject) => {
    const session = http2.connect(`http://127.0.0.1:${port}`)
    session.on("error", reject)
    const started = performance.now()
    const stream = session.request({ ":method": request.method, ":path": request.path, ...request.headers })
    let status = 0
    stream.on("response", (headers) => void (status = Number(headers[":status"])))
    stream.on("data", () => {})
    stream.on("end", () => {
      resolve({ status, ms: performance.now() - started })
      session.close()
    })
    stream.on("error", () => {
      resolve({ status: -1, ms: performance.now() - started })
      session.close()
    })
    stream.end(request.body)
  })
