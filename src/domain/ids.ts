/**
 * UUID identifiers used on the wire and in storage.
 *
 * A uaid is kept in its "simple" form (32 lowercase hex digits): that is what the hello reply, the
 * router table key and message ids use. A channel id is kept hyphenated and lowercase: that is what
 * Firefox sends, what storage keys carry and what notification frames echo.
 */
import { randomUUID } from "node:crypto"

const HEX32 = /^[0-9a-f]{32}$/

/** Any common UUID spelling (simple, hyphenated, braced, `urn:uuid:`, any case) → 32 lowercase hex, or undefined. */
export const parseUuidHex = (input: string): string | undefined => {
  if (input.length > 64) return undefined
  let s = input.trim().toLowerCase()
  if (s.startsWith("urn:uuid:")) s = s.slice(9)
  if (s.startsWith("{") && s.endsWith("}")) s = s.slice(1, -1)
  if (s.length === 36) {
    if (s[8] !== "-" || s[13] !== "-" || s[18] !== "-" || s[23] !== "-") return undefined
    s = s.replaceAll("-", "")
  }
  return HEX32.test(s) ? s : undefined
}

export const hyphenate = (hex: string): string =>
  `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`

/** Uaid in simple form, or undefined when the input is not a UUID. */
export const parseUaid = parseUuidHex

/** Channel id in lowercase hyphenated form from any spelling, or undefined. */
export const parseChannelId = (input: string): string | undefined => {
  const hex = parseUuidHex(input)
  return hex === undefined ? undefined : hyphenate(hex)
}

/** Strict form the register command requires: already lowercase and hyphenated. */
export const isCanonicalChannelId = (input: string): boolean => parseChannelId(input) === input

export const newUaid = (): string => randomUUID().replaceAll("-", "")

