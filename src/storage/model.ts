/**
 * The message-table data model both layers share (autopush's DynamoDB tables, so its data reads as ours):
 * sort keys, key ranges, what a stored item reads back as, and when it is visible.
 *
 * Sort keys:
 * - `" "` — the per-user meta row (`channel_count`; the `chids` string set that held a user's
 *   channels before channel rows existed is still read and removed from, never written);
 * - `00:{chid}` — one row per registered channel (a register costs the same at the 1st and the
 *   10,000th channel, and no item grows towards DynamoDB's 400 KB item limit);
 * - `01:{chid}:{topic}` — topic messages (one per channel and topic, a new one replaces it);
 * - `02:{ms}:{chid}` — timestamp messages, `ms` = `sortkeyTimestamp ?? timestamp * 1000`.
 *
 * `ms` is written as 13 digits, zero-padded. Every instant from 2001-09-09 to 2286-11-20 already has
 * 13 digits, so for real data this is exactly autopush's unpadded key (tables written by autopush
 * stay readable); the padding only keeps string order equal to numeric order for small test times.
 * Negative or ≥ 10^13 values are outside the model.
 *
 * A cancelled or acked message leaves a tombstone (`cancelled` set, `CANCELLED`: gone for good): its row at the same key
 * with the same `updateid`, its data and headers removed. A save of that version finds it and
 * writes nothing (a save retried after its answer was lost, or a session's close saving a message
 * it held, must not bring a cancelled or acked message back), and no read returns it. On the SQL
 * stores the tombstone is a short-lived marker: its `expiry` is cut to `TOMBSTONE_SECONDS` after
 * the cancel or ack (or kept, if the message expires sooner), and it goes with it as any expired row.
 */
import { type MessageKey, messageKeyOf, type Notification, sortkeyMs, URGENCIES } from "../domain/notification.ts"
import type { UserRecord } from "../domain/user.ts"

export const META_SORT_KEY = " "

/** The router-table item holding the broadcast set (not 32 hex digits: never a uaid). */
export const BROADCASTS_KEY = "broadcasts"
/** Each broadcast is an attribute of that item: the prefix, then its id. */
export const BROADCAST_ATTRIBUTE_PREFIX = "b:"
export const CHANNEL_PREFIX = "00:"
/** Upper bound (exclusive) of the channel rows. */
export const CHANNEL_END = "00;"

/** The sort key of a channel's row. */
export const channelSortKey = (channelId: string): string => `${CHANNEL_PREFIX}${channelId}`
export const TOPIC_PREFIX = "01:"
/** Upper bound (exclusive) of the topic range: the character after `:` is `;`. */
export const TOPIC_END = "01;"
export const TIMESTAMP_PREFIX = "02:"
/** Upper bound (exclusive) of the timestamp range. */
export const TIMESTAMP_END = "02;"
const MS_DIGITS = 13

const formatMs = (ms: number): string => String(ms).padStart(MS_DIGITS, "0")

export const topicSortKey = (channelId: string, topic: string): string => `${TOPIC_PREFIX}${channelId}:${topic}`
export const timestampSortKey = (ms: number, channelId: string): string => `${TIMESTAMP_PREFIX}${formatMs(ms)}:${channelId}`

/** The sort key (`chidmessageid`) of a message row. */
export const sortKeyOf = (key: MessageKey): string =>
  key.kind === "topic" ? topicSortKey(key.channelId, key.topic) : timestampSortKey(key.sortkeyTimestamp, key.channelId)

export const messageSortKey = (n: Notification): string => sortKeyOf(messageKeyOf(n))

/**
 * Exclusive bounds around a topic row's sort key that hold no other key: a topic is of the URL-safe
 * base64 alphabet (and `=`), which sorts after `!` and before `~`, so the key with its last character
 * one lower and `~` after it is below the key and above every other, and the key with `!` after it
 * is above the key and below every key it begins.
 */
export const topicKeyBounds = (channelId: string, topic: string): readonly [lo: string, hi: string] => {
  const key = topicSortKey(channelId, topic)
  return [`${key.slice(0, -1)}${String.fromCharCode(key.charCodeAt(key.length - 1) - 1)}~`, `${key}!`]
}

/**
 * Exclusive lower bound of a timestamp page: every key of a later ms is greater, every key of
 * `after` itself is smaller (`z` sorts after any hex digit or `-`), as autopush's `02:{ts}:z`.
 */
export const timestampLowerBound = (after: number | undefined): string =>
  after === undefined ? TIMESTAMP_PREFIX : `${TIMESTAMP_PREFIX}${formatMs(after)}:z`

interface ParsedSortKey {
  readonly channelId: string
  readonly topic?: string
  readonly sortkeyTimestamp?: number
}

/** Channel, topic or ms of a message sort key; undefined for the meta row and legacy keys. */
export const parseSortKey = (key: string): ParsedSortKey | undefined => {
  const [version, middle, last, ...rest] = key.split(":")
  if (middle === undefined || last === undefined || rest.length > 0) return undefined
  if (version === "01") return { channelId: middle, topic: last }
  if (version === "02" && /^\d+$/.test(middle)) return { channelId: last, sortkeyTimestamp: Number(middle) }
  return undefined
}

/**
 * Whether stored message `n` is one of `channelId`'s that a new message of it would add to: any of
 * its messages but that of topic `replacing` (which the new message replaces).
 */
export const addsToChannel = (n: Notification, channelId: string, replacing: string | undefined): boolean =>
  n.channelId === channelId && (n.topic === undefined || n.topic !== replacing)

/** Ms of a timestamp sort key (the `lastSortKey` of a page). */
export const sortKeyMsOf = (key: string): number | undefined => parseSortKey(key)?.sortkeyTimestamp

/**
 * What saving a message did: stored; `taken` — a timestamp message's sort key holds another message
 * (nothing written: it belongs at a later ms); `superseded` — a topic already holds a newer message
 * (nothing written: the newer one replaced it); `cancelled` — the key holds this message's own
 * tombstone (nothing written: it was stored before and cancelled or acked since; it goes nowhere else).
 */
export type SaveOutcome = "stored" | "taken" | "superseded" | "cancelled"

/** The attribute (column) that marks a message row as a tombstone: 1 (absent or NULL on a live message). */
export const CANCELLED = "cancelled"

/** A timestamp message moved to the next ms, its sort key being taken (its id stays). */
export const nextFreeMs = (n: Notification): Notification => ({ ...n, sortkeyTimestamp: sortkeyMs(n) + 1 })

/**
 * How long a tombstone outlives its cancel or ack (seconds): longer than any save that may bring
 * the message back — one retried after a lost answer (within `storage_timeout`), and a closing
 * session's save of what it held unacked, retried for up to 5 minutes from its close (which comes
 * before an ack by the client's next session) plus one operation's `storage_timeout`.
 */
export const TOMBSTONE_SECONDS = 600

/** The DynamoDB TTL attribute (seconds): when the message stops being deliverable. */
export const expiryOf = (n: Notification): number => n.timestamp + n.ttl

/** Unix seconds of a Clock reading, as compared with `expiry`. */
const nowSeconds = (nowMs: number): number => Math.floor(nowMs / 1000)

/** Visible iff `expiry > now` (seconds), i.e. not `isExpired`; rows without `expiry` never expire. */
export const isVisible = (expiry: number | undefined, nowMs: number): boolean =>
  expiry === undefined || expiry > nowSeconds(nowMs)

/** `routerData` as it reads back: plain JSON (undefined members dropped). */
export const plainData = (data: Readonly<Record<string, unknown>>): Record<string, unknown> =>
  JSON.parse(JSON.stringify(data)) as Record<string, unknown>

/**
 * A message as it reads back from storage: channel/topic/sort ms come from the sort key (a timestamp
 * message always has a `sortkeyTimestamp`; a topic message keeps the one it was stored with, if any),
 * absent optional fields are absent rather than `undefined`.
 */
export const storedNotification = (n: Notification): Notification => {
  const base: Notification = {
    channelId: n.channelId,
    version: n.version,
    ttl: n.ttl,
    timestamp: n.timestamp,
    ...(n.urgency !== undefined ? { urgency: n.urgency } : {}),
    ...(n.receipt !== undefined ? { receipt: n.receipt } : {}),
    ...(n.data !== undefined ? { data: n.data } : {}),
    ...(n.headers !== undefined ? { headers: { ...n.headers } } : {})
  }
  if (n.topic === undefined) return { ...base, sortkeyTimestamp: sortkeyMs(n) }
  return n.sortkeyTimestamp === undefined ? { ...base, topic: n.topic } : { ...base, topic: n.topic, sortkeyTimestamp: n.sortkeyTimestamp }
}

/**
 * A message row's fields, by the name every backend stores them under (DynamoDB attributes, SQLite
 * columns); undefined: absent. `sortkey_timestamp` only for a topic message (a timestamp message's
 * ms is in its key); `topic` is in the key too, and kept as an attribute where the store has no
 * fixed columns.
 */
export interface MessageFields {
  readonly chidmessageid: string
  readonly updateid: string
  readonly ttl: number
  readonly timestamp: number
  readonly expiry: number
  readonly topic: string | undefined
  readonly sortkey_timestamp: number | undefined
  readonly urgency: string | undefined
  readonly receipt: string | undefined
  readonly data: string | undefined
  readonly headers: Readonly<Record<string, string>> | undefined
  /** Set on a tombstone only (`CANCELLED`). */
  readonly cancelled: number | undefined
}

/** The row fields a message is stored as. */
export const messageFields = (n: Notification): MessageFields => ({
  chidmessageid: messageSortKey(n),
  updateid: n.version,
  ttl: n.ttl,
  timestamp: n.timestamp,
  expiry: expiryOf(n),
  topic: n.topic,
  sortkey_timestamp: n.topic !== undefined ? n.sortkeyTimestamp : undefined,
  urgency: n.urgency,
  receipt: n.receipt,
  data: n.data,
  headers: n.headers,
  cancelled: undefined
})

/** A row's fields as a backend read them: any may be missing (rows that are not messages, rows of older versions). */
export type StoredMessageFields = { readonly [K in keyof MessageFields]?: MessageFields[K] | undefined }

/**
 * A message as it reads back from its row: channel, topic and ms from the sort key (a timestamp
 * message always has a `sortkeyTimestamp`; a topic message the one it was stored with, if any), an
 * urgency this service did not write left out; undefined for a row that is not a message, and
 * for a tombstone (no read returns a cancelled message).
 */
export const messageFromFields = (row: StoredMessageFields): Notification | undefined => {
  const key = parseSortKey(row.chidmessageid ?? "")
  if (key === undefined || row.updateid === undefined || row.cancelled !== undefined) return undefined
  const urgency = URGENCIES.find((u) => u === row.urgency)
  return {
    channelId: key.channelId,
    version: row.updateid,
    ttl: row.ttl ?? 0,
    timestamp: row.timestamp ?? 0,
    ...(key.topic !== undefined
      ? { topic: key.topic, ...(row.sortkey_timestamp !== undefined ? { sortkeyTimestamp: row.sortkey_timestamp } : {}) }
      : { sortkeyTimestamp: key.sortkeyTimestamp }),
    ...(urgency !== undefined ? { urgency } : {}),
    ...(row.receipt !== undefined ? { receipt: row.receipt } : {}),
    ...(row.data !== undefined ? { data: row.data } : {}),
    ...(row.headers !== undefined ? { headers: row.headers } : {})
  }
}

/** A router record as it reads back: fields that are `undefined` are absent. */
export const storedUser = (user: UserRecord): UserRecord => {
  const out: Record<string, unknown> = {}
  for (const [key, value] of Object.entries(user)) {
    if (value !== undefined) out[key] = key === "routerData" ? plainData(user.routerData) : value
  }
  return out as unknown as UserRecord
}

/**
 * The router record's fields and the names they are stored under (DynamoDB attributes, SQLite
 * columns); `uaid` is the key.
 */
const USER_ATTRIBUTES = {
  connectedAt: "connected_at",
  routerType: "router_type",
  routerData: "router_data",
  nodeId: "node_id",
  lastConnect: "last_connect",
  currentMonth: "current_month",
  recordVersion: "record_version",
  urgency: "urgency"
} as const satisfies Record<keyof Omit<UserRecord, "uaid">, string>

export const userFields = Object.entries(USER_ATTRIBUTES) as ReadonlyArray<[keyof Omit<UserRecord, "uaid">, string]>

/** A router record from its stored fields (those absent left out, defaults for the required ones). */
export const userFromFields = (uaid: string | undefined, stored: Readonly<Record<string, unknown>>): UserRecord => {
  const fields: Record<string, unknown> = { uaid, routerType: "webpush", routerData: {}, connectedAt: 0, ...stored }
  // A minimum urgency this service did not write is no minimum.
  if (!URGENCIES.some((u) => u === fields["urgency"])) delete fields["urgency"]
  return fields as unknown as UserRecord
}
