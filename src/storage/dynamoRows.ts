/**
 * The DynamoDB items of the seed's tables and the service's values: attribute values, router
 * records, message rows (what is written, and what a row reads back as).
 */
import type { AttributeValue } from "@aws-sdk/client-dynamodb"
import * as Predicate from "effect/Predicate"
import { type Notification, URGENCIES } from "../domain/notification.ts"
import type { UserRecord } from "../domain/user.ts"
import { expiryOf, isVisible, messageSortKey, parseSortKey, plainData, userFields, userFromFields } from "./model.ts"
import type { UserPatch } from "./Storage.ts"

export type Item = Record<string, AttributeValue>

// ── attribute values ─────────────────────────────────────────────────────────────────────────────

export const S = (value: string): AttributeValue => ({ S: value })
export const N = (value: number): AttributeValue => ({ N: String(value) })

const marshal = (value: unknown): AttributeValue => {
  if (value === null || value === undefined) return { NULL: true }
  if (Predicate.isString(value)) return S(value)
  if (Predicate.isNumber(value)) return N(value)
  if (Predicate.isBoolean(value)) return { BOOL: value }
  if (Array.isArray(value)) return { L: value.map(marshal) }
  if (Predicate.isObject(value)) {
    return { M: Object.fromEntries(Object.entries(value).map(([k, v]) => [k, marshal(v)])) }
  }
  return S(String(value))
}

const unmarshal = (value: AttributeValue): unknown => {
  if (value.S !== undefined) return value.S
  if (value.N !== undefined) return Number(value.N)
  if (value.BOOL !== undefined) return value.BOOL
  if (value.NULL !== undefined) return null
  if (value.L !== undefined) return value.L.map(unmarshal)
  if (value.M !== undefined) return Object.fromEntries(Object.entries(value.M).map(([k, v]) => [k, unmarshal(v)]))
  if (value.SS !== undefined) return value.SS
  if (value.NS !== undefined) return value.NS.map(Number)
  return undefined
}

export const num = (value: AttributeValue | undefined): number | undefined =>
  value?.N === undefined ? undefined : Number(value.N)

// ── router records ───────────────────────────────────────────────────────────────────────────────

export const userValue = (field: keyof UserPatch, value: unknown): AttributeValue =>
  marshal(field === "routerData" ? plainData(value as Record<string, unknown>) : value)

export const userToItem = (user: UserRecord): Item => {
  const item: Item = { uaid: S(user.uaid) }
  for (const [field, attribute] of userFields) {
    if (user[field] !== undefined) item[attribute] = userValue(field, user[field])
  }
  return item
}

export const userFromItem = (item: Item): UserRecord => {
  const fields: Record<string, unknown> = {}
  for (const [field, attribute] of userFields) {
    const value = item[attribute]
    if (value !== undefined) fields[field] = unmarshal(value)
  }
  return userFromFields(item.uaid?.S, fields)
}

// ── message rows ─────────────────────────────────────────────────────────────────────────────────

export const messageToItem = (uaid: string, n: Notification): Item => ({
  uaid: S(uaid),
  chidmessageid: S(messageSortKey(n)),
  updateid: S(n.version),
  ttl: N(n.ttl),
  timestamp: N(n.timestamp),
  expiry: N(expiryOf(n)),
  ...(n.topic !== undefined ? { topic: S(n.topic), ...(n.sortkeyTimestamp !== undefined ? { sortkey_timestamp: N(n.sortkeyTimestamp) } : {}) } : {}),
  ...(n.urgency !== undefined ? { urgency: S(n.urgency) } : {}),
  ...(n.receipt !== undefined ? { receipt: S(n.receipt) } : {}),
  ...(n.data !== undefined ? { data: S(n.data) } : {}),
  ...(n.headers !== undefined ? { headers: marshal(n.headers) } : {})
})

export const messageFromItem = (item: Item): Notification | undefined => {
  const key = parseSortKey(item.chidmessageid?.S ?? "")
  const version = item.updateid?.S
  if (key === undefined || version === undefined) return undefined
  const data = item.data?.S
  const headers = item.headers?.M
  const urgency = URGENCIES.find((u) => u === item.urgency?.S)
  const receipt = item.receipt?.S
  return {
    channelId: key.channelId,
    version,
    ttl: num(item.ttl) ?? 0,
    timestamp: num(item.timestamp) ?? 0,
    ...(key.topic !== undefined
      ? { topic: key.topic, ...(item.sortkey_timestamp?.N !== undefined ? { sortkeyTimestamp: Number(item.sortkey_timestamp.N) } : {}) }
      : { sortkeyTimestamp: key.sortkeyTimestamp }),
    ...(urgency !== undefined ? { urgency } : {}),
    ...(receipt !== undefined ? { receipt } : {}),
    ...(data !== undefined ? { data } : {}),
    ...(headers !== undefined ? { headers: unmarshal({ M: headers }) as Record<string, string> } : {})
  }
}

const rowVisible = (item: Item, nowMs: number): boolean =>
  isVisible(num(item.expiry) ?? (num(item.timestamp) ?? 0) + (num(item.ttl) ?? 0), nowMs)

export const visibleMessages = (items: ReadonlyArray<Item>, nowMs: number): Array<Notification> =>
  items.flatMap((item) => {
    const message = rowVisible(item, nowMs) ? messageFromItem(item) : undefined
    return message === undefined ? [] : [message]
  })

export const messageKey = (uaid: string, sortKey: string): Item => ({ uaid: S(uaid), chidmessageid: S(sortKey) })

export const chunks = <A>(items: ReadonlyArray<A>, size: number): Array<ReadonlyArray<A>> =>
  Array.from({ length: Math.ceil(items.length / size) }, (_, i) => items.slice(i * size, (i + 1) * size))
