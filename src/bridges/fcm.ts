/**
 * Firebase Cloud Messaging, HTTP v1 API. Each app id has a project and a service account; the access
 * token is obtained with the service-account JWT flow (RS256 assertion posted to the account's
 * `token_uri`), kept until a minute before it expires, fetched again once when FCM answers 401.
 *
 * `POST {base_url}/v1/projects/{project_id}/messages:send` with
 * `{"message":{"token","android":{"ttl":"<n>s","priority"?,"data":{…}}}}`. Errors, by FCM's HTTP
 * status and the `error.status` of its JSON body:
 * - 404 (NOT_FOUND / UNREGISTERED): the app is gone from the device: user dropped, 410/106;
 * - 401 (UNAUTHENTICATED) twice: 502/901;
 * - 429 (RESOURCE_EXHAUSTED, the project's or the device's quota): 429/116 with FCM's `Retry-After`
 *   (within 10–3600 s; 120 s when FCM gives none or one that does not parse);
 * - 503 (UNAVAILABLE), and INTERNAL (500 with FCM's JSON error), which FCM says to retry with
 *   backoff: 503/201 with FCM's `Retry-After` (within 10–3600 s), else the usual 503 one;
 * - anything else (INVALID_ARGUMENT, SENDER_ID_MISMATCH, a 500 that is not FCM's JSON…): 502.
 */
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as Redacted from "effect/Redacted"
import { importPKCS8 } from "jose/key/import"
import { SignJWT } from "jose/jwt/sign"
import { BridgeAuthFailed, BridgeRateLimited, BridgeUnavailable, UnknownBridgeTarget } from "../domain/errors.ts"
import { InvalidRouterToken } from "../domain/errors.ts"
import {
  type BridgeRouter,
  BridgeRecipientGone,
  clampTtl,
  dataMapOf,
  parseJson,
  platformRequest,
  retryAfterOf,
  routerTokenOf,
  unroutable,
  upstreamError,
  urgencyClass
} from "./bridge.ts"
import { makeTokenCache, type TokenCache } from "./token.ts"

export const FCM_SCOPE = "https://www.googleapis.com/auth/firebase.messaging"
const GOOGLE_TOKEN_URI = "https://oauth2.googleapis.com/token"
const JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
/** Seconds a sender waits after FCM's RESOURCE_EXHAUSTED when FCM does not say (or says nothing usable). */
const QUOTA_RETRY_AFTER = 120

/** The fields of a Google service-account key file we use. */
export interface ServiceAccount {
  readonly client_email: string
  readonly private_key: Redacted.Redacted<string>
  readonly token_uri?: string | undefined
}

export interface FcmApp {
  readonly projectId: string
  readonly serviceAccount: ServiceAccount
}

export interface FcmOptions {
  /** By app id. */
  readonly apps: Readonly<Record<string, FcmApp>>
  readonly minTtl: number
  readonly maxTtl: number
  readonly timeoutMs: number
  readonly baseUrl: string
}

const authFailed = (detail: string) => new BridgeAuthFailed({ message: `FCM authentication failed: ${detail}` })

/** OAuth2 access token of a service account (JWT bearer grant). */
const fetchAccessToken = (account: ServiceAccount, timeoutMs: number) =>
  Effect.gen(function*() {
    const now = Math.floor((yield* Clock.currentTimeMillis) / 1000)
    const tokenUri = account.token_uri ?? GOOGLE_TOKEN_URI
    const assertion = yield* Effect.tryPromise({
      try: async () =>
        new SignJWT({ scope: FCM_SCOPE })
          .setProtectedHeader({ alg: "RS256", typ: "JWT" })
          .setIssuer(account.client_email)
          .setAudience(tokenUri)
          .setIssuedAt(now)
          .setExpirationTime(now + 3600)
          .sign(await importPKCS8(Redacted.value(account.private_key), "RS256")),
      catch: () => authFailed("the service account's private key is unusable")
    })
    const reply = yield* platformRequest("fcm", tokenUri, {
      method: "POST",
      headers: { "content-type": "application/x-www-form-urlencoded" },
      body: new URLSearchParams({ grant_type: JWT_BEARER, assertion }).toString()
    }, timeoutMs)
    const json = parseJson(reply.text) as { access_token?: unknown; expires_in?: unknown } | undefined
    if (reply.status !== 200 || typeof json?.access_token !== "string") {
      return yield* authFailed(`token endpoint answered ${reply.status}`)
    }
    const lifetime = typeof json.expires_in === "number" ? json.expires_in : 3600
    return { value: json.access_token, expiresAt: (now + lifetime) * 1000 }
  })

export const makeFcmRouter = (options: FcmOptions): BridgeRouter => {
  const tokens = new Map<string, TokenCache<unknown>>()
  for (const [appId, app] of Object.entries(options.apps)) {
    tokens.set(appId, makeTokenCache(fetchAccessToken(app.serviceAccount, options.timeoutMs), 60_000))
  }
  type Tokens = TokenCache<Effect.Error<ReturnType<typeof fetchAccessToken>>>

  const post = (app: FcmApp, accessToken: string, body: string) =>
    platformRequest("fcm", `${options.baseUrl}/v1/projects/${encodeURIComponent(app.projectId)}/messages:send`, {
      method: "POST",
      headers: { authorization: `Bearer ${accessToken}`, "content-type": "application/json" },
      body
    }, options.timeoutMs)

  return {
    platform: "fcm",
    register: (appId, body) => {
      if (options.apps[appId] === undefined) return Effect.fail(new UnknownBridgeTarget({ message: `Unknown FCM app_id` }))
      const token = routerTokenOf(body)
      return token === undefined ? Effect.fail(new InvalidRouterToken()) : Effect.succeed({ token, app_id: appId })
    },
    send: (user, notification) =>
      Effect.gen(function*() {
        const appId = String(user.routerData["app_id"] ?? "")
        const app = options.apps[appId]
        const cache = tokens.get(appId) as Tokens | undefined
        const deviceToken = user.routerData["token"]
        if (app === undefined || cache === undefined || typeof deviceToken !== "string") {
          return yield* unroutable("fcm", "app", deviceToken)
        }
        const data = yield* dataMapOf(notification)
        const priority = urgencyClass(notification.urgency)
        const body = JSON.stringify({
          message: {
            token: deviceToken,
            android: {
              ttl: `${clampTtl(notification.ttl, options.minTtl, options.maxTtl)}s`,
              ...(priority === "immediate" ? { priority: "HIGH" } : priority === "power-saving" ? { priority: "NORMAL" } : {}),
              data
            }
          }
        })
        let accessToken = yield* cache.get
        let reply = yield* post(app, accessToken, body)
        if (reply.status === 401) {
          cache.invalidate(accessToken)
          accessToken = yield* cache.get
          reply = yield* post(app, accessToken, body)
        }
        if (reply.status === 200) return
        if (reply.status === 401) return yield* authFailed("FCM refused the access token")
        const error = (parseJson(reply.text) as { error?: { status?: unknown } } | undefined)?.error
        const status = typeof error?.status === "string" ? error.status : undefined
        if (reply.status === 404) return yield* new BridgeRecipientGone({ message: "FCM recipient no longer available" })
        if (reply.status === 429 || status === "RESOURCE_EXHAUSTED") {
          const retryAfter = retryAfterOf(reply.retryAfter, yield* Clock.currentTimeMillis) ?? QUOTA_RETRY_AFTER
          return yield* new BridgeRateLimited({ message: `FCM sending quota exceeded, retry after ${retryAfter} s`, retryAfter })
        }
        if (reply.status === 503 || status === "UNAVAILABLE" || status === "INTERNAL") {
          const retryAfter = retryAfterOf(reply.retryAfter, yield* Clock.currentTimeMillis)
          return yield* new BridgeUnavailable({ message: `FCM is unavailable (${status ?? reply.status}), retry later`, retryAfter })
        }
        return yield* upstreamError("fcm", reply.status, status)
      })
  }
}
