/**
 * Generated HTTP requests against every port of a running node, written on raw TCP so malformed
 * ones really go out: the endpoint's public port (push to `/wpush/v1|v2/{token}`, cancel
 * `/m/{id}`, bridge registration, health, unknown paths), the connection node's router port
 * (`/push/{uaid}`, `/notif/{uaid}[/{ts}]`, `/__trace__/{id}`, `/metrics`, health), the public
 * WebSocket port's plain HTTP (health, broken upgrades) and the metrics listener. Paths carry bad
 * percent-encoding, long and mangled tokens; headers come as a matrix (Content-Encoding,
 * Encryption, Crypto-Key, TTL, Topic, Authorization/VAPID variants, traceparent, duplicates);
 * bodies are over limits, stalled, chunked, or framed wrongly (Content-Length too short or too long,
 * duplicated, negative, with chunked).
 *
 * Invariants, per request: it is answered (a stalled one within `client_request_timeout`); a
 * success is 200/201/204; every error answer is the error JSON whose (status, errno) the README's
 * error table lists — a 5xx only the documented 503s, or 500/999 with a request id; the node logs
 * no defect. Afterwards the node still serves hello → register → push → ack.
 */
import { randomUUID } from "node:crypto"
import { assert, describe, it } from "@effect/vitest"
import { Arbitrary, Effect } from "effect"
import { SignJWT } from "jose"
import { encodeTransportNotification } from "../../src/domain/router-wire.ts"
import { ROUTER_AUTH_HEADER, type RouterAuthService } from "../../src/crypto/routerAuth.ts"
import { httpRequest, openClient } from "../connection/client.ts"
import { rawHttp } from "../connection/raw.ts"
import { vapidKeys } from "../endpoint/harness.ts"
import {
  anyString,
  bool,
  BROADCAST_ADMIN_TOKEN,
  check,
  documented,
  FUZZ_RUNS,
  type FuzzNode,
  int,
  jsonObject,
  normalFlow,
  oneOf,
  pick,
  PROTOTYPE_KEYS,
  startNode,
  Tally,
  unexpectedErrors
} from "./node.ts"

// ── what the generators draw from: real subscriptions, tokens and keys ──────────────────────────────

interface Fixtures {
  readonly uaid: string
  readonly channelId: string
  /** Paths of a v1 endpoint and of a v2 endpoint bound to `vapid`. */
  readonly v1: string
  readonly v2: string
  /** Path of an endpoint whose channel was unregistered. */
  readonly gone: string
  /** A message id the endpoint issued. */
  readonly messageId: string
  /** `Authorization` values: valid, expired, wrong audience, other key, malformed… */
  readonly authorizations: ReadonlyArray<string>
  readonly vapidKey: string
  readonly close: () => Promise<void>
}

/**
 * A connected client with two channels (v1, and v2 bound to a VAPID key) that acks whatever it
 * gets, so pushes to its endpoints are delivered; a message id of a real push; VAPID headers.
 */
const fixtures = (node: FuzzNode) =>
  Effect.gen(function*() {
    const keys = yield* vapidKeys
    const other = yield* vapidKeys
    return yield* Effect.promise(async (): Promise<Fixtures> => {
      const client = await openClient(`ws://127.0.0.1:${node.wsPort}/`)
      client.ws.on("message", (data) => {
        const frame = JSON.parse(data.toString()) as Record<string, unknown>
        if (frame["messageType"] === "notification") {
          client.send({ messageType: "ack", updates: [{ channelID: frame["channelID"], version: frame["version"] }] })
        }
      })
      client.send({ messageType: "hello", use_webpush: true })
      const uaid = (await client.next((f) => f["messageType"] === "hello"))["uaid"] as string
      const channelId = randomUUID()
      const bound = randomUUID()
      client.send({ messageType: "register", channelID: channelId })
      client.send({ messageType: "register", channelID: bound, key: keys.publicKey })
      const v1 = (await client.next((f) => f["channelID"] === channelId))["pushEndpoint"] as string
      const v2 = (await client.next((f) => f["channelID"] === bound))["pushEndpoint"] as string
      const dropped = randomUUID()
      client.send({ messageType: "register", channelID: dropped })
      const gone = (await client.next((f) => f["channelID"] === dropped))["pushEndpoint"] as string
      client.send({ messageType: "unregister", channelID: dropped })
      await client.next((f) => f["messageType"] === "unregister")
      const pushed = await httpRequest("POST", `http://127.0.0.1:${node.endpointPort}${new URL(v1).pathname}`, undefined, { ttl: "60" })
      const location = pushed.headers["location"]
      if (pushed.status !== 201 || typeof location !== "string") throw new Error(`fixture push answered ${pushed.status}`)
      const now = Math.floor(Date.now() / 1000)
      const aud = new URL(node.endpointUrl).origin
      const good = await keys.sign({ aud, exp: now + 3600, sub: "mailto:fuzz@example.com" })
      const tokens = {
        good,
        expired: await keys.sign({ aud, exp: now - 60, sub: "mailto:fuzz@example.com" }),
        tooLong: await keys.sign({ aud, exp: now + 7 * 86_400, sub: "mailto:fuzz@example.com" }),
        slash: await keys.sign({ aud: `${aud}/`, exp: now + 3600 }),
        upper: await keys.sign({ aud: aud.toUpperCase(), exp: now + 3600 }),
        noExp: await keys.sign({ aud }),
        stringExp: await keys.sign({ aud, exp: String(now + 3600) }),
        hs256: await new SignJWT({ aud, exp: now + 3600 }).setProtectedHeader({ alg: "HS256" }).sign(new Uint8Array(32)),
        otherKey: await other.sign({ aud, exp: now + 3600 })
      }
      const k = keys.publicKey
      const authorizations = [
        `vapid t=${tokens.good},k=${k}`,
        `vapid t=${tokens.good}, k=${k}`,
        `VAPID k=${k}, t=${tokens.good}`,
        `vapid t=${tokens.expired},k=${k}`,
        `vapid t=${tokens.tooLong},k=${k}`,
        `vapid t=${tokens.slash},k=${k}`,
        `vapid t=${tokens.upper},k=${k}`,
        `vapid t=${tokens.noExp},k=${k}`,
        `vapid t=${tokens.stringExp},k=${k}`,
        `vapid t=${tokens.hs256},k=${k}`,
        `vapid t=${tokens.otherKey},k=${other.publicKey}`,
        `vapid t=${tokens.good},k=${other.publicKey}`,
        `vapid t=${tokens.good}`,
        `vapid k=${k}`,
        `vapid t=${tokens.good},k=${k.slice(0, 20)}`,
        `vapid t=${tokens.good.slice(0, -5)},k=${k}`,
        `vapid t=a.b.c,k=${k}`,
        `vapid t=,k=`,
        "vapid",
        `WebPush ${tokens.good}`,
        `Bearer ${tokens.good}`,
        `webpush ${tokens.good.split(".").slice(0, 2).join(".")}`,
        "Basic dXNlcjpwYXNz",
        "garbage",
        `vapid t=${"A".repeat(9_000)},k=${k}`,
        `Bearer ${BROADCAST_ADMIN_TOKEN}`,
        `bearer  ${BROADCAST_ADMIN_TOKEN}`,
        `Bearer ${BROADCAST_ADMIN_TOKEN}x`
      ]
      return { uaid, channelId, v1: new URL(v1).pathname, v2: new URL(v2).pathname, gone: new URL(gone).pathname, messageId: location.split("/m/")[1] ?? "", authorizations, vapidKey: k, close: client.close }
    })
  })

// ── generated requests ──────────────────────────────────────────────────────────────────────────

type Framing =
  | "exact" | "none" | "short" | "long" | "chunked" | "chunked-stall" | "chunked-bad" | "chunked+length"
  | "duplicate-length" | "negative-length" | "text-length" | "expect-continue" | "headers-stall"

interface Request {
  readonly method: string
  readonly target: string
  readonly headers: ReadonlyArray<readonly [string, string]>
  readonly body: Buffer
  readonly framing: Framing
}

const METHODS = ["GET", "GET", "POST", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH", "QUERY", "GET", "POST", "BREW", "get", "CONNECT"] as const

/** Percent-encoded (lone surrogates, which cannot be, replaced). */
const encode = (s: string) => encodeURIComponent(s.toWellFormed())

const BAD_SEGMENTS = ["%E0%A4%A", "%", "%ZZ", "%00", "%2F", "..", "%2e%2e", "%C0%AF", "%ED%A0%80", "", "a%20b", "%F0%9F%98%80"] as const

/** A path segment: valid, mangled, badly percent-encoded, long, or any string (encoded or raw). */
const segment = (valid: ReadonlyArray<string>): Arbitrary.Arbitrary<string> => {
  const one = pick(valid.length > 0 ? valid : ["x"])
  return oneOf(
    one,
    one,
    one,
    one,
    one,
    one,
    Arbitrary.map(Arbitrary.all([one, int(0, 300), anyString]), ([v, at, s]) =>
      encode(v.slice(0, at % (v.length + 1)) + s + v.slice((at % (v.length + 1)) + 1))),
    pick(BAD_SEGMENTS),
    Arbitrary.map(pick([200, 10_000]), (n) => "A".repeat(n)),
    Arbitrary.map(anyString, encode),
    anyString
  )
}

const queryOrNot = oneOf(pick(["", "", "", "?", "?a=b", "?%", "#frag", "?x=%E0%A4%A"]))

/** A body of `size` bytes, or text. */
const bodyOf = (texts: ReadonlyArray<Arbitrary.Arbitrary<string>>): Arbitrary.Arbitrary<Buffer> =>
  oneOf(
    Arbitrary.map(pick([0, 0, 1, 100, 4_096, 4_097, 5_000, 65_536, 65_537, 200_000]), (n) => Buffer.alloc(n, 0x41)),
    ...texts.map((t) => Arbitrary.map(t, (s) => Buffer.from(s)))
  )

const framing: Arbitrary.Arbitrary<Framing> = oneOf(
  pick(["exact"]),
  pick(["exact"]),
  pick(["exact", "chunked"]),
  pick(["none", "short", "long", "chunked", "chunked-stall", "chunked-bad", "chunked+length", "duplicate-length", "negative-length", "text-length", "expect-continue", "headers-stall"])
)

/** Headers as a matrix: each either absent or one of its values (or two of them). */
const headerMatrix = (columns: ReadonlyArray<readonly [string, ReadonlyArray<string>]>): Arbitrary.Arbitrary<Array<readonly [string, string]>> =>
  Arbitrary.map(
    Arbitrary.all(columns.map(([name, values]) =>
      Arbitrary.map(Arbitrary.all([int(0, 9), pick(values), pick(values)]), ([presence, a, b]) =>
        presence < 6 ? [] : presence === 9 ? [[name, a] as const, [name, b] as const] : [[name, a] as const]))),
    (cells) => cells.flat()
  )

const COMMON_HEADERS: ReadonlyArray<readonly [string, ReadonlyArray<string>]> = [
  ["content-type", ["application/json", "application/octet-stream", "text/plain; charset=utf-8", "", "multipart/form-data; boundary=x"]],
  ["traceparent", ["00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "00-00000000000000000000000000000000-0000000000000000-01", "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "garbage", ""]],
  ["origin", ["https://example.com", "null", ""]],
  ["access-control-request-method", ["POST", "BREW"]],
  ["connection", ["close", "keep-alive", "upgrade"]],
  ["upgrade", ["websocket", "h2c"]],
  ["x-filler", ["x".repeat(20_000), "y", "y", "\u00ff", "\u00ff"]]
]

const b64 = (n: number) => Buffer.alloc(n, 9).toString("base64url")

const endpointColumns = (f: Fixtures): ReadonlyArray<readonly [string, ReadonlyArray<string>]> => [
  ["ttl", ["60", "0", "-1", "abc", "99999999999", "", "1.5", " 60", "0x10", "2592001", "1e3", "60, 0"]],
  ["content-encoding", ["aes128gcm", "aes128gcm", "aesgcm", "aesgcm128", "AES128GCM", "", "gzip", "aes128gcm, aesgcm"]],
  ["encryption", [`salt=${b64(16)}`, "salt=", "salt=!!", `keyid=p256dh;salt=${b64(16)}`, "garbage", `rs=4096;salt=${b64(16)}`, "salt=\"a\",,;;"]],
  ["crypto-key", [`dh=${b64(65)}`, `p256ecdsa=${f.vapidKey}`, `dh=${b64(65)};p256ecdsa=${f.vapidKey}`, "keyid=x", "garbage", "", "dh=,p256ecdsa="]],
  ["topic", ["a", "x".repeat(32), "x".repeat(33), "bad topic!", "", "\u00fc", "a-b_c"]],
  ["authorization", f.authorizations],
  ...COMMON_HEADERS
]

/** Mostly this method, sometimes any. */
const mostly = (method: string) => oneOf(pick([method]), pick([method]), pick(METHODS))

/**
 * A request the server would accept, given as its headers, with one thing changed: one header of
 * `columns` replaced, added or left out (and, with `sizes`, perhaps the body's size).
 */
const nearlyValid = (
  method: string,
  paths: ReadonlyArray<string>,
  valid: ReadonlyArray<readonly [string, string]>,
  columns: ReadonlyArray<readonly [string, ReadonlyArray<string>]>,
  sizes: ReadonlyArray<number> = [0]
): Arbitrary.Arbitrary<Request> =>
  Arbitrary.map(
    Arbitrary.all([pick(paths), int(0, columns.length), pick([0, 1, 2]), int(0, 50), pick(sizes), framing, bool, queryOrNot]),
    ([path, column, change, choice, size, fr, changeBody, query]) => {
      const headers = new Map<string, string>(valid)
      const [name, values] = columns[column] ?? ["x-none", [""]]
      if (change === 0) headers.delete(name)
      else headers.set(name, values[choice % values.length] as string)
      return { method, target: path + query, headers: [...headers], body: Buffer.alloc(changeBody ? size : (sizes[0] ?? 0), 0x42), framing: fr }
    }
  )

/** A push to a v1 or v2 endpoint (or an unsubscribed one) with TTL, aes128gcm and a valid VAPID header, nearly. */
const nearlyValidPush = (f: Fixtures) =>
  nearlyValid(
    "POST",
    [f.v1, f.v2, f.v1, f.v2, f.gone],
    [["ttl", "60"], ["content-encoding", "aes128gcm"], ["authorization", f.authorizations[0] as string]],
    endpointColumns(f),
    [100, 1, 4_096, 4_097, 70_000]
  )

const request = (
  paths: Arbitrary.Arbitrary<string>,
  headers: Arbitrary.Arbitrary<Array<readonly [string, string]>>,
  bodies: Arbitrary.Arbitrary<Buffer>,
  methods: Arbitrary.Arbitrary<string> = pick(METHODS)
): Arbitrary.Arbitrary<Request> =>
  Arbitrary.map(Arbitrary.all([methods, paths, queryOrNot, headers, bodies, framing]), ([method, path, query, h, body, fr]) => ({
    method,
    target: path + query,
    headers: h,
    body,
    framing: fr
  }))

const endpointRequests = (f: Fixtures) => {
  const token = segment([f.v1.split("/").at(-1) ?? "", f.v2.split("/").at(-1) ?? ""])
  const paths = oneOf(
    Arbitrary.map(Arbitrary.all([pick(["v1", "v2", "v1", "v2", "v3", "V1", "", "%76%31"]), token]), ([v, t]) => `/wpush/${v}/${t}`),
    Arbitrary.map(Arbitrary.all([pick(["v1", "v2"]), pick([f.v1, f.v2])]), ([v, p]) => p.replace(/\/wpush\/v[12]\//, `/wpush/${v}/`)),
    pick([f.v1, f.v2, f.v1, f.v2]),
    Arbitrary.map(token, (t) => `/wpush/${t}`),
    Arbitrary.map(segment([f.messageId]), (id) => `/m/${id}`),
    Arbitrary.map(Arbitrary.all([segment(["webpush", "fcm", "apns", "gcm", "adm"]), segment(["app"]), pick(["", "/" + f.uaid, `/${f.uaid}/subscription`, `/${f.uaid}/subscription/${f.channelId}`])]), ([r, a, rest]) =>
      `/v1/${r}/${a}/registration${rest}`),
    pick(["/health", "/__heartbeat__", "/__lbheartbeat__", "/__version__", "/status", "/__error__", "/v1/err", "/metrics", "/", "*", "//wpush/v1/x", "/wpush", "/wpush/v1/", `http://push.test${f.v1}`, `${f.v1}/extra`, "/m/", "/%", "/errors"]),
    // Receipt subscriptions nobody made (one that exists would hold a GET for its long poll).
    Arbitrary.map(segment(["AAAAAAAAAAAAAAAAAAAAAA", "x", "", "AAAAAAAAAAAAAAAAAAAAAA/extra"]), (id) => `/receipts/${id}`),
    pick(["/receipts", "/receipts?x=1"]),
    Arbitrary.map(anyString, (s) => `/${encode(s)}`)
  )
  const json = Arbitrary.map(Arbitrary.array(Arbitrary.all([oneOf(anyString, pick(PROTOTYPE_KEYS)), anyString]), { maxLength: 4 }), jsonObject)
  return oneOf(
    nearlyValidPush(f),
    nearlyValidPush(f),
    broadcastAdmin(f),
    request(paths, headerMatrix(endpointColumns(f)), bodyOf([anyString, json]), mostly("POST")),
    request(paths, headerMatrix(endpointColumns(f)), bodyOf([anyString, json]), mostly("POST"))
  )
}

/** The broadcast admin API: list, set or delete a broadcast with the admin token, a version of any shape, one header changed. */
const broadcastAdmin = (f: Fixtures): Arbitrary.Arbitrary<Request> => {
  const id = segment(["remote-settings/monitor_changes", "fuzz_broadcast", "a%2Fb"])
  const version = oneOf<unknown>(pick(["v1", "\"quoted\"", "", "x".repeat(300)]), anyString, int(-1, 5), pick([null, [], {}]))
  return Arbitrary.map(
    Arbitrary.all([pick(["PUT", "PUT", "DELETE", "GET", "POST"]), oneOf(Arbitrary.map(id, (i) => `/v1/broadcasts/${i}`), pick(["/v1/broadcasts", "/v1/broadcasts/"])), version, nearlyValid("PUT", ["/"], [["authorization", `Bearer ${BROADCAST_ADMIN_TOKEN}`], ["content-type", "application/json"]], endpointColumns(f))]),
    ([method, path, v, changed]) => ({ ...changed, method, target: path + changed.target.slice(1), body: Buffer.from(jsonObject([["version", v]])) })
  )
}

const notificationBody = (f: Fixtures) =>
  oneOf<string>(
    Arbitrary.map(Arbitrary.all([oneOf(anyString, pick([f.messageId])), int(-1, 100_000), oneOf<string | undefined>(anyString, pick([undefined]))]), ([version, ttl, data]) =>
      encodeTransportNotification({
        channelId: f.channelId,
        version,
        ttl,
        timestamp: Math.floor(Date.now() / 1000),
        ...(data === undefined ? {} : { data, headers: { encoding: "aes128gcm" } })
      })),
    Arbitrary.map(Arbitrary.array(Arbitrary.all([pick(["channelID", "version", "ttl", "timestamp", "topic", "data", "headers", "sortkey_timestamp", ...PROTOTYPE_KEYS]), oneOf<unknown>(anyString, int(-3, 3), pick([null, true, [], {}, JSON.parse("{\"__proto__\":\"x\"}")]))]), { maxLength: 8 }), jsonObject),
    Arbitrary.map(pick(PROTOTYPE_KEYS), (key) =>
      `{"channelID":"${f.channelId}","version":"v","ttl":60,"timestamp":1,"data":"AA","headers":{${JSON.stringify(key)}:"x","encoding":"aes128gcm"}}`),
    Arbitrary.map(int(1, 100_000), (depth) => "[".repeat(depth)),
    anyString
  )

/**
 * Router port requests: three in four signed as the deployment's nodes sign (over the request as
 * generated: a framing that changes the body the node reads makes the signature fail, as it should),
 * so that the routes behind the signature are fuzzed too.
 */
const routerRequests = (f: Fixtures, auth: RouterAuthService) => {
  const hyphenated = f.uaid.replace(/^(.{8})(.{4})(.{4})(.{4})(.{12})$/, "$1-$2-$3-$4-$5")
  const uaid = segment([f.uaid, hyphenated, randomUUID()])
  const paths = oneOf(
    Arbitrary.map(uaid, (u) => `/push/${u}`),
    Arbitrary.map(uaid, (u) => `/push/${u}`),
    Arbitrary.map(uaid, (u) => `/notif/${u}`),
    Arbitrary.map(Arbitrary.all([uaid, segment(["0", "1700000000000", "1".repeat(17), "-1", "abc"])]), ([u, ts]) => `/notif/${u}/${ts}`),
    Arbitrary.map(segment([f.messageId]), (id) => `/__trace__/${id}`),
    pick(["/metrics", "/health", "/__heartbeat__", "/__lbheartbeat__", "/__version__", "/status", "/__error__", "/v1/err/crit", "/", "*", "/push", "/push/", "/notif", "/__trace__/", `/push/${f.uaid}/extra`]),
    Arbitrary.map(anyString, (s) => `/${encode(s)}`)
  )
  const requests = request(paths, headerMatrix(COMMON_HEADERS), bodyOf([notificationBody(f), notificationBody(f), notificationBody(f)]), oneOf(mostly("PUT"), pick(["DELETE"])))
  return Arbitrary.map(Arbitrary.all([requests, pick([true, true, true, false])]), ([r, signed]): Request => {
    if (!signed) return r
    const connectedAt = r.headers.find(([name]) => name.toLowerCase() === "autopush-connected-at")?.[1]
    return { ...r, headers: [...r.headers, [ROUTER_AUTH_HEADER, auth.sign(Date.now(), r.method, r.target, connectedAt, r.body)]] }
  })
}

const UPGRADE_HEADERS: ReadonlyArray<readonly [string, ReadonlyArray<string>]> = [
  ["upgrade", ["websocket", "WebSocket", "h2c", ""]],
  ["sec-websocket-key", ["dGhlIHNhbXBsZSBub25jZQ==", "short", ""]],
  ["sec-websocket-version", ["13", "8", "x"]],
  ["sec-websocket-protocol", ["push-notification", "a,,b", ""]],
  ["sec-websocket-extensions", ["permessage-deflate; client_max_window_bits", "permessage-deflate; server_max_window_bits=99", "x"]],
  ...COMMON_HEADERS
]

const publicRequests = oneOf(
  nearlyValid("GET", ["/"], [
    ["connection", "Upgrade"],
    ["upgrade", "websocket"],
    ["sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="],
    ["sec-websocket-version", "13"],
    ["sec-websocket-protocol", "push-notification"]
  ], UPGRADE_HEADERS),
  request(
    pick(["/", "/", "/health", "/__heartbeat__", "/__lbheartbeat__", "/__version__", "/status", "/__error__", "/metrics", "/push/x", "/%", "*"]),
    headerMatrix(UPGRADE_HEADERS),
    bodyOf([anyString])
  )
)

const metricsRequests = request(
  oneOf(pick(["/metrics", "/metrics", "/metrics/", "/Metrics", "/", "/%", "*", "/health"]), Arbitrary.map(anyString, (s) => `/${encode(s)}`)),
  headerMatrix(COMMON_HEADERS),
  bodyOf([anyString])
)

// ── one request over raw TCP ─────────────────────────────────────────────────────────────────────

/** Whether the request's body stops arriving before it is complete (the server must time it out). */
const stalls = (r: Request) => r.framing === "long" || r.framing === "chunked-stall" || r.framing === "expect-continue" || r.framing === "headers-stall"

const wire = (r: Request): { head: string; body: Buffer } => {
  const lines = [`${r.method} ${r.target} HTTP/1.1`, "host: 127.0.0.1", ...r.headers.map(([k, v]) => `${k}: ${v}`)]
  const n = r.body.length
  const chunk = (b: Buffer) => Buffer.concat([Buffer.from(`${b.length.toString(16)}\r\n`), b, Buffer.from("\r\n")])
  const half = Math.floor(n / 2)
  let body = r.body
  switch (r.framing) {
    case "exact":
      if (n > 0 || r.method === "POST" || r.method === "PUT") lines.push(`content-length: ${n}`)
      break
    case "none":
      break
    case "short":
      lines.push(`content-length: ${Math.max(0, n - 5)}`)
      break
    case "long":
      lines.push(`content-length: ${n + 10}`)
      break
    case "expect-continue":
      lines.push("expect: 100-continue", `content-length: ${n + 1}`)
      body = Buffer.alloc(0)
      break
    case "chunked":
    case "chunked-stall":
    case "chunked+length":
      lines.push("transfer-encoding: chunked")
      if (r.framing === "chunked+length") lines.push(`content-length: ${n}`)
      body = Buffer.concat([
        ...(n > 0 ? [chunk(r.body.subarray(0, half)), chunk(r.body.subarray(half))].filter((c) => c.length > 4) : []),
        ...(r.framing === "chunked-stall" ? [] : [Buffer.from("0\r\n\r\n")])
      ])
      break
    case "chunked-bad":
      lines.push("transfer-encoding: chunked")
      body = Buffer.concat([Buffer.from("zz\r\n"), r.body, Buffer.from("\r\n0\r\n\r\n")])
      break
    case "duplicate-length":
      lines.push(`content-length: ${n}`, `content-length: ${n + 1}`)
      break
    case "negative-length":
      lines.push("content-length: -1")
      break
    case "text-length":
      lines.push("content-length: ten")
      break
    case "headers-stall":
      return { head: `${lines.join("\r\n")}\r\n`, body: Buffer.alloc(0) }
  }
  return { head: `${lines.join("\r\n")}\r\n\r\n`, body }
}

interface Answer {
  readonly status: number
  readonly headers: Readonly<Record<string, string>>
  readonly body: Buffer
}

/** The first final answer in `data` (1xx skipped), or undefined while it is incomplete. */
const answerIn = (data: Buffer, head: boolean, closed: boolean): Answer | undefined => {
  let at = 0
  for (;;) {
    const end = data.indexOf("\r\n\r\n", at)
    if (end === -1) return undefined
    const lines = data.subarray(at, end).toString("latin1").split("\r\n")
    const status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(lines[0] ?? "")?.[1] ?? 0)
    const headers: Record<string, string> = {}
    for (const line of lines.slice(1)) {
      const colon = line.indexOf(":")
      if (colon > 0) headers[line.slice(0, colon).trim().toLowerCase()] = line.slice(colon + 1).trim()
    }
    const rest = data.subarray(end + 4)
    if (status >= 100 && status < 200 && status !== 101) {
      at = end + 4
      continue
    }
    if (head || status === 204 || status === 304 || status === 101) return { status, headers, body: Buffer.alloc(0) }
    const length = headers["content-length"]
    if (length !== undefined) return rest.length >= Number(length) ? { status, headers, body: rest.subarray(0, Number(length)) } : undefined
    if (headers["transfer-encoding"] === "chunked") {
      const chunks: Array<Buffer> = []
      let p = 0
      for (;;) {
        const eol = rest.indexOf("\r\n", p)
        if (eol === -1) return undefined
        const size = Number.parseInt(rest.subarray(p, eol).toString(), 16)
        if (size === 0) return { status, headers, body: Buffer.concat(chunks) }
        if (rest.length < eol + 2 + size + 2) return undefined
        chunks.push(rest.subarray(eol + 2, eol + 2 + size))
        p = eol + 2 + size + 2
      }
    }
    return closed ? { status, headers, body: rest } : undefined
  }
}

const SUCCESS = new Set([200, 201, 204])

/** Send one request; its outcome (`status/errno`), or why it broke an invariant. */
const runRequest = async (port: number, docs: ReturnType<typeof documented>, r: Request): Promise<{ outcome: string } | { failure: string }> => {
  const { head, body } = wire(r)
  const isHead = r.method === "HEAD"
  const started = Date.now()
  const reply = await rawHttp(port, head, body, 4_000, (data) => answerIn(data, isHead, false) !== undefined)
  const answer = answerIn(reply.bytes, isHead, reply.closed)
  if (answer === undefined) {
    if (reply.closed) return { failure: `closed without an answer after ${Date.now() - started} ms${reply.text === "" ? "" : `: ${JSON.stringify(reply.text.slice(0, 120))}`}` }
    return { failure: `no answer within 4 s${stalls(r) ? " (stalled body)" : ""}` }
  }
  const { status } = answer
  if (SUCCESS.has(status)) return { outcome: String(status) }
  if (status === 101) return { outcome: "101" }
  if (isHead) {
    const listed = [...docs.errors].some((e) => e.startsWith(`${status}/`))
    return listed ? { outcome: `${status} (HEAD)` } : { failure: `HEAD answered ${status}, which the README's error table does not list` }
  }
  let json: { code?: unknown; errno?: unknown }
  try {
    json = JSON.parse(answer.body.toString()) as typeof json
  } catch {
    return { failure: `${status} with a body that is not the error JSON: ${JSON.stringify(answer.body.toString().slice(0, 120))}` }
  }
  const key = `${status}/${json.errno === undefined ? "undefined" : JSON.stringify(json.errno)}`
  if (json.code !== status) return { failure: `${status} with a body of code ${String(json.code)}` }
  if (!docs.errors.has(key)) return { failure: `answered ${key}, which the README's error table does not list` }
  if (status >= 500 && status !== 503 && !(status === 500 && answer.headers["x-request-id"] !== undefined)) {
    return { failure: `answered ${key} without a request id` }
  }
  return { outcome: key }
}

const describeRequest = (r: Request) =>
  `${r.method} ${r.target.slice(0, 200)} [${r.framing}, ${r.body.length} bytes] ${JSON.stringify(r.headers.map(([k, v]) => `${k}: ${v.slice(0, 60)}`))}`

describe("HTTP fuzz", () => {
  it.live("generated requests on every port are answered with a documented status and errno; the node keeps serving", () =>
    Effect.gen(function*() {
      const node = yield* startNode
      const docs = documented()
      const f = yield* fixtures(node)
      const tally = new Tally()
      const ports = [
        ["endpoint (public)", node.endpointPort, endpointRequests(f), FUZZ_RUNS * 2],
        ["router (private)", node.routerPort, routerRequests(f, node.routerAuth), FUZZ_RUNS],
        ["websocket port (plain HTTP)", node.wsPort, publicRequests, Math.ceil(FUZZ_RUNS / 4)],
        ["metrics listener", node.metricsPort, metricsRequests, Math.ceil(FUZZ_RUNS / 4)]
      ] as const
      for (const [name, port, requests, runs] of ports) {
        yield* check(
          requests,
          (r) =>
            Effect.flatMap(Effect.promise(() => runRequest(port, docs, r)), (result) => {
              if ("failure" in result) return Effect.fail(`${name}: ${result.failure}`)
              tally.add(name, [result.outcome])
              return Effect.void
            }),
          runs,
          describeRequest,
          // Mostly waiting (stalled bodies wait for the server's timeout), so many at a time.
          64
        )
      }
      yield* Effect.promise(() => f.close())
      yield* normalFlow(node)
      assert.deepStrictEqual(unexpectedErrors(node), [])
      for (const line of tally.lines()) console.log(line)
    }).pipe(Effect.scoped), 600_000)
})
