/**
 * What every bridge shares: the shape of a bridge router, the message data map and its size check,
 * the Urgency it is sent with, and an HTTP client whose failures are already the 502s of the API
 * (auth 901, connect 902, timeout 903).
 *
 * A bridge router validates what a client registers with (token, app id / channel) into the user's
 * `router_data`, and hands a message to its platform. "Recipient gone" is `BridgeRecipientGone`: the
 * endpoint then drops the user and answers 410/106. A platform over its quota is answered 429/116
 * and one briefly unavailable 503/201, each with a `Retry-After` taken from the platform's.
 */
import * as Data from "effect/Data"
import * as Effect from "effect/Effect"
import {
  type BridgeAuthFailed,
  BridgeNotConfigured,
  type BridgeRateLimited,
  BridgeTimeout,
  type BridgeUnavailable,
  BridgeUnreachable,
  BridgeUpstreamError,
  InvalidRequestBody,
  type InvalidRouterToken,
  PayloadTooLarge,
  type UnknownBridgeTarget
} from "../domain/errors.ts"
import type { Notification, Urgency } from "../domain/notification.ts"
import type { UserRecord } from "../domain/user.ts"

type Platform = "fcm" | "apns" | "adm" | "stub"

/** The platform says the device is no longer registered: the user is dropped (410/106). */
export class BridgeRecipientGone extends Data.TaggedError("BridgeRecipientGone")<{ readonly message: string }> {}

export type BridgeError =
  | BridgeNotConfigured
  | BridgeAuthFailed
  | BridgeUnreachable
  | BridgeTimeout
  | BridgeUpstreamError
  | BridgeRateLimited
  | BridgeUnavailable
  | BridgeRecipientGone
  | PayloadTooLarge

type RegistrationError = InvalidRouterToken | UnknownBridgeTarget | InvalidRequestBody

/** A registration body (`POST`/`PUT .../registration`), as parsed JSON. */
export interface RegistrationBody {
  readonly token?: unknown
  readonly aps?: unknown
}

export interface BridgeRouter {
  readonly platform: Platform
  /** The `router_data` of a client registering `body` under `appId` (app id, APNs channel, ADM profile). */
  readonly register: (appId: string, body: RegistrationBody) => Effect.Effect<Readonly<Record<string, unknown>>, RegistrationError>
  /** Hand `notification` to the platform for `user`. */
  readonly send: (user: UserRecord, notification: Notification) => Effect.Effect<void, BridgeError>
}

/** Router tokens of the real platforms: at least 8 characters, no spaces. */
const ROUTER_TOKEN = /^[^ ]{8,}$/

export const routerTokenOf = (body: RegistrationBody): string | undefined =>
  typeof body.token === "string" && ROUTER_TOKEN.test(body.token) ? body.token : undefined

// ── the message as the platforms carry it ────────────────────────────────────────────────────────

/** Bridged payloads are limited by the platforms (FCM data, APNs payload): 4 KiB. */
const MAX_BRIDGE_DATA = 4096

/** 413/104 for a serialized payload of `size` bytes, saying by how much it is over. */
export const checkBridgeSize = (size: number): Effect.Effect<void, PayloadTooLarge> =>
  size > MAX_BRIDGE_DATA
    ? Effect.fail(new PayloadTooLarge({
      message: `This message is intended for a constrained device and is limited in size. Converted buffer is too long by ${size - MAX_BRIDGE_DATA} bytes`
    }))
    : Effect.void

/**
 * The data map's key for each header a message is stored with: `con` the `Content-Encoding`, `enc`
 * and `cryptokey` the `aesgcm` parameters, `cty` the content type of an HPKE message (which has no
 * `con`: its absence, and `cty`, tell the client which scheme decrypts it).
 */
const DATA_MAP_KEYS = [["encoding", "con"], ["encryption", "enc"], ["crypto_key", "cryptokey"], ["content_type", "cty"]] as const

/**
 * The data map (`chid`, and with a payload `body` and the headers of `DATA_MAP_KEYS` it has). What
 * the client needs to decrypt; too large once serialized → 413/104, saying by how much.
 */
export const dataMapOf = (notification: Notification): Effect.Effect<Record<string, string>, PayloadTooLarge> => {
  const map: Record<string, string> = { chid: notification.channelId }
  const headers = notification.headers
  if (notification.data !== undefined && headers !== undefined) {
    map["body"] = notification.data
    for (const [header, key] of DATA_MAP_KEYS) {
      const value = headers[header]
      if (value !== undefined) map[key] = value
    }
  }
  return Effect.as(checkBridgeSize(Buffer.byteLength(JSON.stringify(map))), map)
}

/** TTL the platform is given: within its `[min, max]`. */
export const clampTtl = (ttl: number, min: number, max: number): number => Math.min(max, Math.max(min, ttl))

/** High urgency asks for an immediate wake-up; low and very-low allow the platform to save power. */
export const urgencyClass = (urgency: Urgency | undefined): "immediate" | "power-saving" | "default" =>
  urgency === "high" ? "immediate" : urgency === "low" || urgency === "very-low" ? "power-saving" : "default"

// ── HTTP/1.1 to a platform ──────────────────────────────────────────────────────────────────────

export interface PlatformReply {
  readonly status: number
  readonly text: string
  /** The reply's `Retry-After` header, as sent. */
  readonly retryAfter?: string | undefined
}

/** `JSON.parse` that says undefined instead of throwing. */
export const parseJson = (text: string): unknown => {
  try {
    return JSON.parse(text)
  } catch {
    return undefined
  }
}

/**
 * What a user's router data names (app id, channel, profile) is not configured (any more): 502/900,
 * and the user is kept — a configuration mistake must not drop every user of an app. A user whose
 * router data has no token can never be reached: it is dropped.
 */
export const unroutable = (platform: Platform, target: string, token: unknown) =>
  typeof token !== "string"
    ? new BridgeRecipientGone({ message: "Bridge reports user was not found" })
    : new BridgeNotConfigured({ message: `No ${platform} ${target} is configured for this user` })

/** A request to a platform: a transport failure is 502/902, no answer within `timeoutMs` 502/903. */
export const platformRequest = (
  platform: Platform,
  url: string,
  init: { readonly method: string; readonly headers: Record<string, string>; readonly body: string },
  timeoutMs: number
): Effect.Effect<PlatformReply, BridgeUnreachable | BridgeTimeout> =>
  Effect.tryPromise({
    try: async (signal) => {
      const response = await fetch(url, { ...init, signal: AbortSignal.any([signal, AbortSignal.timeout(timeoutMs)]) })
      return { status: response.status, text: await response.text(), retryAfter: response.headers.get("retry-after") ?? undefined }
    },
    catch: (cause) =>
      (cause as { readonly name?: string }).name === "TimeoutError"
        ? new BridgeTimeout({ message: `${platform} did not answer in time` })
        : new BridgeUnreachable({ message: `${platform} could not be reached` })
  })

/** The bounds of a `Retry-After` passed on from a platform, in seconds. */
const RETRY_AFTER_MIN = 10
const RETRY_AFTER_MAX = 3600

/**
 * A platform's `Retry-After` (RFC 9110 §10.2.3: delay-seconds, or an HTTP-date) as the seconds the
 * sender is told to wait, within [10, 3600]; undefined when there is none or it does not parse.
 */
export const retryAfterOf = (header: string | undefined, nowMs: number): number | undefined => {
  const value = header?.trim() ?? ""
  let seconds: number
  if (/^\d+$/.test(value)) seconds = Number(value)
  else if (/^[A-Za-z]{3}/.test(value) && !Number.isNaN(Date.parse(value))) seconds = Math.ceil((Date.parse(value) - nowMs) / 1000)
  else return undefined
  return Math.min(RETRY_AFTER_MAX, Math.max(RETRY_AFTER_MIN, seconds))
}

/** Garbage or an error we have no better mapping for: 502 with the platform's status. */
export const upstreamError = (platform: Platform, status: number, reason?: string) =>
  new BridgeUpstreamError({ message: `${platform} answered ${status}${reason !== undefined ? ` (${reason})` : ""}` })

/** A setting that is a PEM/JSON value or the path of a file holding it. */
export const inlineOrFile = (value: string, readFile: (path: string) => string): string =>
  /^\s*[{-]/.test(value) ? value : readFile(value)

export const badBody = (message: string) => new InvalidRequestBody({ message })
