/**
 * The notification as it travels from an endpoint node to a connection node (`PUT /push/{uaid}` on
 * the router port). Both ends use this one codec.
 */
import { type Notification, type Urgency, URGENCIES } from "./notification.ts"

export const encodeTransportNotification = (n: Notification): string =>
  JSON.stringify({
    channelID: n.channelId,
    version: n.version,
    ttl: n.ttl,
    topic: n.topic ?? null,
    timestamp: n.timestamp,
    ...(n.sortkeyTimestamp === undefined ? {} : { sortkey_timestamp: n.sortkeyTimestamp }),
    ...(n.receipt === undefined ? {} : { receipt: n.receipt }),
    // The node takes a message only for a client whose minimum urgency it meets: it must know it.
    ...(n.urgency === undefined ? {} : { urgency: n.urgency }),
    ...(n.data === undefined ? {} : { data: n.data, headers: n.headers ?? {} })
  })

const isString = (value: unknown): value is string => typeof value === "string"
const isNumber = (value: unknown): value is number => typeof value === "number"
const absentOr = <A>(value: unknown, is: (value: unknown) => value is A): value is A | null | undefined =>
  value === undefined || value === null || is(value)
const isUrgency = (value: unknown): value is Urgency => (URGENCIES as ReadonlyArray<unknown>).includes(value)
const isHeaders = (value: unknown): value is Readonly<Record<string, string>> =>
  typeof value === "object" && value !== null && !Array.isArray(value) && Object.values(value).every(isString)

/**
 * The notification in a router-port body, or undefined when the body is not one: an object with
 * `channelID`, `version` (strings), `ttl`, `timestamp` (numbers), and optionally `topic`, `data`
 * (strings), `sortkey_timestamp` (a number), `headers` (strings by name), `receipt` (a string),
 * `urgency` (very-low, low, normal or high), each of those also null;
 * other keys are ignored. Checked by hand: this runs for every direct delivery.
 */
export const decodeTransportNotification = (body: string): Notification | undefined => {
  let json: unknown
  try {
    json = JSON.parse(body)
  } catch {
    return undefined
  }
  if (typeof json !== "object" || json === null || Array.isArray(json)) return undefined
  const t = json as Record<string, unknown>
  const { channelID, version, ttl, topic, timestamp, sortkey_timestamp, data, headers, receipt, urgency } = t
  if (
    !isString(channelID) || !isString(version) || !isNumber(ttl) || !isNumber(timestamp) ||
    !absentOr(topic, isString) || !absentOr(sortkey_timestamp, isNumber) || !absentOr(data, isString) ||
    !absentOr(headers, isHeaders) || !absentOr(receipt, isString) || !absentOr(urgency, isUrgency)
  ) return undefined
  return {
    channelId: channelID,
    version,
    ttl,
    topic: topic ?? undefined,
    timestamp,
    sortkeyTimestamp: sortkey_timestamp ?? undefined,
    ...(receipt == null ? {} : { receipt }),
    ...(urgency == null ? {} : { urgency }),
    data: data ?? undefined,
    headers: data == null ? undefined : headers ?? {}
  }
}

/**
 * Header of `PUT /push/{uaid}` with the `connected_at` of the router record the endpoint routed on:
 * the node takes the message only for the session connected then (a client that reconnected since
 * may have unregistered the channel in the session between). Nodes that do not know it ignore it.
 */
export const CONNECTED_AT_HEADER = "autopush-connected-at"

/** The header's value: a ms time, undefined when absent, "invalid" when not a whole number of ms. */
export const parseConnectedAt = (value: string | ReadonlyArray<string> | undefined): number | undefined | "invalid" =>
  value === undefined ? undefined : typeof value === "string" && /^\d{1,16}$/.test(value) ? Number(value) : "invalid"
