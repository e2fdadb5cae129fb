/**
 * Every request header the Web Push API reads, parsed in one place:
 * `TTL`, `Topic`, the encryption headers (`Content-Encoding`, `Encryption`, `Crypto-Key`,
 * `Encryption-Key`, and the `Content-Type` of an HPKE message) and the scheme/parameters of
 * `Authorization`. Each check is a small function whose `Result` is the parsed value or the error of
 * its row in the validation table (plain values: they run on every push, with no Effect to evaluate).
 */
import * as Result from "effect/Result"
import { EncryptionHeaderTooLarge, InvalidCryptoHeaders, InvalidTopic, InvalidUrgency, MissingTtl, NegativeTtl } from "../domain/errors.ts"
import { URGENCIES, type Urgency } from "../domain/notification.ts"

/** Request headers as the HTTP server hands them over: lower-case names. */
export type RequestHeaders = Readonly<Record<string, string | undefined>>

/** The URL-safe base64 alphabet with optional trailing padding (Topic, salt, dh). */
export const B64URL = /^[0-9A-Za-z\-_]+=*$/

// ── `k=v;k=v,k=v` parameter lists ────────────────────────────────────────────────────────────────

export type HeaderParams = ReadonlyArray<readonly [key: string, value: string]>

/** A space or a double quote: what `trimValue` takes off either end. */
const isSpaceOrQuote = (code: number): boolean => code === 0x20 || code === 0x22

/**
 * `value` without its leading and trailing spaces and quotes, in one pass (no regular expression: a
 * pattern anchored at the end backtracks on a long run of spaces, quadratic in the header's length).
 */
const trimValue = (value: string): string => {
  let start = 0
  let end = value.length
  while (start < end && isSpaceOrQuote(value.charCodeAt(start))) start++
  while (end > start && isSpaceOrQuote(value.charCodeAt(end - 1))) end--
  return value.slice(start, end)
}

/**
 * `,`-separated sections of `;`-separated `key=value` items (Crypto-Key, Encryption); keys trimmed,
 * values trimmed of spaces and quotes. Undefined when an item has no `=`.
 */
export const parseParams = (header: string): HeaderParams | undefined => {
  const params: Array<readonly [string, string]> = []
  for (const section of header.split(",")) {
    for (const item of section.split(";")) {
      const eq = item.indexOf("=")
      if (eq < 0) return undefined
      params.push([item.slice(0, eq).trim(), trimValue(item.slice(eq + 1))])
    }
  }
  return params
}

/** Value of the first item named `key`. */
export const paramValue = (params: HeaderParams, key: string): string | undefined => {
  for (const [k, v] of params) if (k === key) return v
  return undefined
}

/** Whether `code` is a character of the URL-safe base64 alphabet (without `=`). */
const isBase64UrlCode = (code: number): boolean =>
  (code >= 0x30 && code <= 0x39) || (code >= 0x41 && code <= 0x5a) || (code >= 0x61 && code <= 0x7a) || code === 0x2d || code === 0x5f

/**
 * Stored/forwarded form of Encryption and Crypto-Key: quotes removed, and each run of `=` that
 * follows a base64url character and ends at `,`, `;` or the end (a value's padding) removed. One
 * pass over the header: a regular expression for the same backtracks on a long run of base64url
 * characters, quadratic in the header's length (seconds for one HTTP/2 header).
 */
export const stripHeaderValue = (value: string): string => {
  const text = value.replaceAll("\"", "")
  let out = ""
  let kept = 0
  for (let i = 0; i < text.length; i++) {
    if (text.charCodeAt(i) !== 0x3d) continue
    let end = i + 1
    while (end < text.length && text.charCodeAt(end) === 0x3d) end++
    const next = end === text.length ? 0x2c : text.charCodeAt(end)
    if (i > 0 && isBase64UrlCode(text.charCodeAt(i - 1)) && (next === 0x2c || next === 0x3b)) {
      out += text.slice(kept, i)
      kept = end
    }
    i = end - 1
  }
  return kept === 0 ? text : out + text.slice(kept)
}

// ── TTL and Topic ────────────────────────────────────────────────────────────────────────────────

const I64_MIN = -(2n ** 63n)
const I64_MAX = 2n ** 63n - 1n
const INTEGER = /^[+-]?\d+$/
/** Digits alone, few enough to be exact as a Number (and far within 64 bits): every sender's TTL. */
const PLAIN_TTL = /^\d{1,15}$/

/**
 * Effective TTL: the header must be a 64-bit integer (400/111), not negative (400/114); values above
 * `maxTtl` are capped.
 */
export const ttlOf = (headers: RequestHeaders, maxTtl: number): Result.Result<number, MissingTtl | NegativeTtl> => {
  const raw = headers["ttl"]
  if (raw !== undefined && PLAIN_TTL.test(raw)) return Result.succeed(Math.min(Number(raw), maxTtl))
  if (raw === undefined || !INTEGER.test(raw)) return Result.fail(new MissingTtl())
  // Leading zeros say nothing, and more than 19 digits after them are beyond 64 bits: only the
  // digits that count are converted (a BigInt of a whole header's digits costs tens of ms).
  const signed = raw[0] === "-" || raw[0] === "+" ? 1 : 0
  let first = signed
  while (first < raw.length - 1 && raw.charCodeAt(first) === 0x30) first++
  if (raw.length - first > 19) return Result.fail(new MissingTtl())
  const ttl = BigInt(raw[0] === "-" ? `-${raw.slice(first)}` : raw.slice(first))
  if (ttl < I64_MIN || ttl > I64_MAX) return Result.fail(new MissingTtl())
  if (ttl < 0n) return Result.fail(new NegativeTtl())
  return Result.succeed(ttl > BigInt(maxTtl) ? maxTtl : Number(ttl))
}

export const MAX_TOPIC_LENGTH = 32

/** Topic: at most 32 characters of the URL-safe base64 alphabet (400/113); absent → undefined. */
export const topicOf = (headers: RequestHeaders): Result.Result<string | undefined, InvalidTopic> => {
  const topic = headers["topic"]
  if (topic === undefined) return Result.succeed(undefined)
  if (topic.length > MAX_TOPIC_LENGTH) {
    return Result.fail(new InvalidTopic({ message: "Topic must be no greater than 32 characters" }))
  }
  if (!B64URL.test(topic)) {
    return Result.fail(new InvalidTopic({ message: "Topic must be URL and Filename safe Base64 alphabet" }))
  }
  return Result.succeed(topic)
}

// ── encryption headers ───────────────────────────────────────────────────────────────────────────

/** RFC 8030 §5.3 `Urgency` (case-insensitive, surrounding spaces ignored); anything else is 400/115. */
export const urgencyOf = (headers: RequestHeaders): Result.Result<Urgency | undefined, InvalidUrgency> => {
  const raw = headers["urgency"]
  if (raw === undefined) return Result.succeed(undefined)
  const value = raw.trim().toLowerCase()
  return (URGENCIES as ReadonlyArray<string>).includes(value)
    ? Result.succeed(value as Urgency)
    : Result.fail(new InvalidUrgency())
}

/** Encryption headers as stored and forwarded to the client: keys lower-case with `_` (`content_type` for HPKE). */
export type EncryptionHeaders = Readonly<Record<string, string>>

const invalid = (message: string) => new InvalidCryptoHeaders({ message })

/** The named item must be present and URL-safe base64 (`aesgcm` salt / dh). */
const requireItem = (name: string, header: string | undefined, key: string): InvalidCryptoHeaders | undefined => {
  if (header === undefined) return invalid(`Missing ${name} header`)
  const params = parseParams(header)
  if (params === undefined) return invalid(`Invalid ${name} header`)
  const value = paramValue(params, key)
  if (value === undefined) return invalid(`Missing ${key} value in ${name} header`)
  if (!B64URL.test(value)) return invalid(`Invalid ${key} value in ${name} header`)
  return undefined
}

/** The named item must be absent (`aes128gcm` keeps salt and dh in the body). */
const forbidItem = (name: string, header: string | undefined, key: string): InvalidCryptoHeaders | undefined => {
  if (header === undefined) return undefined
  const params = parseParams(header)
  if (params === undefined) return invalid(`Invalid ${name} header`)
  return paramValue(params, key) === undefined ? undefined : invalid(`Do not include '${key}' header in ${name} header`)
}

const encodingRules: Readonly<Record<string, (h: EncryptionHeaders) => InvalidCryptoHeaders | undefined>> = {
  aesgcm: (h) =>
    requireItem("Encryption", h["encryption"], "salt") ??
      (h["encryption_key"] !== undefined
        ? invalid("Encryption-Key header is not valid for webpush draft 02 or later")
        : undefined) ??
      (h["crypto_key"] !== undefined ? requireItem("Crypto-Key", h["crypto_key"], "dh") : undefined),
  aes128gcm: (h) =>
    forbidItem("aes128gcm Encryption", h["encryption"], "salt") ??
      forbidItem("aes128gcm Crypto-Key", h["crypto_key"], "dh")
}

/**
 * The longest `Encryption`, `Crypto-Key` or `Encryption-Key` a push may have, in characters (one per
 * byte for these ASCII headers). Real ones are under 200: an `aesgcm` `Crypto-Key` with `dh=` and the
 * VAPID draft's `p256ecdsa=` (two 87-character keys) is the longest. These headers are stored and
 * delivered with the message, so the bound keeps what one message stores near its body's size
 * rather than at the header list's (64 KiB over HTTP/2).
 */
export const MAX_ENCRYPTION_HEADER_LENGTH = 512

/** The request headers that are stored with a message, by their name on the wire. */
const STORED_HEADERS = [["encryption", "Encryption"], ["crypto-key", "Crypto-Key"], ["encryption-key", "Encryption-Key"]] as const

/** Each stored encryption header at most `MAX_ENCRYPTION_HEADER_LENGTH` (400/120), body or not. */
export const encryptionHeaderLengthsOf = (headers: RequestHeaders): Result.Result<void, EncryptionHeaderTooLarge> => {
  for (const [key, name] of STORED_HEADERS) {
    const value = headers[key]
    if (value !== undefined && value.length > MAX_ENCRYPTION_HEADER_LENGTH) {
      return Result.fail(new EncryptionHeaderTooLarge({ message: `The ${name} header must be at most ${MAX_ENCRYPTION_HEADER_LENGTH} bytes` }))
    }
  }
  return Result.succeed(undefined)
}

/**
 * The media type of a push encrypted with HPKE (`draft-thomson-webpush-hpke`): such a message has no
 * `Content-Encoding`, and this `Content-Type` is what tells it from a body sent without encryption.
 */
export const HPKE_CONTENT_TYPE = "application/webpush-message"

/** `Content-Type: application/webpush-message` (any case, parameters ignored) and no `Content-Encoding`. */
export const isHpkeMessage = (headers: RequestHeaders): boolean => {
  const type = headers["content-type"]
  if (type === undefined || headers["content-encoding"] !== undefined) return false
  const semicolon = type.indexOf(";")
  return (semicolon < 0 ? type : type.slice(0, semicolon)).trim().toLowerCase() === HPKE_CONTENT_TYPE
}

/** What an HPKE message is stored and delivered with: its content type, and no encoding. */
const HPKE_HEADERS: EncryptionHeaders = { content_type: HPKE_CONTENT_TYPE }

/**
 * Encryption headers of a notification with a body (400/110 when they do not fit its
 * `Content-Encoding`, compared case-sensitively; an HPKE message has none, only its content type);
 * an empty body ignores them all (undefined).
 */
export const encryptionOf = (
  headers: RequestHeaders,
  hasBody: boolean
): Result.Result<EncryptionHeaders | undefined, InvalidCryptoHeaders> => {
  if (!hasBody) return Result.succeed(undefined)
  const encoding = headers["content-encoding"]
  if (encoding === undefined) {
    return isHpkeMessage(headers) ? Result.succeed(HPKE_HEADERS) : Result.fail(invalid("Missing Content-Encoding header"))
  }
  const rule = Object.hasOwn(encodingRules, encoding) ? encodingRules[encoding] : undefined
  if (rule === undefined) return Result.fail(invalid("Unknown Content-Encoding header"))
  const found: Record<string, string> = { encoding }
  const encryption = headers["encryption"]
  const cryptoKey = headers["crypto-key"]
  const encryptionKey = headers["encryption-key"]
  if (encryption !== undefined) found["encryption"] = stripHeaderValue(encryption)
  if (cryptoKey !== undefined) found["crypto_key"] = stripHeaderValue(cryptoKey)
  if (encryptionKey !== undefined) found["encryption_key"] = encryptionKey
  const error = rule(found)
  return error === undefined ? Result.succeed(found) : Result.fail(error)
}

// ── Authorization ────────────────────────────────────────────────────────────────────────────────

/** `Authorization: <scheme> <data>`: scheme lower-cased, data with every space removed. */
export const splitAuthorization = (header: string): { readonly scheme: string; readonly data: string | undefined } => {
  const space = header.indexOf(" ")
  return space < 0
    ? { scheme: header.toLowerCase(), data: undefined }
    : { scheme: header.slice(0, space).toLowerCase(), data: header.slice(space + 1).replaceAll(" ", "") }
}

/** `t=…,k=…` of the RFC 8292 `vapid` scheme: split on `,`, then on the first `=`. */
export const vapidParams = (data: string): ReadonlyMap<string, string> => {
  const params = new Map<string, string>()
  for (const item of data.split(",")) {
    const eq = item.indexOf("=")
    if (eq >= 0 && !params.has(item.slice(0, eq))) params.set(item.slice(0, eq), item.slice(eq + 1))
  }
  return params
}
