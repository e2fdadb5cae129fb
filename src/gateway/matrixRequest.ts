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
 * - `ownEndpointOf`: a pushkey that is one of this service's push endpoint URLs, as the version
 *   segment and token of its path (parsed, never fetched).
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

/** Why a body is not a notify request: not JSON at all, or JSON of another shape. */
export interface NotifyRefusal {
  readonly errcode: "M_NOT_JSON" | "M_BAD_JSON"
  readonly error: string
}

const isObject = (value: unknown): value is Readonly<Record<string, unknown>> =>
  typeof value === "object" && value !== null && !Array.isArray(value)

const refuse = (error: string): NotifyRefusal => ({ errcode: "M_BAD_JSON", error })

/** Optional fields that must be strings when present. */
const STRING_FIELDS = ["event_id", "room_id", "type", "sender", "sender_display_name", "room_name", "room_alias", "prio"] as const

/**
 * The notify request in `body`, or why it is not one. Only what the gateway uses is checked:
 * `notification` an object with a `devices` list of `{app_id, pushkey}` (strings), the optional
 * string fields strings, `counts` and `content` objects. A `prio` other than `low` is `high`.
 */
export const parseNotify = (body: Buffer): Notify | NotifyRefusal => {
  let json: unknown
  try {
    json = JSON.parse(body.toString("utf8"))
  } catch {
    return { errcode: "M_NOT_JSON", error: "The body is not JSON" }
  }
  if (!isObject(json) || !isObject(json["notification"])) return refuse("The body must be an object with a notification object")
  const { devices, ...notification } = json["notification"]
  if (!Array.isArray(devices)) return refuse("notification.devices must be a list")
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

/**
 * The message of `notify` (the same for each device): `{"notification": {…}}` without `devices`,
 * with `prio` as the gateway took it. Over `maxBytes`, `content` goes first, then the fields the
 * spec does not name, then `room_alias`, `room_name`, `sender_display_name`, `sender`, `type` and
 * `user_is_target`, one at a time, until it fits; undefined when even `event_id`, `room_id`,
 * `counts` and `prio` alone do not.
 */
export const messageOf = (notify: Notify, maxBytes: number): Buffer | undefined => {
  const fields: Record<string, unknown> = { ...notify.notification, prio: notify.prio }
  const known: ReadonlySet<string> = new Set([...KEPT, "content", ...DROPPED_LAST])
  const order = ["content", ...Object.keys(fields).filter((key) => !known.has(key)), ...DROPPED_LAST]
  for (let dropped = 0; ; dropped++) {
    const bytes = Buffer.from(JSON.stringify({ notification: fields }), "utf8")
    if (bytes.length <= maxBytes) return bytes
    // Only fields present are worth a try: skip to the next one there is.
    while (dropped < order.length && !Object.hasOwn(fields, order[dropped] as string)) dropped++
    if (dropped >= order.length) return undefined
    delete fields[order[dropped] as string]
  }
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

/** `/wpush/{token}` or `/wpush/{version}/{token}`, spelled plainly (as the push route takes it). */
const PUSH_PATH = /^\/wpush\/(?:([A-Za-z0-9]+)\/)?([A-Za-z0-9_=-]+)$/

/**
 * For the service at `endpointUrl` (parsed once), the version segment and token of a `pushkey` when
 * it is one of its push endpoint URLs: `{endpointUrl}/wpush/{v1|v2}/{token}` (or `/wpush/{token}`),
 * the same origin and path prefix as `endpointUrl`, no query, fragment or credentials; undefined for
 * anything else. The URL is only parsed: whether the token is ours is the push path's first check.
 */
export const ownEndpointOf = (endpointUrl: string) => {
  const base = new URL(endpointUrl)
  const prefix = base.pathname.replace(/\/+$/, "")
  return (pushkey: string): { readonly version: string | undefined; readonly token: string } | undefined => {
    if (!URL.canParse(pushkey)) return undefined
    const url = new URL(pushkey)
    if (url.origin !== base.origin || url.search !== "" || url.hash !== "" || url.username !== "" || url.password !== "") return undefined
    if (!url.pathname.startsWith(`${prefix}/wpush/`)) return undefined
    const path = PUSH_PATH.exec(url.pathname.slice(prefix.length))
    return path === null ? undefined : { version: path[1], token: path[2] as string }
  }
}
