/**
 * VAPID (RFC 8292, and the draft-01 `WebPush`/`Bearer` form) as the endpoint checks it
 * (rules #3 and #4 of `acceptPush.ts`): `parseVapid` reads `Authorization` (+ `Crypto-Key`), `verifyVapid` checks
 * the key, the ES256 signature (with `jose`) and the `exp`/`aud` claims. Every failure is 401/109,
 * except a draft-01 scheme without its `Crypto-Key: p256ecdsa=` key, which is 400/110.
 *
 * `senderWarnings`: what in an accepted push another push service would refuse (Apple's answers 403
 * `BadJwtToken` to some JWTs Mozilla's and Google's accept), told to the sender in `Autopush-Warning`.
 */
import { createPublicKey, type KeyObject } from "node:crypto"
import * as Effect from "effect/Effect"
import * as Result from "effect/Result"
import { compactVerify } from "jose/jws/compact/verify"
import { decodeVapidPublicKey } from "../crypto/endpoint.ts"
import { InvalidAuth, InvalidCryptoHeaders } from "../domain/errors.ts"
import { paramValue, parseParams, type RequestHeaders, splitAuthorization, vapidParams } from "./headers.ts"

export interface VapidCredentials {
  /** `vapid` (RFC 8292), or `webpush` / `bearer` (draft-01, key in `Crypto-Key`). */
  readonly scheme: "vapid" | "webpush" | "bearer"
  /** The JWT. */
  readonly token: string
  /** The public key as sent (base64url or standard base64, padding tolerated). */
  readonly publicKey: string
}

export interface VerifiedVapid {
  /** Raw uncompressed P-256 point (65 bytes): what a v2 endpoint is bound to. */
  readonly rawKey: Buffer
  readonly claims: { readonly exp: number; readonly aud: string; readonly sub?: unknown; readonly iat?: unknown }
  readonly scheme: VapidCredentials["scheme"]
}

const auth = (message: string) => new InvalidAuth({ message })
const cryptoHeader = (message: string) => new InvalidCryptoHeaders({ message })

export const CLAIMS_MESSAGE =
  "Invalid VAPID token: A value in the vapid claims is either missing or incorrectly specified " +
  "(e.g. \"exp\":\"12345\" or \"sub\":null). Please correct and retry."

/** The draft-01 key: `Crypto-Key: p256ecdsa=<key>` (400/110 when missing or unparsable). */
const draftKey = (cryptoKey: string | undefined): Result.Result<string, InvalidCryptoHeaders> => {
  if (cryptoKey === undefined) return Result.fail(cryptoHeader("Missing Crypto-Key header"))
  const params = parseParams(cryptoKey)
  if (params === undefined) return Result.fail(cryptoHeader("Invalid Crypto-Key header"))
  const key = paramValue(params, "p256ecdsa")
  return key === undefined ? Result.fail(cryptoHeader("Missing p256ecdsa in Crypto-Key header")) : Result.succeed(key)
}

/** Rule #3: the credentials named by `Authorization`, or undefined when there is none. */
export const parseVapid = (
  headers: RequestHeaders
): Result.Result<VapidCredentials | undefined, InvalidAuth | InvalidCryptoHeaders> => {
  const header = headers["authorization"]
  if (header === undefined) return Result.succeed(undefined)
  const { scheme, data } = splitAuthorization(header)
  if (data === undefined || data === "") return Result.fail(auth("Missing VAPID token"))
  switch (scheme) {
    case "vapid": {
      const params = vapidParams(data)
      const publicKey = params.get("k")
      const token = params.get("t")
      if (publicKey === undefined) return Result.fail(auth("Missing VAPID public key"))
      if (token === undefined) return Result.fail(auth("Missing VAPID token"))
      return Result.succeed({ scheme, token, publicKey })
    }
    case "webpush":
    case "bearer":
      return Result.map(draftKey(headers["crypto-key"]), (publicKey) => ({ scheme, token: data, publicKey }))
    default:
      return Result.fail(auth("Unknown auth scheme"))
  }
}

/** A P-256 public key object for a raw uncompressed point, or undefined when it is not on the curve. */
const publicKeyOf = (raw: Buffer): KeyObject | undefined => {
  try {
    return createPublicKey({
      key: {
        kty: "EC",
        crv: "P-256",
        x: raw.subarray(1, 33).toString("base64url"),
        y: raw.subarray(33).toString("base64url")
      },
      format: "jwk"
    })
  } catch {
    return undefined
  }
}

const signatureError = (cause: unknown): InvalidAuth => {
  const code = (cause as { readonly code?: unknown } | null)?.code
  if (code === "ERR_JOSE_ALG_NOT_ALLOWED") return auth("Invalid VAPID token: the algorithm must be ES256")
  if (code === "ERR_JWS_SIGNATURE_VERIFICATION_FAILED") return auth("Invalid VAPID token: bad signature")
  return auth("Invalid VAPID token")
}

/** Clock skew tolerated on `exp`, as jsonwebtoken's default leeway. */
export const EXP_LEEWAY_SECONDS = 60
/** The furthest in the future `exp` may be. */
export const MAX_EXP_AHEAD_SECONDS = 86_400

const claimsOf = (payload: Uint8Array): VerifiedVapid["claims"] | undefined => {
  let claims: unknown
  try {
    claims = JSON.parse(Buffer.from(payload).toString("utf8"))
  } catch {
    return undefined
  }
  if (typeof claims !== "object" || claims === null || Array.isArray(claims)) return undefined
  const { exp, aud, sub, iat } = claims as Record<string, unknown>
  return Number.isSafeInteger(exp) && (exp as number) >= 0 && typeof aud === "string"
    ? { exp: exp as number, aud, sub, iat }
    : undefined
}

/**
 * `aud` is the endpoint's origin exactly as RFC 8292 / RFC 6454 serialise it: lower-case scheme and
 * host, the port only when not the scheme's default, no path (not even `/`). `origin` is that form.
 */
const sameOrigin = (aud: string, origin: string): boolean => aud === origin

/**
 * Rule #4: the key decodes to a P-256 point, the JWT is ES256 and signed by it, `exp` is a number
 * not in the past (60 s leeway) nor more than 24 h ahead, and `aud` is the endpoint origin.
 */
export const verifyVapid = Effect.fnUntraced(function*(
  credentials: VapidCredentials,
  origin: string,
  nowSeconds: number
): Effect.fn.Return<VerifiedVapid, InvalidAuth> {
  const rawKey = decodeVapidPublicKey(credentials.publicKey)
  const key = rawKey === undefined ? undefined : publicKeyOf(rawKey)
  if (rawKey === undefined || key === undefined) return yield* auth("Invalid VAPID public key")
  const { payload } = yield* Effect.tryPromise({
    try: () => compactVerify(credentials.token, key, { algorithms: ["ES256"] }),
    catch: signatureError
  })
  const claims = claimsOf(payload)
  if (claims === undefined) return yield* auth(CLAIMS_MESSAGE)
  if (claims.exp < nowSeconds - EXP_LEEWAY_SECONDS) return yield* auth("The VAPID token has expired")
  if (claims.exp > nowSeconds + MAX_EXP_AHEAD_SECONDS) return yield* auth("The VAPID token expiration is too long")
  if (!sameOrigin(claims.aud, origin)) return yield* auth("Invalid VAPID audience")
  return { rawKey, claims, scheme: credentials.scheme }
})

// ── what other push services refuse ─────────────────────────────────────────────────────────────

/**
 * What in a push this server accepts another push service refuses (the sender's library works
 * against one service and fails against another, in silence):
 * - `vapid-sub-local`: `sub` is a `mailto:` (or `https:`) at `localhost`, a `.local` or an `.invalid`
 *   domain — Apple's service answers 403 BadJwtToken;
 * - `vapid-sub-missing`: no `sub`, or one neither `mailto:` nor `https:` (RFC 8292's contact) —
 *   Apple's refuses a `sub` that is not a `mailto:` or a URL;
 * - `vapid-long-lived`: the JWT is valid for more than 24 h from its `iat` — past RFC 8292's bound;
 *   Apple's refuses an `exp` more than a day ahead (as this server does, 401/109, for one more than
 *   24 h ahead of now);
 * - `vapid-draft-scheme`: `Authorization: WebPush` (or `Bearer`) with `Crypto-Key: p256ecdsa=` —
 *   the VAPID draft; Apple's accepts only `vapid t=…, k=…` (RFC 8292);
 * - `aesgcm`: the draft encryption `Content-Encoding: aesgcm` (with `Crypto-Key: dh=`); Apple's
 *   accepts only `aes128gcm` (RFC 8291).
 */
export type SenderWarning = "vapid-sub-local" | "vapid-sub-missing" | "vapid-long-lived" | "vapid-draft-scheme" | "aesgcm"

/** What each warning tells the sender (no double quote, no comma: one quoted item of the header each). */
export const SENDER_WARNING_TEXT: { readonly [K in SenderWarning]: string } = {
  "vapid-sub-local": "VAPID sub is a contact at localhost or a .local or .invalid domain: Apple's push service refuses the JWT (403 BadJwtToken); use a real mailto: or https: contact",
  "vapid-sub-missing": "VAPID JWT has no sub or one that is not a mailto: or https: contact (RFC 8292): Apple's push service refuses a sub that is not a mailto: or URL (403 BadJwtToken)",
  "vapid-long-lived": "VAPID JWT is valid for more than 24 h (exp - iat): RFC 8292 allows at most 24 h and Apple's push service refuses an exp more than a day ahead (403 BadJwtToken); sign with exp at most 24 h after iat",
  "vapid-draft-scheme": "Authorization: WebPush with Crypto-Key p256ecdsa is the VAPID draft: Apple's push service accepts only Authorization: vapid t=... k=... (RFC 8292)",
  aesgcm: "Content-Encoding: aesgcm is the draft encryption: Apple's push service accepts only aes128gcm (RFC 8291)"
}

/** The response header that carries them: `Autopush-Warning: kind "text", kind "text"`. */
export const SENDER_WARNING_HEADER = "autopush-warning"

const NO_WARNINGS: ReadonlyArray<SenderWarning> = []

/** Domains no push service can reach a person at (RFC 6761 / RFC 6762 names); `domain` in lower case. */
const unreachableDomain = (domain: string): boolean => {
  const d = domain.endsWith(".") ? domain.slice(0, -1) : domain
  return d === "localhost" || d.endsWith(".localhost") || d === "local" || d.endsWith(".local") || d === "invalid" || d.endsWith(".invalid")
}

/**
 * `sub`'s domain in lower case: a `mailto:` address's (after its last `@`, before any `?`), an
 * `https:` URL's host (after any user info, before any port or path); undefined for neither. Index
 * arithmetic rather than a URL parser: this runs on every signed push.
 */
const subDomain = (sub: string): string | undefined => {
  if (sub.startsWith("mailto:")) {
    const query = sub.indexOf("?")
    const end = query < 0 ? sub.length : query
    const at = sub.lastIndexOf("@", end - 1)
    return at < 7 ? "" : sub.slice(at + 1, end).toLowerCase()
  }
  if (sub.startsWith("https://")) {
    let end = sub.length
    for (const stop of ["/", "?", "#"]) {
      const i = sub.indexOf(stop, 8)
      if (i >= 0 && i < end) end = i
    }
    const at = sub.lastIndexOf("@", end - 1)
    const host = sub.slice(at < 8 ? 8 : at + 1, end)
    const port = host.startsWith("[") ? -1 : host.lastIndexOf(":")
    return (port < 0 ? host : host.slice(0, port)).toLowerCase()
  }
  return undefined
}

/** The `sub` claim's warning, if any. */
const subWarning = (sub: unknown): SenderWarning | undefined => {
  if (typeof sub !== "string") return "vapid-sub-missing"
  const domain = subDomain(sub)
  if (domain === undefined) return "vapid-sub-missing"
  return domain === "" || unreachableDomain(domain) ? "vapid-sub-local" : undefined
}

/**
 * The warnings of an accepted push: from its verified VAPID claims (undefined: unsigned) and its
 * `Content-Encoding`. Plain string checks on what the push's rules already parsed (the push path
 * runs it on every push): no allocation when there is nothing to say.
 */
export const senderWarnings = (vapid: VerifiedVapid | undefined, encoding: string | undefined): ReadonlyArray<SenderWarning> => {
  let found: Array<SenderWarning> | undefined
  if (vapid !== undefined) {
    const sub = subWarning(vapid.claims.sub)
    if (sub !== undefined) found = [sub]
    const iat = vapid.claims.iat
    if (typeof iat === "number" && vapid.claims.exp - iat > MAX_EXP_AHEAD_SECONDS) (found ??= []).push("vapid-long-lived")
    if (vapid.scheme !== "vapid") (found ??= []).push("vapid-draft-scheme")
  }
  if (encoding === "aesgcm") (found ??= []).push("aesgcm")
  return found ?? NO_WARNINGS
}

/** The `Autopush-Warning` value of `warnings` (none: undefined, no header). */
export const senderWarningHeader = (warnings: ReadonlyArray<SenderWarning>): string | undefined =>
  warnings.length === 0 ? undefined : warnings.map((w) => `${w} "${SENDER_WARNING_TEXT[w]}"`).join(", ")
