/**
 * Why the server answers a client's register, unregister or urgency command with an error status
 * instead of doing it, as one kind each; `refuse` is the one mapping to the reply the client gets
 * (autopush-rs's statuses), as `close.ts` is for closes. The table is keyed by every kind, so a new
 * kind without a status does not typecheck. A refusal at a limit is also a domain event
 * (`channel.refused.1`), so that metrics count it; the socket stays open in every case.
 */
import type { Out } from "./out.ts"
import { registerReply, unregisterReply, urgencyReply } from "./messages.ts"

type RefusalKind =
  | "invalid-channel-id" // not a canonical UUID
  | "invalid-key" // a register's key that is not a VAPID public key
  | "vapid-required" // a register without a key on a server that accepts only VAPID-signed pushes (`require_vapid`)
  | "too-many-channels" // max_channels_per_user
  | "not-written" // storage failed, or the record was not written (a newer connection has the uaid): retry later
  | "busy" // too many commands already wait while the user's messages move to this month's table
  | "invalid-urgency" // not one of very-low / low / normal / high

interface Reply {
  readonly status: number
  /** What a refused register's `pushEndpoint` says (autopush-rs's text for a bad key; else empty). */
  readonly pushEndpoint?: string
  /** The limit it counts as (`channel.refused.1`), when it is one. */
  readonly limit?: "too_many_channels" | "busy"
}

const replies: { readonly [K in RefusalKind]: Reply } = {
  "invalid-channel-id": { status: 401 },
  "invalid-key": { status: 400, pushEndpoint: "Failed to generate endpoint" },
  // A status of its own, so that a UnifiedPush distributor can map it to VAPID_REQUIRED.
  "vapid-required": { status: 403, pushEndpoint: "VAPID key required" },
  "too-many-channels": { status: 413, limit: "too_many_channels" },
  "not-written": { status: 500 },
  busy: { status: 503, limit: "busy" },
  "invalid-urgency": { status: 400 }
}

/** The command refused: its type, and for a register or unregister its channel id as the client sent it. */
type Refused =
  | { readonly messageType: "register" | "unregister"; readonly channelID: string }
  | { readonly messageType: "urgency" }

/** Answer `command` of `uaid`'s session with the status of `kind` (counted when it is a limit). */
export const refuse = (out: Out, uaid: string, command: Refused, kind: RefusalKind): void => {
  const { status, pushEndpoint = "", limit } = replies[kind]
  if (command.messageType === "urgency") return out.frame(urgencyReply(status))
  if (limit !== undefined) out.event("channel.refused.1", uaid, { channelId: command.channelID, command: command.messageType, reason: limit })
  out.frame(command.messageType === "register" ? registerReply(command.channelID, status, pushEndpoint) : unregisterReply(command.channelID, status))
}
