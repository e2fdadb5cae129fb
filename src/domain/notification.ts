/**
 * A push message as the service keeps it: what the endpoint accepted, what storage holds and what
 * the connection node hands to the client (minus the internal fields, see `toClientFrame` later).
 */

export interface Notification {
  /** Hyphenated lowercase channel id. */
  readonly channelId: string
  /** The message id (Fernet token): the WS `version` and the `Location` suffix. */
  readonly version: string
  /** Effective TTL in seconds (already capped). */
  readonly ttl: number
  /** Topic (URL-safe base64 alphabet, ≤ 32 chars); a topic message replaces the previous one. */
  readonly topic?: string | undefined
  /** When the endpoint accepted it, in seconds since the epoch. */
  readonly timestamp: number
  /** Milliseconds sort key for non-topic messages (orders them in storage). */
  readonly sortkeyTimestamp?: number | undefined
  /** Body as base64url without padding; absent for an empty POST. */
  readonly data?: string | undefined
  /** Encryption headers, keys lower-case with `_` (`encoding`, `encryption`, `crypto_key`, `encryption_key`). */
  readonly headers?: Readonly<Record<string, string>> | undefined
}

/** Storage sort key: `01:{chid}:{topic}` for topic messages, `02:{sortkey ms}:{chid}` otherwise. */
export const chidMessageId = (n: Notification): string =>
  n.topic !== undefined
    ? `01:${n.channelId}:${n.topic}`
    : `02:${n.sortkeyTimestamp ?? n.timestamp * 1000}:${n.channelId}`

/** Seconds since the epoch at which the message stops being deliverable. */
export const expiresAt = (n: Notification): number => n.timestamp + n.ttl

/** A message is expired once `now >= timestamp + ttl` (protocol-notes §1.8). */
export const isExpired = (n: Notification, nowSeconds: number): boolean => nowSeconds >= expiresAt(n)
