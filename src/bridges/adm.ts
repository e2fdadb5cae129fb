/**
 * Amazon Device Messaging (Fire devices). Each profile (the app id of the registration path) has an
 * OAuth client: the token comes from the client-credentials grant at `{base_url}/auth/O2/token`
 * (scope `messaging:push`), kept until a minute before it expires, fetched again once on 401.
 *
 * `POST {base_url}/messaging/registrations/{token}/messages` with
 * `{"data":{…},"consolidationKey":"<chid>","expiresAfter":<ttl>}`: `Unregistered` or
 * `InvalidRegistrationId` → the device is gone (user dropped, 410/106); 401 twice → 502/901.
 */
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as Redacted from "effect/Redacted"
import { BridgeAuthFailed, InvalidRouterToken, UnknownBridgeTarget } from "../domain/errors.ts"
import {
  type BridgeRouter,
  BridgeRecipientGone,
  clampTtl,
  dataMapOf,
  parseJson,
  platformRequest,
  routerTokenOf,
  unroutable,
  upstreamError
} from "./bridge.ts"
import { makeTokenCache, type TokenCache } from "./token.ts"


export interface AdmProfile {
  readonly clientId: string
  readonly clientSecret: Redacted.Redacted<string>
}

export interface AdmOptions {
  readonly profiles: Readonly<Record<string, AdmProfile>>
  readonly minTtl: number
  readonly maxTtl: number
  readonly timeoutMs: number
  readonly baseUrl: string
}

const GONE: ReadonlySet<string> = new Set(["Unregistered", "InvalidRegistrationId"])

const authFailed = (detail: string) => new BridgeAuthFailed({ message: `ADM authentication failed: ${detail}` })

export const makeAdmRouter = (options: AdmOptions): BridgeRouter => {
  const fetchToken = (profile: AdmProfile) =>
    Effect.gen(function*() {
      const now = yield* Clock.currentTimeMillis
      const reply = yield* platformRequest("adm", `${options.baseUrl}/auth/O2/token`, {
        method: "POST",
        headers: { "content-type": "application/x-www-form-urlencoded" },
        body: new URLSearchParams({
          grant_type: "client_credentials",
          scope: "messaging:push",
          client_id: profile.clientId,
          client_secret: Redacted.value(profile.clientSecret)
        }).toString()
      }, options.timeoutMs)
      const json = parseJson(reply.text) as { access_token?: unknown; expires_in?: unknown } | undefined
      if (reply.status !== 200 || typeof json?.access_token !== "string") {
        return yield* authFailed(`token endpoint answered ${reply.status}`)
      }
      return { value: json.access_token, expiresAt: now + (typeof json.expires_in === "number" ? json.expires_in : 3600) * 1000 }
    })
  const tokens = new Map(
    Object.entries(options.profiles).map(([name, profile]) => [name, makeTokenCache(fetchToken(profile), 60_000)] as const)
  )
  type Tokens = TokenCache<Effect.Error<ReturnType<typeof fetchToken>>>

  return {
    platform: "adm",
    register: (profile, body) => {
      if (options.profiles[profile] === undefined) return Effect.fail(new UnknownBridgeTarget({ message: "Unknown ADM profile" }))
      const token = routerTokenOf(body)
      return token === undefined ? Effect.fail(new InvalidRouterToken()) : Effect.succeed({ token, app_id: profile })
    },
    send: (user, notification) =>
      Effect.gen(function*() {
        const cache = tokens.get(String(user.routerData["app_id"] ?? "")) as Tokens | undefined
        const registrationId = user.routerData["token"]
        if (cache === undefined || typeof registrationId !== "string") {
          return yield* unroutable("adm", "profile", registrationId)
        }
        const body = JSON.stringify({
          data: yield* dataMapOf(notification),
          consolidationKey: notification.topic ?? notification.channelId,
          expiresAfter: clampTtl(notification.ttl, options.minTtl, options.maxTtl)
        })
        const post = (accessToken: string) =>
          platformRequest("adm", `${options.baseUrl}/messaging/registrations/${encodeURIComponent(registrationId)}/messages`, {
            method: "POST",
            headers: {
              authorization: `Bearer ${accessToken}`,
              "content-type": "application/json",
              accept: "application/json",
              "x-amzn-type-version": "com.amazon.device.messaging.ADMMessage@1.0",
              "x-amzn-accept-type": "com.amazon.device.messaging.ADMSendResult@1.0"
            },
            body
          }, options.timeoutMs)
        let accessToken = yield* cache.get
        let reply = yield* post(accessToken)
        if (reply.status === 401) {
          cache.invalidate(accessToken)
          accessToken = yield* cache.get
          reply = yield* post(accessToken)
        }
        if (reply.status === 200) return
        if (reply.status === 401) return yield* authFailed("ADM refused the access token")
        const reason = (parseJson(reply.text) as { reason?: unknown } | undefined)?.reason
        if (typeof reason === "string" && GONE.has(reason)) {
          return yield* new BridgeRecipientGone({ message: "ADM recipient no longer available" })
        }
        return yield* upstreamError("adm", reply.status, typeof reason === "string" ? reason : undefined)
      })
  }
}
