/**
 * The Matrix Push Gateway API v1 request, and what is pushed for it, as pure functions:
 *
 * - `parseNotify`: the body of `POST /_matrix/push/v1/notify` (`{"notification": {…, "devices":
 *   [{"app_id", "pushkey", …}]}}`, in the full or the `event_id_only` format) checked and split into
 *   the notification and its devices;
 * - `messageOf`: the message each device gets, `{"notification": {…}}` without `devices` (the form
 *   UnifiedPush's Matrix gateways send and Element's UnifiedPush parser reads), shrunk to fit: first
 *   `content` goes, then the other optional fields one by one; `event_id`, `room_id`, `counts` and
 *   `prio` always stay;
 * - `urgencyOf`: the message's Web Push urgency (RFC 8030 §5.3) from the notification's `prio`;
 * - `pushEndpointOf`: a pushkey that has the form of one of this service's push endpoint URLs, as
 *   the version segment and token of its path (parsed, never fetched).
 */
import type { Urgency } from "../domain/notification.ts"

/** Where homeservers send notifications (the pusher's `url`), and UnifiedPush looks for a gateway. */
export const NOTIFY_PATH = "/_matrix/push/v1/notify"

/** Largest notify request body read (bytes); above, 413 M_TOO_LARGE. */
export const MAX_NOTIFY_BYTES = 64 * 1024

/** Largest message made for a device (bytes): what a push may carry (`max_data_bytes` may say less). */
export const MAX_MESSAGE_BYTES = 4096

/** The Matrix priority of a notification: `high` unless the homeserver says `low` (the spec's default). */
export type Prio = "high" | "low"

export interface Device {
  readonly appId: string
  readonly pushkey: string
}

/** A notify request, checked. */
export interface Notify {
  /** The notification's fields but `devices`, in the order the homeserver sent them. */
  readonly notification: Readonly<Record<string, unknown>>
  readonly devices: ReadonlyArray<Device>
  /** Absent on a notification that only updates counts (a badge). */
  readonly eventId: string | undefined
  readonly prio: Prio
}

/** Why a body is not a notify request: not JSON at all, JSON of another shape, or more than the gateway takes. */
export interface NotifyRefusal {
  readonly status: 400 | 413
  readonly errcode: "M_NOT_JSON" | "M_BAD_JSON" | "M_TOO_LARGE"
  readonly error: string
}

const isObject = (value: unknown): value is Readonly<Record<string, unknown>> =>
  typeof value === "object" && value !== null && !Array.isArray(value)

const refuse = (error: string): NotifyRefusal => ({ status: 400, errcode: "M_BAD_JSON", error })

/** Optional fields that must be strings when present. */
const STRING_FIELDS = ["event_id", "room_id", "type", "sender", "sender_display_name", "room_name", "room_alias", "prio"] as const

/**
 * Devices one notify request may name; a request naming more is answered 413 `M_TOO_LARGE` and
 * nothing of it is pushed. Homeservers send one device per request (Synapse) or the devices of one
 * user on one gateway (Dendrite): a few. Pushing the first ones and leaving the rest out would tell
 * the homeserver they were delivered (the answer lists only rejected pushkeys), and listing the
 * rest as `rejected` would make it delete their pushers for good; an error for the whole request
 * is retried with backoff and drops nothing.
 */
export const MAX_DEVICES = 64

/**
 * Nesting of objects and arrays a notify body may have; deeper is answered 400 `M_BAD_JSON`. A
 * notification nests a few levels; far deeper values could not be written out again (the message
 * is made from them) without running out of stack.
 */
export const MAX_NESTING = 100

/** Whether JSON `text` nests `{` and `[` (outside strings) deeper than `limit`: one pass, stopping there. */
const nestingOver = (text: string, limit: number): boolean => {
  let depth = 0
  let inString = false
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i)
    if (inString) {
      if (c === 0x5c) i++ // a backslash: the next character is escaped
      else if (c === 0x22) inString = false
    } else if (c === 0x22) {
      inString = true
    } else if (c === 0x7b || c === 0x5b) {
      if (++depth > limit) return true
    } else if (c === 0x7d || c === 0x5d) {
      depth--
    }
  }
  return false
}

/**
 * The notify request in `body`, or why it is not one. Only what the gateway uses is checked:
 * `notification` an object with a `devices` list (at most `MAX_DEVICES`) of `{app_id, pushkey}`
 * (strings), the optional string fields strings, `counts` and `content` objects, no deeper than
 * `MAX_NESTING`. A `prio` other than `low` is `high`. Work linear in the body's size.
 */
export const parseNotify = (body: Buffer): Notify | NotifyRefusal => {
  const text = body.toString("utf8")
  let json: unknown
  try {
    json = JSON.parse(text)
  } catch {
    return { status: 400, errcode: "M_NOT_JSON", error: "The body is not JSON" }
  }
  if (nestingOver(text, MAX_NESTING)) return refuse(`The body nests objects and lists deeper than ${MAX_NESTING} levels`)
  if (!isObject(json) || !isObject(json["notification"])) return refuse("The body must be an object with a notification object")
  const { devices, ...notification } = json["notification"]
  if (!Array.isArray(devices)) return refuse("notification.devices must be a list")
  if (devices.length > MAX_DEVICES) {
    return { status: 413, errcode: "M_TOO_LARGE", error: `A notification may name at most ${MAX_DEVICES} devices, not ${devices.length}` }
  }
  const checked: Array<Device> = []
  for (const device of devices as ReadonlyArray<unknown>) {
    if (!isObject(device) || typeof device["app_id"] !== "string" || typeof device["pushkey"] !== "string") {
      return refuse("Each device must be an object with app_id and pushkey strings")
    }
    checked.push({ appId: device["app_id"], pushkey: device["pushkey"] })
  }
  for (const field of STRING_FIELDS) {
    if (notification[field] !== undefined && typeof notification[field] !== "string") return refuse(`notification.${field} must be a string`)
  }
  for (const field of ["counts", "content"] as const) {
    if (notification[field] !== undefined && !isObject(notification[field])) return refuse(`notification.${field} must be an object`)
  }
  return {
    notification,
    devices: checked,
    eventId: notification["event_id"] as string | undefined,
    prio: notification["prio"] === "low" ? "low" : "high"
  }
}

export const isRefusal = (parsed: Notify | NotifyRefusal): parsed is NotifyRefusal => "errcode" in parsed

/** Fields that always stay in the message. */
const KEPT: ReadonlySet<string> = new Set(["event_id", "room_id", "counts", "prio"])

/** The spec's optional fields, in the order they go after `content` and any field the spec does not name. */
const DROPPED_LAST = ["room_alias", "room_name", "sender_display_name", "sender", "type", "user_is_target"] as const

const OPEN = "{\"notification\":{"
const CLOSE = "}}"

/**
 * The message of `notify` (the same for each device): `{"notification": {…}}` without `devices`,
 * with `prio` as the gateway took it. Over `maxBytes`, `content` goes first, then the fields the
 * spec does not name (in the notification's key order), then `room_alias`, `room_name`,
 * `sender_display_name`, `sender`, `type` and `user_is_target`, one at a time, until it fits;
 * undefined when even `event_id`, `room_id`, `counts` and `prio` alone do not.
 *
 * In one pass: each field is written out once (`"key":value`) and its size taken; the fields to
 * drop are found by subtracting sizes, and the message is the written fields that stay, joined. The
 * result is byte for byte what writing out the whole notification again after each field dropped
 * would give (the fields keep their order, and a field's text does not depend on its neighbours),
 * at a cost linear in the notification's size however many fields it has. The order of dropping is
 * kept as it was, on purpose: what a client needs least goes first (the message body it may fetch
 * from the homeserver, then fields it does not know, then display names before ids), and a message
 * that fits is left whole.
 */
export const messageOf = (notify: Notify, maxBytes: number): Buffer | undefined => {
  const fields: Record<string, unknown> = { ...notify.notification, prio: notify.prio }
  const keys = Object.keys(fields)
  const written = new Map<string, string>()
  const sizes = new Map<string, number>()
  // The fields joined by commas, in the braces: one comma fewer than fields (`prio` is always there).
  let total = Buffer.byteLength(OPEN) + Buffer.byteLength(CLOSE) + keys.length - 1
  for (const key of keys) {
    const text = `${JSON.stringify(key)}:${JSON.stringify(fields[key])}`
    const size = Buffer.byteLength(text, "utf8")
    written.set(key, text)
    sizes.set(key, size)
    total += size
  }
  const dropped = new Set<string>()
  if (total > maxBytes) {
    const known: ReadonlySet<string> = new Set([...KEPT, "content", ...DROPPED_LAST])
    const order = ["content", ...keys.filter((key) => !known.has(key)), ...DROPPED_LAST]
    for (const key of order) {
      if (total <= maxBytes) break
      const size = sizes.get(key)
      if (size === undefined) continue
      dropped.add(key)
      total -= size + 1 // the field and its comma
    }
    if (total > maxBytes) return undefined
  }
  const kept: Array<string> = []
  for (const [key, text] of written) if (!dropped.has(key)) kept.push(text)
  return Buffer.from(`${OPEN}${kept.join(",")}${CLOSE}`, "utf8")
}

/**
 * `low` → `low`: the homeserver says it need not wake the device, so a client that asked for
 * `normal` or more urgent (to save its battery) gets it later. `high` → `high`: Matrix homeservers
 * mark high what should wake the device now (a message that rings or mentions the user, an
 * encrypted one that might); Matrix push gateways send it at the platforms' high priority, as this
 * service's bridges do for `Urgency: high` (FCM `HIGH`, APNs 10), and a client on a low battery that
 * only takes `high` still gets it.
 */
export const urgencyOf = (prio: Prio): Urgency => (prio === "low" ? "low" : "high")

/** The push route's segment: a push endpoint's path ends in it and the token (and its version). */
const PUSH_ROUTE = "/wpush/"

/** What follows the last `/wpush/` of a push endpoint's path: `{v1|v2}/{token}` or `{token}`. */
const PUSH_TAIL = /^(?:(v1|v2)\/)?([A-Za-z0-9_=-]+)$/

/** A pushkey read as a push endpoint: the version segment and token of its path, or why it is not one. */
export type PushEndpoint =
  | { readonly _tag: "PushEndpoint"; readonly version: "v1" | "v2" | undefined; readonly token: string }
  | { readonly _tag: "NotPushEndpoint"; readonly reason: string }

/**
 * The version segment and token of a `pushkey` that is a push endpoint URL of this service's form:
 * an `http:` or `https:` URL whose path (dot segments resolved) ends in `/wpush/{v1|v2}/{token}` or
 * `/wpush/{token}`. Its scheme, host, port, path before `/wpush/`, credentials, query and fragment
 * are not looked at: the endpoint node answers on more origins than `endpoint_url` (a TLS proxy in
 * front, `127.0.0.1` for `localhost`, another name), and whether a token is ours is told by the
 * token itself, which only opens with this service's key (the caller opens it). Parsed once, never
 * fetched: a pushkey naming another host makes no request to it. Work linear in its length.
 */
export const pushEndpointOf = (pushkey: string): PushEndpoint => {
  const url = URL.parse(pushkey)
  if (url === null || (url.protocol !== "https:" && url.protocol !== "http:")) return { _tag: "NotPushEndpoint", reason: "not an http(s) URL" }
  const path = url.pathname
  const at = path.lastIndexOf(PUSH_ROUTE)
  const tail = at < 0 ? null : PUSH_TAIL.exec(path.slice(at + PUSH_ROUTE.length))
  if (tail === null) return { _tag: "NotPushEndpoint", reason: "its path is not a push endpoint's (/wpush/v1/{token})" }
  return { _tag: "PushEndpoint", version: tail[1] as "v1" | "v2" | undefined, token: tail[2] as string }
}
