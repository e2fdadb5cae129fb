/**
 * The bridge registration API (`/v1/{router_type}/{app_id}/registration[...]`): how a mobile
 * browser that holds no WebSocket gets a uaid, channels and endpoints, and tells us where its
 * platform (FCM, APNs, ADM) reaches it.
 *
 * Registering needs no credentials and answers a `secret`; every other call presents it as
 * `Authorization: Bearer <secret>` (or `webpush <secret>`). The secret is the HMAC of the uaid
 * under an `auth_keys` key, compared in constant time. Checks, in order: router type (400/108),
 * uaid (410/103), secret (401/109), user (410/103).
 */
import { randomUUID } from "node:crypto"
import * as ByteSize from "effect/ByteSize"
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as Redacted from "effect/Redacted"
import * as HttpIncomingMessage from "effect/http/HttpIncomingMessage"
import type * as HttpServerRequest from "effect/http/HttpServerRequest"
import * as HttpServerResponse from "effect/http/HttpServerResponse"
import { Bridges } from "../bridges/Bridges.ts"
import type { BridgeRouter, RegistrationBody } from "../bridges/bridge.ts"
import { bridgedTableOf } from "../bridges/table.ts"
import { decodeVapidPublicKey, EndpointCrypto } from "../crypto/endpoint.ts"
import { issueBridgeSecret, verifyBridgeSecret } from "../crypto/secrets.ts"
import {
  InternalError,
  InvalidAuth,
  InvalidRequestBody,
  InvalidRouterType,
  NoSubscription,
  RequestTimeout,
  UaidNotFound
} from "../domain/errors.ts"
import { hyphenate, newUaid, parseChannelId, parseUaid } from "../domain/ids.ts"
import { lastConnectValue, USER_RECORD_VERSION, type UserRecord } from "../domain/user.ts"
import { Storage, type StorageError, storageUnavailable } from "../storage/Storage.ts"
import type { EndpointOptions } from "./options.ts"

/** Registration bodies are small: a token, a channel id, a key, an `aps` override. */
const MAX_BODY = 8 * 1024

export interface RegistrationPath {
  readonly routerType: string
  readonly appId: string
  readonly uaid?: string | undefined
  readonly chid?: string | undefined
}

type Request = HttpServerRequest.HttpServerRequest


const ok = () => HttpServerResponse.jsonUnsafe({})

export const makeRegistrationHandlers = Effect.fnUntraced(function*(options: EndpointOptions) {
  const storage = yield* Storage
  const crypto = yield* EndpointCrypto
  const bridges = yield* Bridges
  const authKeys = options.authKeys === undefined ? [] : Redacted.value(options.authKeys)
  const bodyTimeoutMs = options.clientRequestTimeoutMs ?? 10_000
  const withStorage = <A, R>(effect: Effect.Effect<A, StorageError, R>) => effect.pipe(Effect.catchTag("StorageError", storageUnavailable))

  const bridgeOf = (routerType: string): Effect.Effect<BridgeRouter, InvalidRouterType> => {
    const bridge = bridges.get(routerType)
    return bridge === undefined ? Effect.fail(new InvalidRouterType()) : Effect.succeed(bridge)
  }

  /** The JSON object of the body; an empty body is `{}` when `optional`. */
  const bodyOf = (request: Request, optional: boolean) =>
    request.text.pipe(
      Effect.provideService(HttpIncomingMessage.MaxBodySize, ByteSize.bytes(MAX_BODY)),
      Effect.mapError(() => new InvalidRequestBody({ message: `The request body must be JSON of at most ${MAX_BODY} bytes` })),
      Effect.timeoutOrElse({ duration: bodyTimeoutMs, orElse: () => Effect.fail(new RequestTimeout()) }),
      Effect.flatMap((text) => {
        if (text.trim() === "" && optional) return Effect.succeed({} as Record<string, unknown>)
        try {
          const value: unknown = JSON.parse(text)
          if (typeof value === "object" && value !== null && !Array.isArray(value)) return Effect.succeed(value as Record<string, unknown>)
        } catch {
          // answered below
        }
        return Effect.fail(new InvalidRequestBody({ message: "The request body must be a JSON object" }))
      })
    )

  /** `channelID` (any UUID spelling; a new one when absent) and `key` (a VAPID public key: the endpoint is bound to it). */
  const channelOf = (body: Record<string, unknown>) => {
    const given = body["channelID"]
    const channelId = given === undefined ? randomUUID() : typeof given === "string" ? parseChannelId(given) : undefined
    if (channelId === undefined) return Effect.fail(new InvalidRequestBody({ message: "Invalid channelID" }))
    const key = body["key"]
    if (key === undefined) return Effect.succeed({ channelId, key: undefined })
    const raw = typeof key === "string" ? decodeVapidPublicKey(key) : undefined
    return raw === undefined ? Effect.fail(new InvalidRequestBody({ message: "Invalid key" })) : Effect.succeed({ channelId, key: raw })
  }

  const secretOf = (uaid: string) =>
    authKeys.length === 0
      ? Effect.fail(new InternalError({ cause: "auth_keys is empty" }))
      : Effect.succeed(issueBridgeSecret(authKeys as [string, ...Array<string>], uaid))

  /** The user of an authenticated call. */
  const authorizedUser = Effect.fnUntraced(function*(request: Request, path: RegistrationPath) {
    const uaid = parseUaid(path.uaid ?? "")
    if (uaid === undefined) return yield* new UaidNotFound()
    const [scheme = "", secret = "", ...rest] = (request.headers["authorization"] ?? "").trim().split(/\s+/)
    const valid = rest.length === 0 && ["bearer", "webpush"].includes(scheme.toLowerCase()) && verifyBridgeSecret(authKeys, uaid, secret)
    if (!valid) return yield* new InvalidAuth({ message: "Invalid Local Auth" })
    const user = yield* withStorage(storage.getUser(uaid))
    if (user === undefined) return yield* new UaidNotFound()
    return user
  })

  const tableOf = (user: UserRecord) => withStorage(bridgedTableOf(user).pipe(Effect.provideService(Storage, storage)))

  const addChannel = Effect.fnUntraced(function*(user: UserRecord, table: string, body: Record<string, unknown>) {
    const { channelId, key } = yield* channelOf(body)
    yield* withStorage(storage.addChannel(user.uaid, table, channelId))
    return { channelId, endpoint: yield* crypto.makeEndpoint(user.uaid, channelId, key) }
  })

  /** POST .../registration: a new user with its first channel. */
  const register = Effect.fnUntraced(function*(request: Request, path: RegistrationPath) {
    const bridge = yield* bridgeOf(path.routerType)
    const body = yield* bodyOf(request, false)
    const routerData = yield* bridge.register(path.appId, body as RegistrationBody)
    yield* channelOf(body)
    const now = yield* Clock.currentTimeMillis
    const table = yield* storage.currentMessageTable
    const user: UserRecord = {
      uaid: newUaid(),
      routerType: bridge.platform,
      routerData,
      connectedAt: now,
      lastConnect: lastConnectValue(now),
      currentMonth: table,
      recordVersion: USER_RECORD_VERSION
    }
    yield* withStorage(storage.registerUser(user))
    const channel = yield* addChannel(user, table, body)
    return HttpServerResponse.jsonUnsafe({
      uaid: hyphenate(user.uaid),
      channelID: channel.channelId,
      endpoint: channel.endpoint,
      secret: yield* secretOf(user.uaid)
    })
  })

  /** PUT .../registration/{uaid}: a new platform token (or router type, app id, `aps`); keeps the user alive like GET. */
  const update = Effect.fnUntraced(function*(request: Request, path: RegistrationPath) {
    const bridge = yield* bridgeOf(path.routerType)
    const user = yield* authorizedUser(request, path)
    const body = yield* bodyOf(request, false)
    const routerData = yield* bridge.register(path.appId, body as RegistrationBody)
    const lastConnect = lastConnectValue(yield* Clock.currentTimeMillis)
    const updated = yield* withStorage(storage.updateUser(user.uaid, { routerType: bridge.platform, routerData, lastConnect }))
    if (!updated) return yield* new UaidNotFound()
    return ok()
  })

  /** GET .../registration/{uaid}: the user's channels (and the user kept alive for the stale-user sweep). */
  const channels = Effect.fnUntraced(function*(request: Request, path: RegistrationPath) {
    yield* bridgeOf(path.routerType)
    const user = yield* authorizedUser(request, path)
    const table = yield* tableOf(user)
    const channelIds = yield* withStorage(storage.getChannels(user.uaid, table))
    yield* withStorage(storage.updateUser(user.uaid, { lastConnect: lastConnectValue(yield* Clock.currentTimeMillis) }))
    return HttpServerResponse.jsonUnsafe({ uaid: hyphenate(user.uaid), channelIDs: [...channelIds].sort() })
  })

  /** DELETE .../registration/{uaid}: the user and everything it has. */
  const unregister = Effect.fnUntraced(function*(request: Request, path: RegistrationPath) {
    yield* bridgeOf(path.routerType)
    const user = yield* authorizedUser(request, path)
    yield* withStorage(storage.dropUser(user.uaid))
    return ok()
  })

  /** POST .../registration/{uaid}/subscription: another channel. */
  const subscribe = Effect.fnUntraced(function*(request: Request, path: RegistrationPath) {
    yield* bridgeOf(path.routerType)
    const user = yield* authorizedUser(request, path)
    const body = yield* bodyOf(request, true)
    const channel = yield* addChannel(user, yield* tableOf(user), body)
    return HttpServerResponse.jsonUnsafe({ channelID: channel.channelId, endpoint: channel.endpoint })
  })

  /** DELETE .../registration/{uaid}/subscription/{chid}: drop a channel; 410/106 if it was not there. */
  const unsubscribe = Effect.fnUntraced(function*(request: Request, path: RegistrationPath) {
    yield* bridgeOf(path.routerType)
    const user = yield* authorizedUser(request, path)
    const channelId = parseChannelId(path.chid ?? "")
    const gone = new NoSubscription({ message: "No such subscription" })
    if (channelId === undefined) return yield* gone
    const removed = yield* withStorage(storage.removeChannel(user.uaid, yield* tableOf(user), channelId))
    if (!removed) return yield* gone
    return ok()
  })

  return { register, update, channels, unregister, subscribe, unsubscribe } as const
})
