/**
 * What reaches a connection and what a step asks for: the inputs (`MailboxInput`s from the socket
 * and the node, `CommandResult`s of the storage and crypto work a step asked for), the commands
 * (those retried when storage fails, `RetriedCommand`, are defined in `phases.ts`, beside the
 * `Retry` a session keeps), the fire-and-forget signals, and the `Transition` a step returns.
 */
import type { CloseKind } from "./close.ts"
import { type ClientMessage, decodeClientFrame, isFrameError } from "./messages.ts"
import type { Phase, RetriedCommand } from "./phases.ts"
import type { DomainEvent } from "../domain/events.ts"
import type { Notification, Urgency } from "../domain/notification.ts"
import type { UserRecord } from "../domain/user.ts"

/**
 * What a session's mailbox carries: the client's frames and the socket's news (from the socket), and
 * deliveries, storage checks, ticks and kicks (from the node). Command results do not go through
 * it: the session feeds each one back as the very next input.
 */
export type MailboxInput =
  /** `admitted`: a command that already passed the command budget (held and released). */
  | { readonly _tag: "Frame"; readonly message: ClientMessage; readonly admitted?: boolean }
  | { readonly _tag: "BadFrame"; readonly detail: string }
  | { readonly _tag: "BinaryFrame" }
  | { readonly _tag: "Pong" }
  | { readonly _tag: "SocketClosed" }
  | { readonly _tag: "Delivery"; readonly notification: Notification }
  | { readonly _tag: "CheckStorage" }
  | { readonly _tag: "Tick" }
  | { readonly _tag: "Kick"; readonly kind: CloseKind }

/** A text frame from the client as the session gets it: a message, or why it is not one. */
export const textFrame = (text: string): MailboxInput => {
  const message = decodeClientFrame(text)
  return isFrameError(message) ? { _tag: "BadFrame", detail: message.detail } : { _tag: "Frame", message }
}

/** A register in progress: the channel, and its endpoint once made. */
export interface Registering {
  readonly channelId: string
  readonly endpoint: string
}

/** Why a router record is written: to resume a claimed uaid, or at a new uaid's first register. */
type WritePurpose =
  /** `previous`: the record as read; the node it names is told to drop its stale session. */
  | { readonly _tag: "Resume"; readonly previous: UserRecord }
  | { readonly _tag: "Register"; readonly registering: Registering }

/** Storage and crypto work whose result is the next input. */
export type Command =
  | { readonly _tag: "MintUaid" }
  /**
   * Write the router record, unless a newer one exists: to resume a claimed uaid (only if its record
   * still exists: a user dropped meanwhile stays dropped), or at a new uaid's first register.
   */
  | { readonly _tag: "WriteUser"; readonly user: UserRecord; readonly purpose: WritePurpose }
  /** `rawKey`: the VAPID public key the endpoint is bound to (a v2 endpoint), decoded already. */
  | { readonly _tag: "MakeEndpoint"; readonly uaid: string; readonly channelId: string; readonly rawKey: Uint8Array | undefined }
  | { readonly _tag: "AddChannel"; readonly uaid: string; readonly table: string; readonly registering: Registering }
  | { readonly _tag: "RemoveChannel"; readonly uaid: string; readonly table: string; readonly channelId: string; readonly code: number | undefined }
  /** Keep the client's minimum urgency in its router record (for its next sessions, on any node). */
  | { readonly _tag: "WriteUrgency"; readonly uaid: string; readonly min: Urgency }
  | RetriedCommand

/** The result of a command: the next input. */
export type CommandResult =
  | { readonly _tag: "UaidMinted"; readonly uaid: string }
  | { readonly _tag: "UserRead"; readonly user: UserRecord | undefined }
  | { readonly _tag: "UserWritten"; readonly command: Extract<Command, { _tag: "WriteUser" }>; readonly written: boolean }
  /** `dropped` false: another session re-claimed the user first. */
  | { readonly _tag: "UserDropped"; readonly dropped: boolean }
  | { readonly _tag: "EndpointMade"; readonly command: Extract<Command, { _tag: "MakeEndpoint" }>; readonly endpoint: string }
  /** `added` false: the user has `maxChannels` channels already. */
  | { readonly _tag: "ChannelAdded"; readonly registering: Registering; readonly added: boolean }
  | { readonly _tag: "ChannelRemoved"; readonly command: Extract<Command, { _tag: "RemoveChannel" }> }
  | { readonly _tag: "UrgencyWritten"; readonly command: Extract<Command, { _tag: "WriteUrgency" }> }
  | {
    readonly _tag: "PageRead"
    readonly command: Extract<Command, { _tag: "ReadPage" }>
    readonly messages: ReadonlyArray<Notification>
    /** Sort key (ms) of the last row read, expired or not, when it is a timestamp row. */
    readonly lastSortKey: number | undefined
    /** Rows after this page may exist (it was full). */
    readonly more: boolean
  }
  | { readonly _tag: "AckedTombstoned" }
  | { readonly _tag: "MessageTaken"; readonly taken: boolean }
  | { readonly _tag: "ChannelsRead"; readonly channels: ReadonlySet<string> }
  | { readonly _tag: "ChannelsAdded" }
  | { readonly _tag: "RecordPointed" }
  /** The messages as stored (a timestamp one may have taken a later ms). */
  | { readonly _tag: "MessagesSaved"; readonly saved: ReadonlyArray<Notification> }
  | { readonly _tag: "NodeCleared" }
  | { readonly _tag: "CommandFailed"; readonly command: Command }

/** Every result tag, checked against the type both ways (a result missing here does not compile). */
const RESULT_TAGS: { readonly [K in CommandResult["_tag"]]: true } = {
  UaidMinted: true,
  UserRead: true,
  UserWritten: true,
  UserDropped: true,
  EndpointMade: true,
  ChannelAdded: true,
  ChannelRemoved: true,
  UrgencyWritten: true,
  PageRead: true,
  AckedTombstoned: true,
  MessageTaken: true,
  ChannelsRead: true,
  ChannelsAdded: true,
  RecordPointed: true,
  MessagesSaved: true,
  NodeCleared: true,
  CommandFailed: true
}

/** Whether an input kind is a command's result (one nobody asked for is a bug). */
export const isResultKind = (kind: string): boolean => Object.hasOwn(RESULT_TAGS, kind)

/** After a close: the mailbox is shut and its leftover deliveries were handed over. */
type Ended = { readonly _tag: "MailboxDrained" }

export type Input = MailboxInput | CommandResult | Ended

/** Input kinds: client frames by `messageType`, everything else by `_tag`. */
export type InputKind = ClientMessage["messageType"] | Exclude<Input["_tag"], "Frame">

export const inputKind = (input: Input): InputKind => (input._tag === "Frame" ? input.message.messageType : input._tag)

/** Fire-and-forget signals (to the socket, the node's registry, peers, or the session's own queue), run in order before the command. */
export type Signal =
  /** A WebSocket ping frame (keepalive). */
  | { readonly _tag: "Ping" }
  /** Become the uaid's live session on this node (the older one is kicked), taking messages from `minUrgency` up. */
  | { readonly _tag: "Claim"; readonly uaid: string; readonly connectedAt: number; readonly minUrgency: Urgency | undefined }
  /** Tell another node to check storage (the user reconnected there). */
  | { readonly _tag: "NotifyPeer"; readonly nodeId: string; readonly uaid: string }
  /** Tell another node to drop its stale session of this uaid. */
  | { readonly _tag: "DisconnectPeer"; readonly nodeId: string; readonly uaid: string; readonly connectedAt: number }
  /**
   * Feed these client messages again, before the mailbox: held commands the budget now admits
   * (`admitted`), or commands deferred by a month move (through the budget now).
   */
  | { readonly _tag: "Replay"; readonly messages: ReadonlyArray<ClientMessage>; readonly admitted: boolean }
  | { readonly _tag: "PauseReading" }
  | { readonly _tag: "ResumeReading" }

export interface Transition {
  readonly phase: Phase
  readonly frames: ReadonlyArray<string>
  readonly events: ReadonlyArray<DomainEvent>
  readonly signals: ReadonlyArray<Signal>
  /** At most one command per transition: its result is the next input. */
  readonly command: Command | undefined
  readonly close: CloseKind | undefined
}
