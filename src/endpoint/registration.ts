/**
 * The bridge registration API (`/v1/{router_type}/{app_id}/registration[...]`): how a mobile
 * browser that holds no WebSocket gets a uaid, channels and endpoints, and tells us where its
 * platform (FCM, APNs, ADM) reaches it.
 *
 * Registering needs no credentials and answers a `secret`; every other call presents it as
 * `Authorization: Bearer <secret>` (or `webpush <secret>`). The secret is the HMAC of the uaid
 * under an `auth_keys` key, compared in constant time. Checks, in order: router type (400/108),
 * uaid (410/103), secret (401/109), user (410/103). A user has at most `max_channels_per_user`
 * channels, as on the WebSocket (413/121 beyond).
 *
 * The request is read and checked by `registrationRequest.ts`; the handlers here do each call's
 * storage operations. A storage failure is not answered here but by the endpoint's error edge
 * (`edge.ts`: 503/201, its cause logged once), like on every other route.
 */
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as Redacted from "effect/Redacted"
import type * as HttpServerRequest from "effect/http/HttpServerRequest"
import * as HttpServerResponse from "effect/http/HttpServerResponse"
import { Bridges } from "../bridges/Bridges.ts"
import type { RegistrationBody } from "../bridges/bridge.ts"
import { bridgedTableOf } from "../bridges/table.ts"
import { EndpointCrypto } from "../crypto/endpoint.ts"
import { issueBridgeSecret } from "../crypto/secrets.ts"
import { type ApiError, InternalError, NoSubscription, TooManyChannels, UaidNotFound } from "../domain/errors.ts"
import { hyphenate, newUaid, parseChannelId } from "../domain/ids.ts"
import { lastConnectValue, USER_RECORD_VERSION, type UserRecord } from "../domain/user.ts"
import { Storage, type StorageError, type StorageService } from "../storage/Storage.ts"
import { clientRequestTimeoutOf, type EndpointOptions } from "./options.ts"
import {
  authenticatedUaid,
  bridgeOf,
  readRegistrationJson,
  type RequestedChannel,
  requestedChannel
} from "./registrationRequest.ts"

/** The parameters of a registration route's path. */
export interface RegistrationPath {
  readonly routerType: string
  readonly appId: string
  readonly uaid?: string | undefined
  readonly chid?: string | undefined
}

type Request = HttpServerRequest.HttpServerRequest

/** `max_channels_per_user`'s default. */
const DEFAULT_MAX_CHANNELS = 1000

/** A registration call's handler; it fails with the API error to answer, or the storage failure the edge answers. */
export type RegistrationHandler = (
  request: Request,
  path: RegistrationPath
) => Effect.Effect<HttpServerResponse.HttpServerResponse, ApiError | StorageError>

/** What every handler works with: the node's services and the options the API reads. */
interface RegistrationContext {
  readonly storage: StorageService
  readonly crypto: EndpointCrypto["Service"]
  readonly bridges: Bridges["Service"]
  readonly authKeys: ReadonlyArray<string>
  /** Channels one user may have (`max_channels_per_user`). */
  readonly maxChannels: number
  /** How long a client may take to send its body (408 after it). */
  readonly bodyTimeoutMs: number
}

const ok = () => HttpServerResponse.jsonUnsafe({})

/**
 * The bridge and the user of an authenticated call, checked in this order: router type (400/108),
 * uaid (410/103), secret (401/109), user (410/103).
 */
const authorizedCall = Effect.fnUntraced(function*(context: RegistrationContext, request: Request, path: RegistrationPath) {
  const bridge = yield* bridgeOf(context.bridges, path.routerType)
  const uaid = yield* authenticatedUaid(request, path.uaid, context.authKeys)
  const user = yield* context.storage.getUser(uaid)
  if (user === undefined) return yield* new UaidNotFound()
  return { bridge, user }
})

/** The table of the user's channels, moved to the current month's first if it is no longer served. */
const channelTableOf = (context: RegistrationContext, user: UserRecord) =>
  bridgedTableOf(user).pipe(Effect.provideService(Storage, context.storage))

/**
 * Stores the channel in the user's set and gives its endpoint (bound to the channel's key, if any);
 * 413/121 when the set holds `maxChannels` others.
 */
const addChannel = Effect.fnUntraced(function*(context: RegistrationContext, user: UserRecord, table: string, channel: RequestedChannel) {
  const added = yield* context.storage.addChannel(user.uaid, table, channel.channelId, context.maxChannels)
  if (!added) return yield* new TooManyChannels({ maxChannels: context.maxChannels })
  return yield* context.crypto.makeEndpoint(user.uaid, channel.channelId, channel.key)
})

/** The secret a new user's later calls present; a node without `auth_keys` cannot issue one (500). */
const secretOf = (authKeys: ReadonlyArray<string>, uaid: string) =>
  authKeys.length === 0
    ? Effect.fail(new InternalError({ cause: "auth_keys is empty" }))
    : Effect.succeed(issueBridgeSecret(authKeys as [string, ...Array<string>], uaid))

/** POST .../registration: a new user with its first channel. */
const register = (context: RegistrationContext): RegistrationHandler =>
  Effect.fnUntraced(function*(request: Request, path: RegistrationPath) {
    const bridge = yield* bridgeOf(context.bridges, path.routerType)
    const body = yield* readRegistrationJson(request, { optional: false, timeoutMs: context.bodyTimeoutMs })
    const routerData = yield* bridge.register(path.appId, body as RegistrationBody)
    const channel = yield* requestedChannel(body)
    const now = yield* Clock.currentTimeMillis
    const table = yield* context.storage.currentMessageTable
    const user: UserRecord = {
      uaid: newUaid(),
      routerType: bridge.platform,
      routerData,
      connectedAt: now,
      lastConnect: lastConnectValue(now),
      currentMonth: table,
      recordVersion: USER_RECORD_VERSION
    }
    yield* context.storage.registerUser(user)
    const endpoint = yield* addChannel(context, user, table, channel)
    return HttpServerResponse.jsonUnsafe({
      uaid: hyphenate(user.uaid),
      channelID: channel.channelId,
      endpoint,
      secret: yield* secretOf(context.authKeys, user.uaid)
    })
  })

/** PUT .../registration/{uaid}: a new platform token (or router type, app id, `aps`); keeps the user alive like GET. */
const update = (context: RegistrationContext): RegistrationHandler =>
  Effect.fnUntraced(function*(request: Request, path: RegistrationPath) {
    const { bridge, user } = yield* authorizedCall(context, request, path)
    const body = yield* readRegistrationJson(request, { optional: false, timeoutMs: context.bodyTimeoutMs })
    const routerData = yield* bridge.register(path.appId, body as RegistrationBody)
    const lastConnect = lastConnectValue(yield* Clock.currentTimeMillis)
    const updated = yield* context.storage.updateUser(user.uaid, { routerType: bridge.platform, routerData, lastConnect })
    if (!updated) return yield* new UaidNotFound()
    return ok()
  })

/** GET .../registration/{uaid}: the user's channels (and the user kept alive for the stale-user sweep). */
const channels = (context: RegistrationContext): RegistrationHandler =>
  Effect.fnUntraced(function*(request: Request, path: RegistrationPath) {
    const { user } = yield* authorizedCall(context, request, path)
    const table = yield* channelTableOf(context, user)
    const channelIds = yield* context.storage.getChannels(user.uaid, table)
    yield* context.storage.updateUser(user.uaid, { lastConnect: lastConnectValue(yield* Clock.currentTimeMillis) })
    return HttpServerResponse.jsonUnsafe({ uaid: hyphenate(user.uaid), channelIDs: [...channelIds].sort() })
  })

/** DELETE .../registration/{uaid}: the user and everything it has. */
const unregister = (context: RegistrationContext): RegistrationHandler =>
  Effect.fnUntraced(function*(request: Request, path: RegistrationPath) {
    const { user } = yield* authorizedCall(context, request, path)
    yield* context.storage.dropUser(user.uaid)
    return ok()
  })

/** POST .../registration/{uaid}/subscription: another channel. */
const subscribe = (context: RegistrationContext): RegistrationHandler =>
  Effect.fnUntraced(function*(request: Request, path: RegistrationPath) {
    const { user } = yield* authorizedCall(context, request, path)
    const body = yield* readRegistrationJson(request, { optional: true, timeoutMs: context.bodyTimeoutMs })
    const table = yield* channelTableOf(context, user)
    const channel = yield* requestedChannel(body)
    const endpoint = yield* addChannel(context, user, table, channel)
    return HttpServerResponse.jsonUnsafe({ channelID: channel.channelId, endpoint })
  })

/** DELETE .../registration/{uaid}/subscription/{chid}: drop a channel; 410/106 if it was not there. */
const unsubscribe = (context: RegistrationContext): RegistrationHandler =>
  Effect.fnUntraced(function*(request: Request, path: RegistrationPath) {
    const { user } = yield* authorizedCall(context, request, path)
    const channelId = parseChannelId(path.chid ?? "")
    const gone = new NoSubscription({ message: "No such subscription" })
    if (channelId === undefined) return yield* gone
    const removed = yield* context.storage.removeChannel(user.uaid, yield* channelTableOf(context, user), channelId)
    if (!removed) return yield* gone
    return ok()
  })

/** The handlers of the registration routes, over this node's storage, endpoint crypto and bridges. */
export const makeRegistrationHandlers = Effect.fnUntraced(function*(options: EndpointOptions) {
  const context: RegistrationContext = {
    storage: yield* Storage,
    crypto: yield* EndpointCrypto,
    bridges: yield* Bridges,
    authKeys: options.authKeys === undefined ? [] : Redacted.value(options.authKeys),
    maxChannels: options.maxChannelsPerUser ?? DEFAULT_MAX_CHANNELS,
    bodyTimeoutMs: clientRequestTimeoutOf(options)
  }
  return {
    register: register(context),
    update: update(context),
    channels: channels(context),
    unregister: unregister(context),
    subscribe: subscribe(context),
    unsubscribe: unsubscribe(context)
  } as const
})
