/**
 * A push message as the service keeps it: what the endpoint accepted, what storage holds and what
 * the connection node hands to the client (minus the internal fields: `notificationFrame` in
 * `protocol/messages.ts` writes what the client sees).
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
  /** The receipt subscription the sender asked receipts on (`Push-Receipt`); never sent to the client. */
  readonly receipt?: string | undefined
  /** Body as base64url without padding; absent for an empty POST. */
  readonly data?: string | undefined
  /**
   * Encryption headers, keys lower-case with `_` (`encoding`, `encryption`, `crypto_key`,
   * `encryption_key`); an HPKE message has no `encoding`, only `content_type`.
   */
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

/** Whether a message may go to a client whose minimum urgency is `min` (a message without one is `normal`, RFC 8030 §5.3). */
export const urgentEnough = (n: { readonly urgency?: Urgency | undefined }, min: Urgency | undefined): boolean =>
  min === undefined || URGENCIES.indexOf(n.urgency ?? "normal") >= URGENCIES.indexOf(min)

/** Milliseconds a message sorts by (timestamp messages) or was accepted at (both). */
export const sortkeyMs = (n: Notification): number => n.sortkeyTimestamp ?? n.timestamp * 1000

/**
 * Which stored message: a channel's message of a topic (one per topic), or a channel's message accepted
 * at a ms. What a message id encrypts, and how storage is told which message to delete.
 */
export type MessageKey =
  | { readonly kind: "topic"; readonly channelId: string; readonly topic: string }
  | { readonly kind: "timestamp"; readonly channelId: string; readonly sortkeyTimestamp: number }

export const messageKeyOf = (n: Notification): MessageKey =>
  n.topic !== undefined
    ? { kind: "topic", channelId: n.channelId, topic: n.topic }
    : { kind: "timestamp", channelId: n.channelId, sortkeyTimestamp: sortkeyMs(n) }

/** Seconds since the epoch at which the message stops being deliverable. */
export const expiresAt = (n: Notification): number => n.timestamp + n.ttl

/** A message is expired once `now >= timestamp + ttl` (seconds; the second it reaches its TTL). */
export const isExpired = (n: Notification, nowSeconds: number): boolean => nowSeconds >= expiresAt(n)
