/**
 * The first step of a push: validation, from the request to an `AcceptedPush` (the message made,
 * `notification.accepted.1` recorded, with a receipt folded into its row first) or the `ApiError`
 * of the first rule it breaks. The rules run in autopush's order, so that a request that is wrong
 * in several ways always gets the same error; this service adds #2b, before #3 reads `Crypto-Key`.
 * What becomes of an accepted push: `deliverPush.ts`.
 *
 * The push rules, in the order they are applied (status/errno of a push that breaks one):
 *  1. the API version segment is `v1` (or none) or `v2` (404/102);
 *  2. the token decrypts under one of the keys (404/102);
 *  2b. each encryption header a message is stored with (`Encryption`, `Crypto-Key`,
 *      `Encryption-Key`) is at most 512 characters (400/120);
 *  3. an `Authorization` header parses as VAPID credentials (401/109; a `WebPush`/`Bearer` scheme
 *     without a `p256ecdsa` key in `Crypto-Key`: 400/110), `vapid.ts`;
 *  4. their JWT is ES256, signed by their key, for this endpoint's origin, not expired nor expiring
 *     more than 24 h ahead (401/109), `vapid.ts`;
 *  5. the token's plaintext has its version's length: 32 bytes for v1, 64 for v2 (404/102);
 *  6. a v2 endpoint takes only pushes signed by the key it was made for, and with `require_vapid`
 *     every push is signed (401/109);
 *  7. the user has a router record (410/106), `subscriber.ts`;
 *  8. the user has a destination: a WebPush user whose message table is still served, or a bridge
 *     this node is configured for (410/106; a user never delivered to is dropped), `subscriber.ts`;
 *  9. a WebPush user has the channel (410/106), `subscriber.ts`;
 *  10. the body is at most `max_data_bytes` (413/104), `pushRequest.ts`;
 *  11. `TTL` is a 64-bit integer (400/111);
 *  12. `TTL` is not negative (400/114);
 *  13. a `TTL` above `max_notification_ttl` is capped to it;
 *  14. `Topic`, if given, is at most 32 characters of the URL-safe base64 alphabet (400/113);
 *  15. a non-empty body has the encryption headers its `Content-Encoding` needs, or is an HPKE
 *      message (400/110); an empty body's are ignored;
 *  16. `Urgency`, if given, is `very-low`, `low`, `normal` or `high` (400/115).
 * Rules 11–16 are `headers.ts`'s.
 *
 * A storage failure is not answered here: it goes up as a `StorageError`, to the error edge.
 */
import type * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as Result from "effect/Result"
import type { Mutable } from "effect/Types"
import {
  decodeVapidPublicKey,
  type EndpointToken,
  EndpointCrypto,
  type EndpointVersion,
  matchesVapidKey
} from "../crypto/endpoint.ts"
import { type ApiError, InvalidApiVersion, InvalidAuth, InvalidToken } from "../domain/errors.ts"
import { domainEvent, type EventData } from "../domain/events.ts"
import type { Notification, Urgency } from "../domain/notification.ts"
import { RecentMap } from "../platform/memo.ts"
import type { StorageError } from "../storage/Storage.ts"
import { encryptionHeaderLengthsOf, encryptionOf, type RequestHeaders, topicOf, ttlOf, urgencyOf } from "./headers.ts"
import { endpointOrigin, type EndpointOptions } from "./options.ts"
import type { PushRequest } from "./pushRequest.ts"
import type { RateLimits } from "./rateLimits.ts"
import type { Receipts } from "./receipts.ts"
import type { Subscribers, Target } from "./subscriber.ts"
import { parseVapid, type SenderWarning, senderWarnings, type VerifiedVapid, verifyVapid } from "./vapid.ts"

/**
 * A message this service makes itself for a subscription (the Matrix push gateway, `gateway/`):
 * its body is plaintext JSON rather than an encrypted payload, and its TTL and urgency are given,
 * not read from headers. It goes through the same checks as a push from the token on (#1, #2, #5–#9;
 * with no VAPID credentials, so a v2 endpoint bound to a key refuses it at #6, as `require_vapid`
 * does) and the subscription's limit, but not the sender's address limit (its sender limits it) nor
 * the encryption rule (#15).
 * Only `sendMade` takes one, and nothing of an HTTP request can make one: a push over HTTP never
 * skips #15.
 */
export interface MadePush {
  /** The message, as the client gets it (at most `max_data_bytes`: the maker sees to it). */
  readonly body: Buffer
  /** Seconds (capped to `max_notification_ttl`). */
  readonly ttl: number
  readonly urgency: Urgency
}

/** A push that broke no rule: the message as made, where it goes, and when it was accepted. */
export interface AcceptedPush {
  readonly uaid: string
  readonly target: Target
  readonly notification: Notification
  /** The receipt subscription of `Push-Receipt`, if any (its row is open). */
  readonly receipt: string | undefined
  /** ms */
  readonly acceptedAt: number
  /** The verified VAPID key it was signed with, if any. */
  readonly vapidKey: Buffer | undefined
  /** What another push service would refuse of it (`senderWarnings`); a made message has none. */
  readonly warnings: ReadonlyArray<SenderWarning>
}

const NO_WARNINGS: ReadonlyArray<SenderWarning> = []

/** What a made message is stored and delivered with in place of encryption headers: none. */
const PLAINTEXT: Readonly<Record<string, string>> = {}

/** A token that decrypted but to the wrong length: reported by rule #5, after the VAPID rules. */
const BAD_LENGTH = "bad-length" as const

/**
 * A stage's verdict in the push's generator: its value, or its error failing the push. The rules are
 * plain functions of the request, grouped in stages between the steps that wait for something: a
 * stage passed costs no Effect to evaluate (they run on every push).
 */
function* verdict<A, E>(result: Result.Result<A, E>): Generator<Effect.Effect<never, E>, A> {
  return Result.isSuccess(result) ? result.success : yield* Effect.fail(result.failure)
}

const PASSED: Result.Result<void, never> = Result.succeed(undefined)

/** #1 */
const apiVersionOf = (segment: string | undefined): Result.Result<EndpointVersion, InvalidApiVersion> =>
  segment === undefined || segment === "v1" ? Result.succeed("v1")
  : segment === "v2" ? Result.succeed("v2")
  : Result.fail(new InvalidApiVersion())

/** #2: decrypts under some key (the length is rule #5). */
const openToken = (
  crypto: EndpointCrypto["Service"],
  version: EndpointVersion,
  token: string
): Result.Result<EndpointToken | typeof BAD_LENGTH, InvalidToken> => {
  const opened = crypto.openEndpoint(version, token)
  return Result.isSuccess(opened) ? Result.succeed(opened.success)
    : opened.failure.reason === BAD_LENGTH ? Result.succeed(BAD_LENGTH)
    : Result.fail(new InvalidToken())
}

/** #3 + #4: credentials parsed, then their JWT verified for the endpoint's `origin` (none: undefined, at once). */
/** A push's VAPID credentials as parsed (once a push: the sender's claim and #3 read the same). */
type VapidParsed = ReturnType<typeof parseVapid>

const vapidOf = (credentials: VapidParsed, origin: string, nowMs: number) =>
  Result.isFailure(credentials) ? Effect.fail(credentials.failure)
    : credentials.success === undefined ? undefined
    : verifyVapid(credentials.success, origin, Math.floor(nowMs / 1000))

/** #5 */
const subscriptionOf = (opened: EndpointToken | typeof BAD_LENGTH): Result.Result<EndpointToken, InvalidToken> =>
  opened === BAD_LENGTH ? Result.fail(new InvalidToken()) : Result.succeed(opened)

/** #6: a v2 endpoint only takes messages signed with the key it was made for; with `require_vapid`, every one signed. */
const checkBoundKey = (options: EndpointOptions, token: EndpointToken, vapid: VerifiedVapid | undefined): Result.Result<void, InvalidAuth> =>
  vapid === undefined && options.requireVapid === true ? Result.fail(new InvalidAuth({ message: "This server accepts only VAPID-signed pushes" }))
  : token.keyHash === undefined ? PASSED
  : vapid === undefined ? Result.fail(new InvalidAuth({ message: "Missing VAPID public key" }))
  : matchesVapidKey(token, vapid.rawKey) ? PASSED
  : Result.fail(new InvalidAuth({ message: "VAPID public key mismatch" }))

/**
 * The storage ms of a timestamp message: now, or the ms after the last one this node gave the
 * channel. Two messages of a channel in one ms would share a storage key (the later one is then
 * moved to the next free ms by another conditional write): a burst to one channel does not
 * collide on this node. Kept for the channels of the last 10,000 pushes, by channel id alone (a
 * random UUID; were two users to share one, their messages would only take later ms).
 */
const makeSortKeys = () => {
  const lastSortKeyMs = new RecentMap<number>(10_000)
  return (channelId: string, nowMs: number): number => {
    const ms = Math.max(nowMs, (lastSortKeyMs.get(channelId) ?? 0) + 1)
    lastSortKeyMs.set(channelId, ms)
    return ms
  }
}

/** What the rules read of a push's headers (#11–#16). */
interface MessageHeaders {
  readonly ttl: number
  readonly topic: string | undefined
  readonly encryption: Readonly<Record<string, string>> | undefined
  readonly urgency: Urgency | undefined
}

/** What the rules read of a push, to make its message. */
interface Checked {
  readonly uaid: string
  readonly channelId: string
  readonly nowMs: number
  readonly ttl: number
  readonly topic: string | undefined
  readonly urgency: Urgency | undefined
  readonly receipt: string | undefined
  readonly body: Buffer
  readonly encryption: Readonly<Record<string, string>> | undefined
}

/** The message of a push that passed the rules, under its new message id (made now, by `clock`). */
const messageOf = (
  crypto: EndpointCrypto["Service"],
  sortKeyMs: (channelId: string, nowMs: number) => number,
  clock: Clock.Clock,
  push: Checked
): Notification => {
  const { uaid, channelId, nowMs, topic, urgency, receipt, encryption } = push
  const sortkeyTimestamp = topic !== undefined ? nowMs : sortKeyMs(channelId, nowMs)
  const version = crypto.messageIdAt(
    clock.currentTimeMillisUnsafe(),
    topic !== undefined
      ? { kind: "topic", uaid, channelId, topic, receipt }
      : { kind: "timestamp", uaid, channelId, sortkeyTimestamp, receipt }
  )
  // Fields set one by one, in the order of the interface: a spread of a conditional literal per
  // optional field allocates that literal and defines its keys through the runtime, on every push.
  const notification: Mutable<Notification> = { channelId, version, ttl: push.ttl, timestamp: Math.floor(nowMs / 1000), sortkeyTimestamp }
  if (topic !== undefined) notification.topic = topic
  if (urgency !== undefined) notification.urgency = urgency
  if (receipt !== undefined) notification.receipt = receipt
  if (encryption !== undefined) {
    notification.data = push.body.toString("base64url")
    notification.headers = encryption
  }
  return notification
}

export const makeAcceptPush = Effect.fnUntraced(function*(
  options: EndpointOptions,
  receipts: Receipts,
  limits: RateLimits,
  subscribers: Subscribers
) {
  const crypto = yield* EndpointCrypto
  const origin = endpointOrigin(options.endpointUrl)
  const sortKeyMs = makeSortKeys()

  /**
   * The sender a push names, if it does: the raw key of its credentials, when it is to a v2
   * subscription bound to that key. Only a claim until its signature is checked (#4). Read from
   * what the push carries, before any limit: its token opened (once per token, `openEndpoint`
   * remembers), for a v2 push whose credentials parsed (once: #3 takes the same).
   */
  const boundKeyClaimed = (versionSegment: string | undefined, token: string, credentials: VapidParsed): Buffer | undefined => {
    if (versionSegment !== "v2" || Result.isFailure(credentials) || credentials.success === undefined) return undefined
    const opened = crypto.openEndpoint("v2", token)
    if (Result.isFailure(opened) || opened.success.keyHash === undefined) return undefined
    const rawKey = decodeVapidPublicKey(credentials.success.publicKey)
    return rawKey !== undefined && matchesVapidKey(opened.success, rawKey) ? rawKey : undefined
  }

  /**
   * The sender's address limit, before any work for the sender: a token of its address for a push
   * that does not name its sender; for one that does, whether the key it claims may have one more
   * signature fail from its address (its key's limit comes once the signature verified). Then #1,
   * #2 and #2b.
   */
  const tokenStage = (
    request: PushRequest,
    versionSegment: string | undefined,
    token: string,
    claimed: Buffer | undefined,
    made: MadePush | undefined,
    nowMs: number
  ): Result.Result<EndpointToken | typeof BAD_LENGTH, ApiError> => {
    if (made === undefined) {
      const forwardedFor = request.headers["x-forwarded-for"]
      const limited = claimed !== undefined ? limits.signatureCheck(request.peer, forwardedFor, claimed, nowMs)
        : limits.address(request.peer, forwardedFor, nowMs)
      if (Result.isFailure(limited)) return Result.fail(limited.failure)
    }
    const apiVersion = apiVersionOf(versionSegment)
    if (Result.isFailure(apiVersion)) return Result.fail(apiVersion.failure)
    const opened = openToken(crypto, apiVersion.success, token)
    if (Result.isFailure(opened)) return opened
    const lengths = encryptionHeaderLengthsOf(request.headers)
    return Result.isFailure(lengths) ? Result.fail(lengths.failure) : opened
  }

  /**
   * The VAPID key's limit (a verified key only: nobody drains another's), #5 and #6, then the
   * subscription's limit (whoever sends: only a sender the subscription takes pushes from spends it).
   */
  const signerStage = (
    opened: EndpointToken | typeof BAD_LENGTH,
    vapid: VerifiedVapid | undefined,
    nowMs: number
  ): Result.Result<EndpointToken, ApiError> => {
    if (vapid !== undefined) {
      const limited = limits.vapidKey(vapid.rawKey, nowMs)
      if (Result.isFailure(limited)) return Result.fail(limited.failure)
    }
    const subscription = subscriptionOf(opened)
    if (Result.isFailure(subscription)) return Result.fail(subscription.failure)
    const bound = checkBoundKey(options, subscription.success, vapid)
    if (Result.isFailure(bound)) return Result.fail(bound.failure)
    const limited = limits.subscription(subscription.success.uaid, subscription.success.channelId, nowMs)
    return Result.isFailure(limited) ? Result.fail(limited.failure) : subscription
  }

  /** #3 + #4; a push that claimed its subscription's key and fails them is counted (`signatureFailed`). */
  const signerOf = (request: PushRequest, credentials: VapidParsed, claimed: Buffer | undefined, nowMs: number) => {
    const verifying = vapidOf(credentials, origin, nowMs)
    return verifying === undefined || claimed === undefined ? verifying
      : Effect.tapError(verifying, () => Effect.sync(() => limits.signatureFailed(request.peer, request.headers["x-forwarded-for"], claimed, nowMs)))
  }

  /** #11–#16; a made message brings its TTL and urgency, and is plaintext. */
  const headersStage = (headers: RequestHeaders, body: Buffer, made: MadePush | undefined): Result.Result<MessageHeaders, ApiError> => {
    if (made !== undefined) {
      const topic = topicOf(headers)
      return Result.isFailure(topic) ? Result.fail(topic.failure)
        : Result.succeed({ ttl: Math.min(made.ttl, options.maxNotificationTtl), topic: topic.success, encryption: PLAINTEXT, urgency: made.urgency })
    }
    const ttl = ttlOf(headers, options.maxNotificationTtl)
    if (Result.isFailure(ttl)) return Result.fail(ttl.failure)
    const topic = topicOf(headers)
    if (Result.isFailure(topic)) return Result.fail(topic.failure)
    const encryption = encryptionOf(headers, body.length > 0)
    if (Result.isFailure(encryption)) return Result.fail(encryption.failure)
    const urgency = urgencyOf(headers) // RFC 8030 §5.3
    if (Result.isFailure(urgency)) return Result.fail(urgency.failure)
    return Result.succeed({ ttl: ttl.success, topic: topic.success, encryption: encryption.success, urgency: urgency.success })
  }

  /**
   * The rules, in order; a made message skips those of its sender (see `MadePush`). Evaluated at
   * `clock`'s time; what waits for anything (VAPID's signature, storage, the body) is yielded, the
   * rest runs as plain code.
   */
  const accept = Effect.fnUntraced(function*(
    clock: Clock.Clock,
    request: PushRequest,
    versionSegment: string | undefined,
    token: string,
    made: MadePush | undefined
  ): Effect.fn.Return<AcceptedPush, ApiError | StorageError> {
    const headers: RequestHeaders = request.headers
    const nowMs = clock.currentTimeMillisUnsafe()
    const credentials = parseVapid(headers)
    const claimed = made === undefined ? boundKeyClaimed(versionSegment, token, credentials) : undefined
    const opened = yield* verdict(tokenStage(request, versionSegment, token, claimed, made, nowMs)) // #1, #2, #2b
    const verifying = signerOf(request, credentials, claimed, nowMs)                      // #3, #4
    const vapid = verifying === undefined ? undefined : yield* verifying
    const subscription = yield* verdict(signerStage(opened, vapid, nowMs))                // #5, #6
    const target = yield* subscribers.targetOf(subscription.uaid, subscription.channelId, nowMs) // #7–#9
    const body = yield* request.body                                                      // #10
    const { ttl, topic, encryption, urgency } = yield* verdict(headersStage(headers, body, made)) // #11–#16
    const receiptUrl = headers["push-receipt"]                          // Push-Receipt (RFC 8030 §5.1)
    const receipt = receiptUrl === undefined ? undefined : yield* receipts.claim(receiptUrl)
    const { uaid, channelId } = subscription
    const notification = messageOf(crypto, sortKeyMs, clock, { uaid, channelId, nowMs, ttl, topic, urgency, receipt, body, encryption })
    // With a receipt, its row is opened first (the fold of this event): a failure is a 503, nothing sent.
    const data: Mutable<EventData<"notification.accepted.1">> = { channelId, version: notification.version, ttl }
    if (urgency !== undefined) data.urgency = urgency
    if (receipt !== undefined) data.receipt = receipt
    yield* receipts.accepted(domainEvent("notification.accepted.1", uaid, nowMs, data))
    const warnings = made === undefined ? senderWarnings(vapid, encryption?.["encoding"]) : NO_WARNINGS
    return { uaid, target, notification, receipt, acceptedAt: nowMs, vapidKey: vapid?.rawKey, warnings }
  })

  return accept
})
