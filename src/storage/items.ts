/**
 * Rows as DynamoDB items (attribute-value maps): how the DynamoDB backend stores router records and
 * message rows (`model.ts`: the fields every backend stores), and the export format — every
 * backend's `TableCopy` reads and writes these items, so an export file moves between backends.
 */
import type { AttributeValue } from "@aws-sdk/client-dynamodb"
import * as Predicate from "effect/Predicate"
import type { Notification } from "../domain/notification.ts"
import type { UserRecord } from "../domain/user.ts"
import { CANCELLED, messageFields, messageFromFields, plainData, userFields, userFromFields } from "./model.ts"
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

export const messageToItem = (uaid: string, n: Notification): Item => {
  const item: Item = { uaid: S(uaid) }
  for (const [name, value] of Object.entries(messageFields(n))) {
    if (value !== undefined) item[name] = marshal(value)
  }
  return item
}

export const messageFromItem = (item: Item): Notification | undefined =>
  messageFromFields({
    chidmessageid: item.chidmessageid?.S,
    updateid: item.updateid?.S,
    ttl: num(item.ttl),
    timestamp: num(item.timestamp),
    sortkey_timestamp: num(item.sortkey_timestamp),
    urgency: item.urgency?.S,
    receipt: item.receipt?.S,
    data: item.data?.S,
    headers: item.headers?.M === undefined ? undefined : unmarshal({ M: item.headers.M }) as Record<string, string>,
    cancelled: num(item[CANCELLED])
  })

