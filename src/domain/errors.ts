/**
 * Every failure a client of the HTTP API can see, as tagged errors carrying their wire identity
 * (HTTP status, errno, message). `toErrorResponse` is the one place they become the error JSON of
 * autopush (`code`, `errno`, `error`, `message`, `more_info`); its table is keyed by every tag of
 * `ApiError`, so an error added to the union without a mapping does not typecheck.
 */
import * as Data from "effect/Data"

/**
 * `more_info` of every error: the service's own error reference, served on the endpoint port
 * (`GET /errors`, from the README's table), as a reference relative to the endpoint URL.
 */
export const MORE_INFO = "/errors"

/** 404/102: the `{v1|v2}` segment of `/wpush/...` is something else. */
export class InvalidApiVersion extends Data.TaggedError("InvalidApiVersion")<{}> {}
/** 404/102: the endpoint token does not decrypt, or decrypts to the wrong length. */
export class InvalidToken extends Data.TaggedError("InvalidToken")<{}> {}
/** 401/109: VAPID / Authorization problems (the message says which). */
export class InvalidAuth extends Data.TaggedError("InvalidAuth")<{ readonly message: string }> {}
/** 400/110: encryption headers (and the draft VAPID `Crypto-Key` key) missing or malformed. */
export class InvalidCryptoHeaders extends Data.TaggedError("InvalidCryptoHeaders")<{ readonly message: string }> {}
/**
 * 400/120: an encryption header a push would be stored and delivered with (`Encryption`,
 * `Crypto-Key`, `Encryption-Key`) is longer than any sender's real one may be.
 */
export class EncryptionHeaderTooLarge extends Data.TaggedError("EncryptionHeaderTooLarge")<{ readonly message: string }> {}
/** 410/106: unknown user, unknown channel, or a user dropped for its router type. */
export class NoSubscription extends Data.TaggedError("NoSubscription")<{ readonly message: string }> {}
/** 410/105: the user vanished between storing the message and notifying its node. */
export class UserDeletedDuringRouting extends Data.TaggedError("UserDeletedDuringRouting")<{}> {}
/**
 * 429/119: the subscription has as many messages stored as it may (`max_stored_per_subscription`),
 * not yet received by its client; retry after `retryAfter` seconds (the client drains them meanwhile).
 */
export class TooManyStored extends Data.TaggedError("TooManyStored")<{ readonly retryAfter: number }> {}
/** 410/103: bridge registration API with an unknown uaid. */
export class UaidNotFound extends Data.TaggedError("UaidNotFound")<{}> {}
/** 413/104: the body is larger than `max_data_bytes` (or a bridge's converted limit). */
export class PayloadTooLarge extends Data.TaggedError("PayloadTooLarge")<{ readonly message: string }> {}
/**
 * 413/121: bridge registration API, a channel beyond `max_channels_per_user` (the status the
 * WebSocket `register` answers beyond it; an errno of its own, since 104 tells a sender to send less).
 */
export class TooManyChannels extends Data.TaggedError("TooManyChannels")<{ readonly maxChannels: number }> {}
/** 400/111: TTL header missing or not an integer. */
export class MissingTtl extends Data.TaggedError("MissingTtl")<{}> {}
/** 400/114: TTL below zero. */
export class NegativeTtl extends Data.TaggedError("NegativeTtl")<{}> {}
/** 400/113: Topic header too long or outside the URL-safe base64 alphabet. */
export class InvalidTopic extends Data.TaggedError("InvalidTopic")<{ readonly message: string }> {}
/** 400/108: bridge registration with a router type we do not have. */
export class InvalidRouterType extends Data.TaggedError("InvalidRouterType")<{}> {}
/** 400/106: bridge registration for an app id (FCM), channel (APNs) or profile (ADM) this server has no credentials for. */
export class UnknownBridgeTarget extends Data.TaggedError("UnknownBridgeTarget")<{ readonly message: string }> {}
/** 400/115: an `Urgency` header other than very-low, low, normal or high (RFC 8030 §5.3). */
export class InvalidUrgency extends Data.TaggedError("InvalidUrgency")<{}> {}
/** 400/null: bridge registration with a malformed router token. */
export class InvalidRouterToken extends Data.TaggedError("InvalidRouterToken")<{}> {}
/** 400/null: `DELETE /m/{id}` with an id that does not decrypt to a message key. */
export class InvalidMessageId extends Data.TaggedError("InvalidMessageId")<{}> {}
/** 404/null: `DELETE /m/{id}` of a message no table holds under that id (delivered, expired, cancelled, replaced, or held by its client's connection). */
export class MessageNotStored extends Data.TaggedError("MessageNotStored")<{}> {}
/** 400/null: a request body that is not the JSON the route expects. */
export class InvalidRequestBody extends Data.TaggedError("InvalidRequestBody")<{ readonly message: string }> {}
/** 400/null: a request the HTTP parser could not read (request line, headers, framing), or a broken WebSocket handshake. */
export class MalformedRequest extends Data.TaggedError("MalformedRequest")<{ readonly message: string }> {}
/** 503/201: storage failed; the sender should retry later. */
export class StorageUnavailable extends Data.TaggedError("StorageUnavailable")<{
  /** Seconds until storage is worth trying again, when known (the storage breaker's next probe); else the usual 503 one. */
  readonly retryAfter?: number | undefined
}> {}
/**
 * The rate limit a request met: its sender's address, the VAPID key it is signed with, the
 * subscription it is sent to, or the pushes from its address whose signature for the key their
 * subscription is bound to failed.
 */
export type RateLimitName = "address" | "vapid_key" | "subscription" | "bad_signature"

/** What the 429's message says of each limit: who sent too much. */
const LIMITED_SENDER: { readonly [K in RateLimitName]: string } = {
  address: "from this address",
  vapid_key: "from this VAPID key",
  subscription: "to this subscription",
  bad_signature: "for this VAPID key with a signature that does not verify from this address"
}

/** 429/116: a request over one of its rate limits (`by`); retry after `retryAfter` seconds. */
export class RateLimited extends Data.TaggedError("RateLimited")<{ readonly by: RateLimitName; readonly retryAfter: number }> {}
/**
 * 429/116: held `GET`s of receipt subscriptions (collectors) beyond their cap for one subscription
 * or one client address; retry after `retryAfter` seconds (when the oldest of them ends at the latest).
 */
export class TooManyCollectors extends Data.TaggedError("TooManyCollectors")<{ readonly by: "receipt subscription" | "address"; readonly retryAfter: number }> {}
/**
 * 429/116: `POST /receipts` from an address that made `receipt_subscriptions_per_address` receipt
 * subscriptions lately; retry after `retryAfter` seconds (when it may make one more).
 */
export class TooManyReceiptSubscriptions extends Data.TaggedError("TooManyReceiptSubscriptions")<{ readonly retryAfter: number }> {}
/** 503/201: the node has `max_in_flight_requests` requests in hand; the sender should retry later. */
export class Overloaded extends Data.TaggedError("Overloaded")<{}> {}
/** 503/null: a WebSocket upgrade beyond `max_connections`. */
export class TooManyConnections extends Data.TaggedError("TooManyConnections")<{}> {}
/** 502/900: the user is registered through a bridge this server has no router for. */
export class BridgeNotConfigured extends Data.TaggedError("BridgeNotConfigured")<{ readonly message: string }> {}
/** 502/901: a bridge rejected our credentials. */
export class BridgeAuthFailed extends Data.TaggedError("BridgeAuthFailed")<{ readonly message: string }> {}
/** 502/902: a bridge could not be reached. */
export class BridgeUnreachable extends Data.TaggedError("BridgeUnreachable")<{ readonly message: string }> {}
/** 502/903: a bridge did not answer in time. */
export class BridgeTimeout extends Data.TaggedError("BridgeTimeout")<{ readonly message: string }> {}
/** 502/null: a bridge answered with an error we pass along. */
export class BridgeUpstreamError extends Data.TaggedError("BridgeUpstreamError")<{ readonly message: string }> {}
/**
 * 429/116: a bridge's platform is over its sending quota (FCM `RESOURCE_EXHAUSTED`); the sender
 * should retry after `retryAfter` seconds (the platform's own `Retry-After`, bounded).
 */
export class BridgeRateLimited extends Data.TaggedError("BridgeRateLimited")<{ readonly message: string; readonly retryAfter: number }> {}
/**
 * 503/201: a bridge's platform is briefly unavailable (FCM `UNAVAILABLE`, `INTERNAL`); the sender
 * should retry after `retryAfter` seconds when the platform said (bounded), else after the usual 503 delay.
 */
export class BridgeUnavailable extends Data.TaggedError("BridgeUnavailable")<{ readonly message: string; readonly retryAfter?: number | undefined }> {}
/** 404/null: router port — the client is not connected to this node, or its queue is full (the endpoint then stores). */
export class ClientUnavailable extends Data.TaggedError("ClientUnavailable")<{}> {}
/** 408/null: the request body stopped arriving (the connection is closed). */
export class RequestTimeout extends Data.TaggedError("RequestTimeout")<{}> {}
/** 404/null: the broadcast admin API has no broadcast of that id. */
export class BroadcastNotFound extends Data.TaggedError("BroadcastNotFound")<{}> {}
/** 404/null: no route for this path. */
export class RouteNotFound extends Data.TaggedError("RouteNotFound")<{}> {}
/** 405/null: the path exists, the method does not. */
export class MethodNotAllowed extends Data.TaggedError("MethodNotAllowed")<{}> {}
/** 418/999: `/__error__`, the operators' log check. */
export class LogCheck extends Data.TaggedError("LogCheck")<{}> {}
/** 500/999: a bug or an unexpected failure; details go to the log, not the wire. */
/** `Push-Receipt` does not name a live receipt subscription of this service (foreign, made up, or expired). */
export class InvalidReceipt extends Data.TaggedError("InvalidReceipt")<{ readonly message: string }> {}
/** A receipt subscription or push message status that is unknown, or no longer kept. */
export class ReceiptNotFound extends Data.TaggedError("ReceiptNotFound")<{ readonly message: string }> {}
/** Router port: a request between nodes without a signature (`Autopush-Router-Auth`). */
export class RouterAuthMissing extends Data.TaggedError("RouterAuthMissing")<{}> {}
/** Router port: a signature that is malformed, outside the time window, or not made with this deployment's keys. */
export class RouterAuthRefused extends Data.TaggedError("RouterAuthRefused")<{}> {}
export class InternalError extends Data.TaggedError("InternalError")<{ readonly cause?: unknown }> {}

export type ApiError =
  | InvalidApiVersion
  | InvalidToken
  | InvalidAuth
  | InvalidCryptoHeaders
  | EncryptionHeaderTooLarge
  | NoSubscription
  | UserDeletedDuringRouting
  | TooManyStored
  | UaidNotFound
  | PayloadTooLarge
  | TooManyChannels
  | MissingTtl
  | NegativeTtl
  | InvalidTopic
  | InvalidRouterType
  | InvalidRouterToken
  | UnknownBridgeTarget
  | InvalidUrgency
  | InvalidMessageId
  | MessageNotStored
  | InvalidRequestBody
  | MalformedRequest
  | StorageUnavailable
  | Overloaded
  | RateLimited
  | TooManyCollectors
  | TooManyReceiptSubscriptions
  | TooManyConnections
  | BridgeNotConfigured
  | BridgeAuthFailed
  | BridgeUnreachable
  | BridgeTimeout
  | BridgeUpstreamError
  | BridgeRateLimited
  | BridgeUnavailable
  | ClientUnavailable
  | RequestTimeout
  | RouteNotFound
  | BroadcastNotFound
  | MethodNotAllowed
  | LogCheck
  | InvalidReceipt
  | ReceiptNotFound
  | RouterAuthMissing
  | RouterAuthRefused
  | InternalError

interface ErrorBody {
  readonly code: number
  readonly errno: number | null
  readonly error: string
  readonly message: string
  readonly more_info: string
}

interface ErrorResponse {
  readonly status: number
  readonly headers: Readonly<Record<string, string>>
  readonly body: ErrorBody
}

interface WireIdentity<E> {
  readonly status: number
  readonly errno: number | null
  readonly message: (e: E) => string
}

type ErrorTable = { readonly [K in ApiError["_tag"]]: WireIdentity<Extract<ApiError, { _tag: K }>> }

const fixed = (text: string) => () => text
const own = (e: { readonly message: string }) => e.message

const table: ErrorTable = {
  InvalidApiVersion: { status: 404, errno: 102, message: fixed("Invalid API version") },
  InvalidToken: { status: 404, errno: 102, message: fixed("Invalid token") },
  InvalidAuth: { status: 401, errno: 109, message: own },
  InvalidCryptoHeaders: { status: 400, errno: 110, message: own },
  EncryptionHeaderTooLarge: { status: 400, errno: 120, message: own },
  NoSubscription: { status: 410, errno: 106, message: own },
  UserDeletedDuringRouting: { status: 410, errno: 105, message: fixed("User was deleted during routing") },
  TooManyStored: { status: 429, errno: 119, message: (e) => `Too many messages stored for this subscription, retry after ${e.retryAfter} s` },
  UaidNotFound: { status: 410, errno: 103, message: fixed("UAID not found") },
  PayloadTooLarge: { status: 413, errno: 104, message: own },
  TooManyChannels: { status: 413, errno: 121, message: (e) => `This user has ${e.maxChannels} channels, the most it may have: unsubscribe one first` },
  MissingTtl: { status: 400, errno: 111, message: fixed("Missing TTL value") },
  NegativeTtl: { status: 400, errno: 114, message: fixed("TTL must be greater than 0") },
  InvalidTopic: { status: 400, errno: 113, message: own },
  InvalidRouterType: { status: 400, errno: 108, message: fixed("Invalid router type") },
  InvalidRouterToken: { status: 400, errno: null, message: fixed("Invalid router token") },
  UnknownBridgeTarget: { status: 400, errno: 106, message: own },
  InvalidUrgency: { status: 400, errno: 115, message: fixed("Urgency must be one of very-low, low, normal, high") },
  InvalidMessageId: { status: 400, errno: null, message: fixed("Invalid message ID") },
  MessageNotStored: { status: 404, errno: null, message: fixed("No stored message has this ID") },
  InvalidRequestBody: { status: 400, errno: null, message: own },
  MalformedRequest: { status: 400, errno: null, message: own },
  StorageUnavailable: { status: 503, errno: 201, message: fixed("A database error occurred, retry later") },
  Overloaded: { status: 503, errno: 201, message: fixed("Too many requests in progress, retry later") },
  RateLimited: { status: 429, errno: 116, message: (e) => `Too many pushes ${LIMITED_SENDER[e.by]}, retry after ${e.retryAfter} s` },
  TooManyCollectors: { status: 429, errno: 116, message: (e) => `Too many open receipt collectors for this ${e.by}, retry after ${e.retryAfter} s` },
  TooManyReceiptSubscriptions: {
    status: 429,
    errno: 116,
    message: (e) => `Too many receipt subscriptions made from this address, retry after ${e.retryAfter} s (one subscription serves any number of pushes)`
  },
  TooManyConnections: { status: 503, errno: null, message: fixed("Too many connections, retry later") },
  BridgeNotConfigured: { status: 502, errno: 900, message: own },
  BridgeAuthFailed: { status: 502, errno: 901, message: own },
  BridgeUnreachable: { status: 502, errno: 902, message: own },
  BridgeTimeout: { status: 502, errno: 903, message: own },
  BridgeUpstreamError: { status: 502, errno: null, message: own },
  BridgeRateLimited: { status: 429, errno: 116, message: own },
  BridgeUnavailable: { status: 503, errno: 201, message: own },
  ClientUnavailable: { status: 404, errno: null, message: fixed("Client not available") },
  RequestTimeout: { status: 408, errno: null, message: fixed("The request body did not arrive in time") },
  RouteNotFound: { status: 404, errno: null, message: fixed("Not Found") },
  BroadcastNotFound: { status: 404, errno: null, message: fixed("Broadcast not found") },
  MethodNotAllowed: { status: 405, errno: null, message: fixed("Method Not Allowed") },
  LogCheck: { status: 418, errno: 999, message: fixed("LogCheck") },
  InvalidReceipt: { status: 400, errno: 117, message: own },
  ReceiptNotFound: { status: 404, errno: 118, message: own },
  RouterAuthMissing: { status: 401, errno: null, message: fixed("This request must be signed by a node of this deployment") },
  RouterAuthRefused: { status: 403, errno: null, message: fixed("The request's signature is not valid") },
  InternalError: { status: 500, errno: 999, message: fixed("An internal error occurred") }
}

/** Every answer of the API's table, as status and errno (the README's error table must list each). */
export const errorAnswers: ReadonlyArray<{ readonly tag: ApiError["_tag"]; readonly status: number; readonly errno: number | null }> =
  Object.entries(table).map(([tag, identity]) => ({ tag: tag as ApiError["_tag"], status: identity.status, errno: identity.errno }))

const REASONS: Readonly<Record<number, string>> = {
  400: "Bad Request",
  401: "Unauthorized",
  403: "Forbidden",
  404: "Not Found",
  405: "Method Not Allowed",
  408: "Request Timeout",
  410: "Gone",
  413: "Payload Too Large",
  418: "I'm a teapot",
  429: "Too Many Requests",
  500: "Internal Server Error",
  502: "Bad Gateway",
  503: "Service Unavailable"
}

/** The one edge mapping: an API error → status, extra headers and the error JSON body. */
export const toErrorResponse = (error: ApiError): ErrorResponse => {
  const identity = table[error._tag] as WireIdentity<ApiError>
  const headers: Record<string, string> = {}
  if (identity.status === 410) headers["cache-control"] = "max-age=86400"
  if (identity.status === 503) headers["retry-after"] = "120"
  if ("retryAfter" in error && error.retryAfter !== undefined) headers["retry-after"] = String(error.retryAfter)
  return {
    status: identity.status,
    headers,
    body: {
      code: identity.status,
      errno: identity.errno,
      error: REASONS[identity.status] ?? "Error",
      message: identity.message(error),
      more_info: MORE_INFO
    }
  }
}
