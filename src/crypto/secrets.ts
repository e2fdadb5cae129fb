/**
 * Constant-time comparison and the bridge registration secret, as autopush computes it:
 * `secret = hex(HMAC-SHA256(key = auth_key's UTF-8 bytes, msg = uaid in simple hex))`; the first
 * auth key issues, any key verifies, so auth keys rotate like crypto keys.
 */
import { createHash, createHmac, timingSafeEqual } from "node:crypto"
import { parseUuidHex } from "../domain/ids.ts"

const digest = (value: string | Uint8Array, encoding: "utf8" | "utf16le"): Buffer =>
  typeof value === "string"
    ? createHash("sha256").update(value, encoding).digest()
    : createHash("sha256").update(value).digest()

/**
 * Equality whose time does not depend on where the inputs differ, nor on their lengths:
 * `timingSafeEqual` needs equal lengths and would leak the length by throwing, so both sides are
 * hashed to 32 bytes first. Two strings compare exactly (as UTF-16 code units, where UTF-8 would
 * turn every lone surrogate into U+FFFD); a string against bytes compares its UTF-8 encoding.
 */
export const constantTimeEqual = (a: string | Uint8Array, b: string | Uint8Array): boolean => {
  const encoding = typeof a === "string" && typeof b === "string" ? "utf16le" : "utf8"
  return timingSafeEqual(digest(a, encoding), digest(b, encoding))
}

const sign = (authKey: string, uaidHex: string): string => createHmac("sha256", authKey).update(uaidHex).digest("hex")

/** The secret handed to a bridge client at registration; `uaid` in any UUID spelling. */
export const issueBridgeSecret = (authKeys: readonly [string, ...ReadonlyArray<string>], uaid: string): string => {
  const hex = parseUuidHex(uaid)
  // Our own uaid that is not a UUID is a bug, not bad input.
  if (hex === undefined) throw new TypeError("uaid is not a UUID")
  return sign(authKeys[0], hex)
}

/** Whether `presented` is the secret of `uaid` under any of the keys; false for a uaid that is not a UUID. */
export const verifyBridgeSecret = (authKeys: ReadonlyArray<string>, uaid: string, presented: string): boolean => {
  const hex = parseUuidHex(uaid)
  if (hex === undefined) return false
  let ok = false
  // No early exit: every key is tried, so timing does not tell which key (if any) matched.
  for (const key of authKeys) {
    if (constantTimeEqual(sign(key, hex), presented)) ok = true
  }
  return ok
}
