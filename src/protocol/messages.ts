/**
 * The WebSocket push protocol's frames, as autopush-rs and Firefox exchange them: client frames are decoded
 * at the edge into `ClientMessage` (with Schema, but the ack: see `decodeAck`), or into a `FrameError`
 * naming why the frame is invalid; server frames are built by the `*Reply` functions in the key
 * order autopush emits.
 */
import * as Exit from "effect/Exit"
import * as Schema from "effect/Schema"
import type { Notification } from "../domain/notification.ts"
import { opaqueId } from "../observability/opaque.ts"

const Code = Schema.optionalKey(Schema.Number)
const Broadcasts = Schema.Record(Schema.String, Schema.String)

const Hello = Schema.Struct({
  uaid: Schema.optionalKey(Schema.NullOr(Schema.String)),
  channelIDs: Schema.optionalKey(Schema.Array(Schema.String)),
  broadcasts: Schema.optionalKey(Broadcasts),
  use_webpush: Schema.optionalKey(Schema.Boolean)
})
const Register = Schema.Struct({ channelID: Schema.String, key: Schema.optionalKey(Schema.NullOr(Schema.String)) })
const Unregister = Schema.Struct({ channelID: Schema.String, code: Code })

/** One acked message of an ack frame. */
interface AckUpdate {
  readonly channelID: string
  readonly version: string
  readonly code?: number
}

const isObject = (value: unknown): value is Readonly<Record<string, unknown>> =>
  typeof value === "object" && value !== null && !Array.isArray(value)

/**
 * The ack's body, `{ updates: [{ channelID, version, code? }] }`, checked by hand: a client sends one
 * for every message it gets, so it is the one frame of the push path. Decoded as a Schema struct
 * would decode it: the known keys kept (other keys dropped), anything else not an ack.
 */
const decodeAck = (value: Readonly<Record<string, unknown>>): { readonly updates: ReadonlyArray<AckUpdate> } | undefined => {
  const updates = value["updates"]
  if (!Array.isArray(updates)) return undefined
  const decoded: Array<AckUpdate> = []
  for (const update of updates as ReadonlyArray<unknown>) {
    if (!isObject(update)) return undefined
    const { channelID, version, code } = update
    if (typeof channelID !== "string" || typeof version !== "string") return undefined
    if (code === undefined) decoded.push({ channelID, version })
    else if (typeof code === "number") decoded.push({ channelID, version, code })
    else return undefined
  }
  return { updates: decoded }
}
const Nack = Schema.Struct({ version: Schema.String, code: Code })
const BroadcastSubscribe = Schema.Struct({ broadcasts: Broadcasts })
/** RFC 8030 §5.3: the lowest urgency the client wants now (checked by the session: a bad one is answered 400). */
const Urgency = Schema.Struct({ min: Schema.String })

/** A body decoded with `schema`: its value, or undefined when the frame does not fit. */
const bySchema = <A>(schema: Schema.Codec<A, unknown>) => {
  const decode = Schema.decodeUnknownExit(schema)
  return (value: Readonly<Record<string, unknown>>): A | undefined => {
    const decoded = decode(value)
    return Exit.isSuccess(decoded) ? decoded.value : undefined
  }
}

const bodies = {
  hello: bySchema(Hello),
  register: bySchema(Register),
  unregister: bySchema(Unregister),
  ack: decodeAck,
  nack: bySchema(Nack),
  broadcast_subscribe: bySchema(BroadcastSubscribe),
  urgency: bySchema(Urgency)
} as const

type Bodies = typeof bodies
type BodyOf<K extends keyof Bodies> = Exclude<ReturnType<Bodies[K]>, undefined>

export type ClientMessage =
  | { readonly messageType: "ping" }
  | { readonly [K in keyof Bodies]: { readonly messageType: K } & BodyOf<K> }[keyof Bodies]


/** Why a text frame is not a client message; the session closes with 1011 "Json" for all of them. */
interface FrameError {
  readonly _tag: "FrameError"
  readonly reason: "not-json" | "not-object" | "unknown-type" | "bad-fields"
  readonly detail: string
}

const frameError = (reason: FrameError["reason"], detail: string): FrameError => ({ _tag: "FrameError", reason, detail })

const PING: ClientMessage = { messageType: "ping" }

/** Decode one text frame. `{}` and `{"messageType":"ping"}` are pings (the empty object first, as autopush-rs does). */
export const decodeClientFrame = (text: string): ClientMessage | FrameError => {
  let value: unknown
  try {
    value = JSON.parse(text)
  } catch {
    return frameError("not-json", "frame is not JSON")
  }
  if (!isObject(value)) return frameError("not-object", "frame is not a JSON object")
  const type = value["messageType"]
  if (type === undefined) {
    return Object.keys(value).length === 0 ? PING : frameError("unknown-type", "missing messageType")
  }
  if (type === "ping") return PING
  if (typeof type !== "string" || !Object.hasOwn(bodies, type)) {
    return frameError("unknown-type", `unknown messageType ${JSON.stringify(type).slice(0, 40)}`)
  }
  const decoded: object | undefined = bodies[type as keyof Bodies](value)
  return decoded !== undefined
    ? ({ ...decoded, messageType: type } as ClientMessage)
    : frameError("bad-fields", `invalid ${type} message`)
}

export const isFrameError = (m: ClientMessage | FrameError): m is FrameError => "_tag" in m

// ── server → client ────────────────────────────────────────────────────────────────────────────

export const helloReply = (uaid: string, broadcasts: Readonly<Record<string, unknown>> = {}): string =>
  JSON.stringify({ messageType: "hello", uaid, status: 200, use_webpush: true, broadcasts })

/** A broadcast update: changed versions, and `errors` for ids the server does not have. */
export const broadcastFrame = (broadcasts: Readonly<Record<string, unknown>>): string =>
  JSON.stringify({ messageType: "broadcast", broadcasts })

export const registerReply = (channelID: string, status: number, pushEndpoint: string): string =>
  JSON.stringify({ messageType: "register", channelID, status, pushEndpoint })

export const unregisterReply = (channelID: string, status: number): string =>
  JSON.stringify({ messageType: "unregister", channelID, status })

export const urgencyReply = (status: number): string => JSON.stringify({ messageType: "urgency", status })

export const PING_REPLY = "{}"

/** The notification frame: internal fields (ttl, topic, timestamps) never reach the client. */
export const notificationFrame = (n: Notification): string =>
  JSON.stringify(
    n.data === undefined
      ? { messageType: "notification", channelID: n.channelId, version: n.version }
      : { messageType: "notification", channelID: n.channelId, version: n.version, data: n.data, headers: n.headers ?? {} }
  )

/**
 * A frame as logs may show it: uaids and message ids replaced by their opaque ids, payloads, keys,
 * encryption headers and push endpoints left out (they are secrets or carry them).
 */
export const describeFrame = (frame: Readonly<Record<string, unknown>>): Record<string, unknown> => {
  const out: Record<string, unknown> = {}
  for (const [key, value] of Object.entries(frame)) {
    switch (key) {
      case "uaid":
      case "version":
        out[key] = typeof value === "string" ? opaqueId(value) : value
        break
      case "data":
        out[key] = typeof value === "string" ? `[${value.length} chars]` : value
        break
      case "pushEndpoint":
      case "key":
      case "headers":
        out[key] = value === "" || value === undefined ? value : "[omitted]"
        break
      case "updates":
        out[key] = Array.isArray(value)
          ? value.map((u: Readonly<Record<string, unknown>>) => describeFrame(u))
          : value
        break
      default:
        out[key] = value
    }
  }
  return out
}
