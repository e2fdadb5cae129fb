/**
 * Apple Push Notification service over HTTP/2: one session per channel (an app: its credentials,
 * topic and sandbox switch), opened when first needed and opened again after a GOAWAY or a lost
 * connection. Token auth (p8 key, `key_id`, `team_id` → ES256 provider JWT, renewed 10 minutes
 * before its hour is up, and at once when APNs calls it expired) or certificate auth (client
 * certificate and key on the TLS connection).
 *
 * `POST /3/device/{token}` with `apns-topic`, `apns-priority` (10, or 5 for low urgency),
 * `apns-expiration` (timestamp + TTL) and `{"aps":{…},…data map…,"ver":"<message id>"}`.
 * 410 → the device is gone (user dropped, 410/106); 403 → 502/901; other errors 502.
 */
import * as http2 from "node:http2"
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as Redacted from "effect/Redacted"
import { importPKCS8 } from "jose/key/import"
import { SignJWT } from "jose/jwt/sign"
import {
  BridgeAuthFailed,
  BridgeTimeout,
  BridgeUnreachable,
  InvalidRouterToken,
  UnknownBridgeTarget
} from "../domain/errors.ts"
import {
  badBody,
  type BridgeRouter,
  BridgeRecipientGone,
  checkBridgeSize,
  dataMapOf,
  parseJson,
  type PlatformReply,
  routerTokenOf,
  unroutable,
  upstreamError,
  urgencyClass
} from "./bridge.ts"
import { makeTokenCache, type TokenCache } from "./token.ts"

export const APNS_PRODUCTION = "https://api.push.apple.com"
export const APNS_SANDBOX = "https://api.sandbox.push.apple.com"

/** Firefox's default notification: shown if the app cannot fetch the real one. */
export const DEFAULT_APS = {
  alert: {
    "title-loc-key": "SentTab.NoTabArrivingNotification.title",
    "loc-key": "SentTab.NoTabArrivingNotification.body"
  },
  "mutable-content": 1
} as const

/** Registered `aps` overrides are kept small: they travel with every message. */
const MAX_APS_BYTES = 1024

type ApnsAuth =
  | { readonly kind: "token"; readonly key: Redacted.Redacted<string>; readonly keyId: string; readonly teamId: string }
  | { readonly kind: "certificate"; readonly cert: string; readonly key: Redacted.Redacted<string> }

export interface ApnsChannel {
  readonly topic: string
  readonly sandbox: boolean
  readonly auth: ApnsAuth
}

export interface ApnsOptions {
  /** By channel name (the app id of the registration path). */
  readonly channels: Readonly<Record<string, ApnsChannel>>
  /** Overrides the production/sandbox host (a proxy, a test server). */
  readonly baseUrl?: string | undefined
  /** Extra CA certificates (PEM) to trust for APNs. */
  readonly ca?: string | undefined
  readonly timeoutMs: number
}

/** Where a channel's messages go: `base_url` when set, else Apple's sandbox or production host. */
export const apnsHost = (channel: ApnsChannel, baseUrl: string | undefined): string =>
  baseUrl ?? (channel.sandbox ? APNS_SANDBOX : APNS_PRODUCTION)

const authFailed = (detail: string) => new BridgeAuthFailed({ message: `APNS authentication failed: ${detail}` })

const providerToken = (auth: Extract<ApnsAuth, { kind: "token" }>) =>
  Effect.gen(function*() {
    const now = Math.floor((yield* Clock.currentTimeMillis) / 1000)
    const value = yield* Effect.tryPromise({
      try: async () =>
        new SignJWT({})
          .setProtectedHeader({ alg: "ES256", kid: auth.keyId })
          .setIssuer(auth.teamId)
          .setIssuedAt(now)
          .sign(await importPKCS8(Redacted.value(auth.key), "ES256")),
      catch: () => authFailed("the signing key is unusable")
    })
    return { value, expiresAt: (now + 3600) * 1000 }
  })

interface Connection {
  readonly url: string
  readonly options: http2.SecureClientSessionOptions
  session: http2.ClientHttp2Session | undefined
  readonly jwt: TokenCache<BridgeAuthFailed> | undefined
}

/** The channel's session, opened if there is none usable. */
const sessionOf = (connection: Connection): http2.ClientHttp2Session => {
  const open = connection.session
  if (open !== undefined && !open.closed && !open.destroyed) return open
  const session = http2.connect(connection.url, connection.options)
  const forget = () => {
    if (connection.session === session) connection.session = undefined
  }
  // After a GOAWAY the session takes no new streams: the next message opens another one.
  session.on("goaway", forget)
  session.on("close", forget)
  session.on("error", forget)
  // An idle session must not keep the process alive.
  session.unref()
  connection.session = session
  return session
}

const exchange = (
  connection: Connection,
  headers: http2.OutgoingHttpHeaders,
  body: string,
  timeoutMs: number
): Effect.Effect<PlatformReply, BridgeUnreachable | BridgeTimeout> =>
  Effect.callback<PlatformReply, BridgeUnreachable | BridgeTimeout>((resume) => {
    let stream: http2.ClientHttp2Stream
    const fail = (error: BridgeUnreachable | BridgeTimeout) => {
      clearTimeout(timer)
      resume(Effect.fail(error))
    }
    const timer = setTimeout(() => {
      stream.close(http2.constants.NGHTTP2_CANCEL)
      fail(new BridgeTimeout({ message: "apns did not answer in time" }))
    }, timeoutMs)
    try {
      stream = sessionOf(connection).request(headers)
    } catch {
      fail(new BridgeUnreachable({ message: "apns could not be reached" }))
      return
    }
    let status = 0
    let text = ""
    stream.setEncoding("utf8")
    stream.on("response", (h) => {
      status = Number(h[":status"] ?? 0)
    })
    stream.on("data", (chunk: string) => {
      text += chunk
    })
    stream.on("end", () => {
      clearTimeout(timer)
      resume(status === 0 ? Effect.fail(new BridgeUnreachable({ message: "apns closed the stream" })) : Effect.succeed({ status, text }))
    })
    stream.on("error", () => fail(new BridgeUnreachable({ message: "apns could not be reached" })))
    stream.end(body)
    return Effect.sync(() => {
      clearTimeout(timer)
      if (!stream.closed) stream.close(http2.constants.NGHTTP2_CANCEL)
    })
  })

export const makeApnsRouter = (options: ApnsOptions): BridgeRouter & { readonly close: Effect.Effect<void> } => {
  const connections = new Map<string, Connection>()
  for (const [name, channel] of Object.entries(options.channels)) {
    const auth = channel.auth
    connections.set(name, {
      url: apnsHost(channel, options.baseUrl),
      options: {
        ...(options.ca !== undefined ? { ca: options.ca } : {}),
        ...(auth.kind === "certificate" ? { cert: auth.cert, key: Redacted.value(auth.key) } : {})
      },
      session: undefined,
      jwt: auth.kind === "token" ? makeTokenCache(providerToken(auth), 600_000) : undefined
    })
  }

  return {
    platform: "apns",
    register: (channel, body) => {
      if (options.channels[channel] === undefined) return Effect.fail(new UnknownBridgeTarget({ message: "Unknown APNS channel" }))
      const token = routerTokenOf(body)
      if (token === undefined) return Effect.fail(new InvalidRouterToken())
      if (body.aps === undefined) return Effect.succeed({ token, rel_channel: channel })
      const aps = typeof body.aps === "string" ? parseJson(body.aps) : body.aps
      if (typeof aps !== "object" || aps === null || Array.isArray(aps)) return Effect.fail(badBody("aps must be a JSON object"))
      if (Buffer.byteLength(JSON.stringify(aps)) > MAX_APS_BYTES) return Effect.fail(badBody(`aps must be at most ${MAX_APS_BYTES} bytes`))
      return Effect.succeed({ token, rel_channel: channel, aps })
    },
    send: (user, notification) =>
      Effect.gen(function*() {
        const name = String(user.routerData["rel_channel"] ?? "")
        const channel = options.channels[name]
        const connection = connections.get(name)
        const deviceToken = user.routerData["token"]
        if (channel === undefined || connection === undefined || typeof deviceToken !== "string") {
          return yield* unroutable("apns", "channel", deviceToken)
        }
        const data = yield* dataMapOf(notification)
        const body = JSON.stringify({ aps: user.routerData["aps"] ?? DEFAULT_APS, ...data, ver: notification.version })
        // APNs limits the whole payload, `aps` included.
        yield* checkBridgeSize(Buffer.byteLength(body))
        const headers = (jwt: string | undefined): http2.OutgoingHttpHeaders => ({
          ":method": "POST",
          ":path": `/3/device/${encodeURIComponent(deviceToken)}`,
          "apns-topic": channel.topic,
          "apns-push-type": "alert",
          "apns-priority": urgencyClass(notification.urgency) === "power-saving" ? "5" : "10",
          "apns-expiration": String(notification.ttl === 0 ? 0 : notification.timestamp + notification.ttl),
          "content-type": "application/json",
          ...(jwt !== undefined ? { authorization: `bearer ${jwt}` } : {})
        })
        const jwt = connection.jwt === undefined ? undefined : yield* connection.jwt.get
        let reply = yield* exchange(connection, headers(jwt), body, options.timeoutMs)
        const reason = () => (parseJson(reply.text) as { reason?: unknown } | undefined)?.reason
        if (reply.status === 403 && jwt !== undefined && reason() === "ExpiredProviderToken") {
          connection.jwt?.invalidate(jwt)
          reply = yield* exchange(connection, headers(yield* (connection.jwt as TokenCache<BridgeAuthFailed>).get), body, options.timeoutMs)
        }
        if (reply.status === 200) return
        if (reply.status === 410) return yield* new BridgeRecipientGone({ message: "APNS recipient no longer available" })
        const why = reason()
        if (reply.status === 403) return yield* authFailed(typeof why === "string" ? why : "403")
        return yield* upstreamError("apns", reply.status, typeof why === "string" ? why : undefined)
      }),
    close: Effect.sync(() => {
      for (const connection of connections.values()) connection.session?.close()
    })
  }
}
