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
  /**
   * When the endpoint accepted it (ms): the sort key of a timestamp message (orders them in storage);
   * for a topic message, what tells which of two messages of a topic is the newer. Absent on rows
   * written by older versions (then `timestamp * 1000`).
   */
  readonly sortkeyTimestamp?: number | undefined
  /** RFC 8030 §5.3 `Urgency`, when the sender gave one (bridges map it to the platform's priority). */
  readonly urgency?: Urgency | undefined
  /** Body as base64url without padding; absent for an empty POST. */
  readonly data?: string | undefined
  /** Encryption headers, keys lower-case with `_` (`encoding`, `encryption`, `crypto_key`, `encryption_key`). */
  readonly headers?: Readonly<Record<string, string>> | undefined
  /**
   * The W3C trace context of the endpoint's routing span, on a direct delivery (the router-port hop
   * carries it as a `traceparent` header): the connection node's spans of the message are its children.
   * Never stored.
   */
  readonly traceparent?: string | undefined
}

export const URGENCIES = ["very-low", "low", "normal", "high"] as const
export type Urgency = (typeof URGENCIES)[number]

/** Milliseconds a message sorts by (timestamp messages) or was accepted at (both). */
export const sortkeyMs = (n: Notification): number => n.sortkeyTimestamp ?? n.timestamp * 1000

export const topicSortKey = (channelId: string, topic: string): string => `01:${channelId}:${topic}`

/**
 * `02:{ms}:{chid}` with `ms` zero-padded to 13 digits so keys sort numerically; for every instant from
 * 2001 to 2286 that is exactly the seed's unpadded key, so tables written by autopush stay readable.
 */
export const timestampSortKey = (ms: number, channelId: string): string =>
  `02:${String(ms).padStart(13, "0")}:${channelId}`

/** The storage sort key (`chidmessageid`) of a message. */
export const chidMessageId = (n: Notification): string =>
  n.topic !== undefined ? topicSortKey(n.channelId, n.topic) : timestampSortKey(sortkeyMs(n), n.channelId)

/** Seconds since the epoch at which the message stops being deliverable. */
export const expiresAt = (n: Notification): number => n.timestamp + n.ttl

/** A message is expired once `now >= timestamp + ttl` (protocol-notes §1.8). */
export const isExpired = (n: Notification, nowSeconds: number): boolean => nowSeconds >= expiresAt(n)
