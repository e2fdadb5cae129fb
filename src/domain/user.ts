import { randomInt } from "node:crypto"
import type { Urgency } from "./notification.ts"

/** The router record: one per uaid, naming the node a client is connected to and its message table. */

export interface UserRecord {
  /** 32 lowercase hex. */
  readonly uaid: string
  /** `webpush`, or a bridge type (`fcm`, `apns`, `adm`, ...). */
  readonly routerType: string
  /** Bridge-specific data (token, app id, ...); `{}` for webpush users. */
  readonly routerData: Readonly<Record<string, unknown>>
  /** Milliseconds since the epoch of the connection (or registration) that wrote this record. */
  readonly connectedAt: number
  /** Router URL of the connection node holding the client, when connected. */
  readonly nodeId?: string | undefined
  /** `YYYYMMHH` + 4-digit random spread, the `last_connect` index key. */
  readonly lastConnect?: number | undefined
  /** Name of the message table this user's channels and messages live in. */
  readonly currentMonth?: string | undefined
  /** Record layout version; below 1 means the user is reset once its storage is drained. */
  readonly recordVersion?: number | undefined
  /** The lowest urgency the client wants delivered (RFC 8030 §5.3); absent: every urgency. */
  readonly urgency?: Urgency | undefined
}

export const USER_RECORD_VERSION = 1

/** A `last_connect` value as autopush writes it: YYYYMMHH followed by a random 0000-0010 to spread hot keys. */
export const lastConnectValue = (nowMs: number, spread: number = randomInt(0, 11)): number => {
  const d = new Date(nowMs)
  const key = `${d.getUTCFullYear()}${String(d.getUTCMonth() + 1).padStart(2, "0")}${String(d.getUTCHours()).padStart(2, "0")}${String(spread).padStart(4, "0")}`
  return Number(key)
}

/**
 * Where messages written into `table` for a user belong, by its router record as read after the
 * write: a message lives in the table the record names when it is read, not the one it named when
 * the message was routed. The table they must follow the user to, or undefined when they stay (the
 * record still names `table`, or names none: the user is gone).
 */
export const tableMovedTo = (table: string, after: UserRecord | undefined): string | undefined =>
  after?.currentMonth !== undefined && after.currentMonth !== table ? after.currentMonth : undefined
