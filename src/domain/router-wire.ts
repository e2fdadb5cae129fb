/**
 * The notification as it travels from an endpoint node to a connection node (`PUT /push/{uaid}` on
 * the router port, protocol-notes §4). Both ends use this one codec.
 */
import * as Exit from "effect/Exit"
import * as Schema from "effect/Schema"
import type { Notification } from "./notification.ts"

const TransportNotification = Schema.Struct({
  channelID: Schema.String,
  version: Schema.String,
  ttl: Schema.Number,
  topic: Schema.optionalKey(Schema.NullOr(Schema.String)),
  timestamp: Schema.Number,
  sortkey_timestamp: Schema.optionalKey(Schema.NullOr(Schema.Number)),
  data: Schema.optionalKey(Schema.NullOr(Schema.String)),
  headers: Schema.optionalKey(Schema.NullOr(Schema.Record(Schema.String, Schema.String)))
})

const decode = Schema.decodeUnknownExit(TransportNotification)

export const encodeTransportNotification = (n: Notification): string =>
  JSON.stringify({
    channelID: n.channelId,
    version: n.version,
    ttl: n.ttl,
    topic: n.topic ?? null,
    timestamp: n.timestamp,
    ...(n.sortkeyTimestamp === undefined ? {} : { sortkey_timestamp: n.sortkeyTimestamp }),
    ...(n.data === undefined ? {} : { data: n.data, headers: n.headers ?? {} })
  })

/** The notification in a router-port body, or undefined when the body is not one. */
export const decodeTransportNotification = (body: string): Notification | undefined => {
  let json: unknown
  try {
    json = JSON.parse(body)
  } catch {
    return undefined
  }
  const result = decode(json)
  if (Exit.isFailure(result)) return undefined
  const t = result.value
  return {
    channelId: t.channelID,
    version: t.version,
    ttl: t.ttl,
    topic: t.topic ?? undefined,
    timestamp: t.timestamp,
    sortkeyTimestamp: t.sortkey_timestamp ?? undefined,
    data: t.data ?? undefined,
    headers: t.data == null ? undefined : t.headers ?? {}
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
