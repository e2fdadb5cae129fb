/**
 * Endpoint tokens, message ids and VAPID key hashes, byte for byte as autopush makes them (so
 * endpoints and message ids of an autopush deployment keep working with the same keys):
 *
 * - endpoint token: Fernet of `uaid (16 raw bytes) ‖ chid (16)` (v1) or `‖ sha256(raw VAPID key)` (v2);
 *   the URL carries it with `=` stripped, so parsing re-pads before decrypting.
 * - message id (`Location` suffix, WS `version`): Fernet of ASCII `01:{uaid}:{chid}:{topic}` or
 *   `02:{uaid}:{chid}:{sortkey ms}`, uuids in simple hex, padding kept.
 *
 * The pure functions take a `MultiFernet`; `EndpointCrypto` binds them to the configured keys.
 */
import { createHash, timingSafeEqual } from "node:crypto"
import * as Context from "effect/Context"
import * as Data from "effect/Data"
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Redacted from "effect/Redacted"
import * as Result from "effect/Result"
import { hyphenate, parseUuidHex } from "../domain/ids.ts"
import { memoize } from "../platform/memo.ts"
import type { MessageKey } from "../domain/notification.ts"
import {
  type FernetError,
  type FernetKey,
  type FernetKeyError,
  makeMultiFernet,
  type MultiFernet,
  padBase64,
  parseFernetKey
} from "./fernet.ts"

export type EndpointVersion = "v1" | "v2"

export interface EndpointToken {
  /** 32 lowercase hex. */
  readonly uaid: string
  /** Lowercase hyphenated. */
  readonly channelId: string
  /** v2 only: sha256 of the raw VAPID public key the subscription is bound to. */
  readonly keyHash?: Buffer
}

/**
 * A token that does not decrypt under any key (`reason` from Fernet) or decrypts to the wrong
 * length for its version (`bad-length`). The HTTP edge maps both to 404/102.
 */
class EndpointTokenError extends Data.TaggedError("EndpointTokenError")<{
  readonly reason: FernetError["reason"] | "bad-length"
}> {}

/** What a message id encrypts: whose message, and which. */
export type MessageIdData = MessageKey & {
  readonly uaid: string
  /** The receipt subscription of a message sent with `Push-Receipt`. */
  readonly receipt?: string | undefined
}

/** A message id that does not decrypt, or whose plaintext is not a message key. The edge maps it to 400. */
class MessageIdError extends Data.TaggedError("MessageIdError")<{
  readonly reason: FernetError["reason"] | "bad-format"
}> {}

/** Whether `text` holds lowercase hex digits from `from` to `to`. */
const lowerHex = (text: string, from: number, to: number): boolean => {
  for (let i = from; i < to; i++) {
    const c = text.charCodeAt(i)
    if (!((c >= 0x30 && c <= 0x39) || (c >= 0x61 && c <= 0x66))) return false
  }
  return true
}

/**
 * A uuid in simple hex. Our ids come in their canonical spellings (a uaid simple, a channel id
 * hyphenated, lowercase): taken as they are, checked digit by digit (a message id is made for every
 * push; a regular expression costs more here). Any other spelling is parsed. A uuid our own code
 * passed in was not one: a bug, not bad input, so it throws (a defect in Effect).
 */
const simpleHex = (uuid: string, what: string): string => {
  if (uuid.length === 32 && lowerHex(uuid, 0, 32)) return uuid
  if (
    uuid.length === 36 && uuid[8] === "-" && uuid[13] === "-" && uuid[18] === "-" && uuid[23] === "-" &&
    lowerHex(uuid, 0, 8) && lowerHex(uuid, 9, 13) && lowerHex(uuid, 14, 18) && lowerHex(uuid, 19, 23) && lowerHex(uuid, 24, 36)
  ) {
    return uuid.slice(0, 8) + uuid.slice(9, 13) + uuid.slice(14, 18) + uuid.slice(19, 23) + uuid.slice(24)
  }
  const hex = parseUuidHex(uuid)
  if (hex === undefined) throw new TypeError(`${what} is not a UUID`)
  return hex
}

// ── VAPID keys ───────────────────────────────────────────────────────────────────────────────────

/**
 * `text` without its trailing `=`, in one pass from the end (the pattern `/=+$/` tries every `=` of
 * a long run as a start: quadratic in a header's length).
 */
const withoutPadding = (text: string): string => {
  let end = text.length
  while (end > 0 && text.charCodeAt(end - 1) === 0x3d) end--
  return text.slice(0, end)
}

const STD_B64 = /^[A-Za-z0-9+/]+$/
const URL_B64 = /^[A-Za-z0-9_-]+$/

/**
 * The raw uncompressed P-256 point (65 bytes, 0x04 first) of a VAPID public key as sent in `k=` or
 * `Crypto-Key: p256ecdsa=`: standard base64 when it contains `/` or `+`, else base64url, trailing
 * `=` ignored. Undefined for anything else.
 */
export const decodeVapidPublicKey = (key: string): Buffer | undefined => {
  const s = withoutPadding(key)
  const standard = s.includes("/") || s.includes("+")
  if (!(standard ? STD_B64 : URL_B64).test(s) || s.length % 4 === 1) return undefined
  const raw = Buffer.from(s, standard ? "base64" : "base64url")
  return raw.length === 65 && raw[0] === 0x04 ? raw : undefined
}

export const vapidKeyHash = (rawKey: Uint8Array): Buffer => createHash("sha256").update(rawKey).digest()

/** Whether a v2 token is bound to this raw key (constant time); false for v1 tokens. */
export const matchesVapidKey = (token: EndpointToken, rawKey: Uint8Array): boolean =>
  token.keyHash !== undefined && timingSafeEqual(token.keyHash, vapidKeyHash(rawKey))

// ── endpoint tokens ──────────────────────────────────────────────────────────────────────────────

/** The token as it appears in the URL (no `=`), made at `nowSeconds`; v2 when a raw VAPID key is given. */
export const makeEndpointToken = (
  fernet: MultiFernet,
  nowSeconds: number,
  uaid: string,
  channelId: string,
  rawKey?: Uint8Array
): string => {
  const ids = Buffer.from(simpleHex(uaid, "uaid") + simpleHex(channelId, "channel id"), "hex")
  const plaintext = rawKey === undefined ? ids : Buffer.concat([ids, vapidKeyHash(rawKey)])
  return withoutPadding(fernet.encrypt(plaintext, { now: nowSeconds }))
}

/** `{endpointUrl}/wpush/{v1|v2}/{token}`; `endpointUrl` without a trailing slash. */
const makeEndpointUrl = (
  fernet: MultiFernet,
  nowSeconds: number,
  endpointUrl: string,
  uaid: string,
  channelId: string,
  rawKey?: Uint8Array
): string =>
  `${endpointUrl}/wpush/${rawKey === undefined ? "v1" : "v2"}/${makeEndpointToken(fernet, nowSeconds, uaid, channelId, rawKey)}`

export const parseEndpointToken = (
  fernet: MultiFernet,
  version: EndpointVersion,
  token: string
): Result.Result<EndpointToken, EndpointTokenError> => {
  const opened = fernet.decrypt(padBase64(token))
  if (Result.isFailure(opened)) return Result.fail(new EndpointTokenError({ reason: opened.failure.reason }))
  const plain = opened.success
  if (plain.length !== (version === "v1" ? 32 : 64)) return Result.fail(new EndpointTokenError({ reason: "bad-length" }))
  const uaid = plain.toString("hex", 0, 16)
  const channelId = hyphenate(plain.toString("hex", 16, 32))
  return Result.succeed(version === "v1" ? { uaid, channelId } : { uaid, channelId, keyHash: plain.subarray(32) })
}

// ── message ids ──────────────────────────────────────────────────────────────────────────────────

/**
 * `{kind}:{uaid}:{chid}:{topic or ms}`, then `:{receipt subscription}` for a message sent with a
 * receipt (so that its push message resource finds its status), encrypted.
 */
export const makeMessageId = (fernet: MultiFernet, nowSeconds: number, data: MessageIdData): string => {
  const ids = `${simpleHex(data.uaid, "uaid")}:${simpleHex(data.channelId, "channel id")}`
  const key = data.kind === "topic" ? `01:${ids}:${data.topic}` : `02:${ids}:${data.sortkeyTimestamp}`
  return fernet.encrypt(data.receipt === undefined ? key : `${key}:${data.receipt}`, { now: nowSeconds })
}

const HEX32 = /^[0-9a-fA-F]{32}$/
const SORTKEY = /^(?:0|[1-9][0-9]*)$/

export const parseMessageId = (fernet: MultiFernet, id: string): Result.Result<MessageIdData, MessageIdError> => {
  const opened = fernet.decrypt(id)
  if (Result.isFailure(opened)) return Result.fail(new MessageIdError({ reason: opened.failure.reason }))
  const parts = opened.success.toString("latin1").split(":")
  const [kind, uaid, chid, last, receipt] = parts
  if (
    parts.length < 4 || parts.length > 5 || receipt === "" || uaid === undefined || chid === undefined || last === undefined ||
    !HEX32.test(uaid) || !HEX32.test(chid) || last === ""
  ) {
    return Result.fail(new MessageIdError({ reason: "bad-format" }))
  }
  const ids = { uaid: uaid.toLowerCase(), channelId: hyphenate(chid.toLowerCase()), ...(receipt === undefined ? {} : { receipt }) }
  if (kind === "01") return Result.succeed({ kind: "topic", ...ids, topic: last })
  // Canonical digits only, so the storage sort key rebuilt from the number is the one we wrote.
  if (kind === "02" && SORTKEY.test(last) && Number.isSafeInteger(Number(last))) {
    return Result.succeed({ kind: "timestamp", ...ids, sortkeyTimestamp: Number(last) })
  }
  return Result.fail(new MessageIdError({ reason: "bad-format" }))
}

// ── service ──────────────────────────────────────────────────────────────────────────────────────

/** Endpoint tokens kept opened, at most (each about half a KiB). */
const TOKENS_REMEMBERED = 10_000

/** A configured crypto key that cannot be used; names its position in the list, never its value. */
class CryptoKeyConfigError extends Data.TaggedError("CryptoKeyConfigError")<{ readonly message: string }> {}

/** Fixed key for tests only (the Fernet spec's vector key). */
export const TEST_CRYPTO_KEY = "cw_0x689RpI-jtRR7oE8h_eQsKImvJapLeSbXpwF4e4="
export const TEST_ENDPOINT_URL = "http://localhost:8082"

interface EndpointCryptoOptions {
  /** Fernet key strings, newest first: the first encrypts, all decrypt. Redacted: never logged. */
  readonly keys: Redacted.Redacted<ReadonlyArray<string>>
  /** Public base URL of the endpoint nodes, e.g. `https://updates.push.example.com`. */
  readonly endpointUrl: string
}

/** Parse the key list into a MultiFernet, or say which entry is wrong. */
export const makeKeyRing = (keys: ReadonlyArray<string>): Result.Result<MultiFernet, CryptoKeyConfigError> => {
  const parsed: Array<FernetKey> = []
  for (const [index, key] of keys.entries()) {
    const result: Result.Result<FernetKey, FernetKeyError> = parseFernetKey(key)
    if (Result.isFailure(result)) {
      return Result.fail(
        new CryptoKeyConfigError({ message: `crypto key #${index + 1} of ${keys.length} is invalid: ${result.failure.message}` })
      )
    }
    parsed.push(result.success)
  }
  const [first, ...rest] = parsed
  if (first === undefined) return Result.fail(new CryptoKeyConfigError({ message: "at least one crypto key is required" }))
  return Result.succeed(makeMultiFernet([first, ...rest]))
}

export class EndpointCrypto extends Context.Service<EndpointCrypto, {
  /** Full endpoint URL for a subscription; v2 (bound to the key) when a raw VAPID key is given. */
  readonly makeEndpoint: (uaid: string, channelId: string, rawKey?: Uint8Array) => Effect.Effect<string>
  readonly parseEndpoint: (version: EndpointVersion, token: string) => Effect.Effect<EndpointToken, EndpointTokenError>
  /** `parseEndpoint` as a plain value: the push path's, which has no Effect to spare per push. */
  readonly openEndpoint: (version: EndpointVersion, token: string) => Result.Result<EndpointToken, EndpointTokenError>
  readonly makeMessageId: (data: MessageIdData) => Effect.Effect<string>
  /** `makeMessageId` stamped with `nowMs` (the caller's Clock), as a plain value: the push path's. */
  readonly messageIdAt: (nowMs: number, data: MessageIdData) => string
  readonly parseMessageId: (id: string) => Effect.Effect<MessageIdData, MessageIdError>
}>()("autopush/crypto/EndpointCrypto") {
  static readonly make = (options: EndpointCryptoOptions): Result.Result<EndpointCrypto["Service"], CryptoKeyConfigError> =>
    Result.map(makeKeyRing(Redacted.value(options.keys)), (fernet) => {
      const endpointUrl = options.endpointUrl.replace(/\/+$/, "")
      // A token opens the same way every time: a subscription pushed to again is not decrypted
      // again. Refused tokens are not kept (made-up ones cannot push out the real ones).
      const opened = (version: EndpointVersion) =>
        memoize(TOKENS_REMEMBERED, (token) => parseEndpointToken(fernet, version, token), Result.isSuccess)
      const openToken = { v1: opened("v1"), v2: opened("v2") }
      const openEndpoint = (version: EndpointVersion, token: string) => openToken[version](token)
      const messageIdAt = (nowMs: number, data: MessageIdData) => makeMessageId(fernet, Math.floor(nowMs / 1000), data)
      // Encrypting draws a random IV and stamps the Clock's time: the makers are effects (never failing but on a bug).
      const nowSeconds = Effect.map(Clock.currentTimeMillis, (ms) => Math.floor(ms / 1000))
      return EndpointCrypto.of({
        makeEndpoint: (uaid, channelId, rawKey) =>
          Effect.map(nowSeconds, (now) => makeEndpointUrl(fernet, now, endpointUrl, uaid, channelId, rawKey)),
        parseEndpoint: (version, token) => Effect.fromResult(openEndpoint(version, token)),
        openEndpoint,
        makeMessageId: (data) => Effect.map(Clock.currentTimeMillis, (ms) => messageIdAt(ms, data)),
        messageIdAt,
        parseMessageId: (id) => Effect.fromResult(parseMessageId(fernet, id))
      })
    })

  static readonly layer = (options: EndpointCryptoOptions): Layer.Layer<EndpointCrypto, CryptoKeyConfigError> =>
    Layer.effect(EndpointCrypto, Effect.fromResult(EndpointCrypto.make(options)))

  static readonly layerTest: Layer.Layer<EndpointCrypto> = Layer.succeed(
    EndpointCrypto,
    Result.getOrThrow(EndpointCrypto.make({ keys: Redacted.make([TEST_CRYPTO_KEY]), endpointUrl: TEST_ENDPOINT_URL }))
  )
}
