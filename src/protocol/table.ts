/**
 * The WebSocket push protocol as data: for every phase (`phases.ts`), the inputs it
 * takes (`inputs.ts`) and the handler that decides what each means — the next phase, the frames to
 * send, the domain events, the signals, at most one command to run and whether to close. `step` looks
 * the cell up and runs it; the session fiber (`session.ts`) only carries out what it returns, feeding
 * a command's result back as the next input before anything from the mailbox.
 *
 * An input a phase does not list is ignored, except command results, which can only answer a command
 * the phase issued (an unexpected one is a bug and throws). The handlers live by what they handle:
 * `hello.ts` (hello and resume), `commands.ts` (register, unregister, ping, nack, the budget),
 * `drain.ts` (deliveries, acks, the storage drain, the month move), `broadcasts.ts`, `timers.ts`,
 * `closing.ts` (closes, the final save), `sweep.ts` (a month move cut short by the close),
 * `failures.ts` (storage failures).
 */
import { broadcastSubscribe } from "./broadcasts.ts"
import {
  budgeted,
  channelAdded,
  channelRemoved,
  deferred,
  endpointMade,
  nack,
  ping,
  register,
  unregister,
  urgency,
  urgencyWritten,
  userWritten
} from "./commands.ts"
import {
  closeAnswered,
  closeEarlyWith,
  closingAck,
  closeLiveWith,
  closingMessagesSaved,
  closingMessageTaken,
  closingPageRead,
  closingNodeCleared,
  closingAckedTombstoned,
  closingUserRead,
  kickedEarly,
  kickedLive,
  leftover,
  mailboxDrained,
  socketClosedEarly,
  socketClosedLive
} from "./closing.ts"
import { closingFailed, helloFailed, liveCommandFailed } from "./failures.ts"
import {
  ack,
  advanceDraining,
  advanceMigrating,
  channelsAdded,
  checkAgain,
  channelsRead,
  delivery,
  drainAgain,
  ackedTombstoned,
  pageRead,
  recordPointed,
  startDrain,
  stay,
  tooManyDropped
} from "./drain.ts"
import { hello, resumed, staleUserDropped, uaidMinted, userRead, userReread } from "./hello.ts"
import { type Input, type InputKind, inputKind, isResultKind, type Transition } from "./inputs.ts"
import type { ClientMessage } from "./messages.ts"
import { type Handler, Out } from "./out.ts"
import type { BroadcastSet, Live, Phase, PhaseOf, PhaseTag, ProtocolOptions } from "./phases.ts"
import { active, closingTick, deadlineOf, helloTick, liveTick, pong } from "./timers.ts"

type InputOf<K extends InputKind> = K extends ClientMessage["messageType"] ? Extract<ClientMessage, { readonly messageType: K }>
  : Extract<Input, { readonly _tag: K }>

/** Each phase's row: input kind → handler of that phase and input. */
type Transitions = {
  readonly [P in PhaseTag]: { readonly [K in InputKind]?: Handler<PhaseOf<P>, InputOf<K>> }
}

/** A client frame is activity (the keepalive starts over), even one that waits for budget; a replayed one was counted when it came. */
const frame = <P extends Live, M>(handle: Handler<P, M>): Handler<P, M> => (phase, message, out, admitted) =>
  handle(admitted ? phase : active(phase, out.now), message, out, admitted)

const notYet = closeEarlyWith("expected-hello")

/** What every live phase does alike; rows below add what differs. */
const live = {
  hello: closeLiveWith("already-hello"),
  nack: frame(budgeted(nack)),
  ping: frame(ping),
  broadcast_subscribe: frame(budgeted(broadcastSubscribe)),
  urgency: frame(budgeted(urgency)),
  BadFrame: closeLiveWith("invalid-json"),
  BinaryFrame: closeLiveWith("binary-frame"),
  Pong: pong,
  Delivery: delivery,
  Tick: liveTick,
  Kick: kickedLive,
  SocketClosed: socketClosedLive,
  CommandFailed: liveCommandFailed
} as const

/** Register and unregister as they run (not while a month move waits for them). */
const commands = {
  register: frame(budgeted(register)),
  unregister: frame(budgeted(unregister)),
  EndpointMade: endpointMade,
  UserWritten: userWritten,
  ChannelAdded: channelAdded,
  ChannelRemoved: channelRemoved
} as const

export const TRANSITIONS: Transitions = {
  AwaitingHello: {
    hello,
    register: notYet,
    unregister: notYet,
    ack: notYet,
    nack: notYet,
    ping: notYet,
    broadcast_subscribe: notYet,
    urgency: notYet,
    BadFrame: closeEarlyWith("invalid-json"),
    BinaryFrame: closeEarlyWith("binary-frame"),
    Tick: helloTick,
    Kick: kickedEarly,
    SocketClosed: socketClosedEarly
  },
  Resuming: { UserRead: userRead, UserDropped: staleUserDropped, UserWritten: resumed, CommandFailed: helloFailed },
  Rechecking: { UserRead: userReread, CommandFailed: helloFailed },
  Minting: { UaidMinted: uaidMinted },
  Identified: {
    ...live,
    ...commands,
    ack: frame(ack(stay)),
    CheckStorage: (phase, _input, out) => startDrain(phase, out),
    UrgencyWritten: urgencyWritten(startDrain)
  },
  Draining: {
    ...live,
    ...commands,
    ack: frame(ack(advanceDraining)),
    CheckStorage: checkAgain(advanceDraining),
    PageRead: pageRead(advanceDraining, true),
    AckedTombstoned: ackedTombstoned(advanceDraining),
    UserDropped: tooManyDropped,
    UrgencyWritten: urgencyWritten(drainAgain)
  },
  Migrating: {
    ...live,
    register: frame(deferred),
    unregister: frame(deferred),
    ack: frame(ack(advanceMigrating)),
    CheckStorage: checkAgain(advanceMigrating),
    // Endpoints that read the old record may still store into the old table: read until a page is empty.
    PageRead: pageRead(advanceMigrating, false),
    AckedTombstoned: ackedTombstoned(advanceMigrating),
    UserDropped: tooManyDropped,
    UrgencyWritten: urgencyWritten(drainAgain)
  },
  // A poke while moving is not needed: both months are drained once the user has moved.
  Moving: {
    ...live,
    register: frame(deferred),
    unregister: frame(deferred),
    ack: frame(ack(stay)),
    ChannelsRead: channelsRead,
    ChannelsAdded: channelsAdded,
    RecordPointed: recordPointed,
    // Both months are drained once moved: what the lower minimum lets go comes then.
    UrgencyWritten: urgencyWritten(stay)
  },
  Closing: {
    ack: closingAck,
    SocketClosed: closeAnswered,
    Delivery: leftover,
    MailboxDrained: mailboxDrained,
    AckedTombstoned: closingAckedTombstoned,
    MessageTaken: closingMessageTaken,
    UserRead: closingUserRead,
    PageRead: closingPageRead,
    MessagesSaved: closingMessagesSaved,
    NodeCleared: closingNodeCleared,
    CommandFailed: closingFailed,
    Tick: closingTick
  },
  Closed: {}
}

/**
 * The handler of a (phase, input kind) cell. TypeScript cannot correlate a phase of the `Phase` union
 * with its own row, so the row is read as one for every phase: the table's type above is what checks
 * that each handler takes its cell's phase and input.
 */
const handlerOf = (phase: Phase, kind: InputKind): Handler<Phase, unknown> | undefined =>
  (TRANSITIONS[phase._tag] as { readonly [K in InputKind]?: Handler<Phase, unknown> })[kind]

const NO_BROADCASTS: BroadcastSet = new Map()

/** The protocol for a node's options: `step` and the phase a new connection starts in. */
export const makeProtocol = (options: ProtocolOptions) => {
  /** `broadcasts`: the node's broadcast set as of `now` (read on hello, subscribe and keepalive ticks). */
  const step = (phase: Phase, input: Input, now: number, broadcasts: BroadcastSet = NO_BROADCASTS): Transition => {
    const out = new Out(now, options, broadcasts)
    const kind = inputKind(input)
    const handler = handlerOf(phase, kind)
    if (handler === undefined) {
      if (isResultKind(kind)) throw new Error(`${kind} in phase ${phase._tag}`)
      return out.done(phase)
    }
    return input._tag === "Frame"
      ? out.done(handler(phase, input.message, out, input.admitted === true))
      : out.done(handler(phase, input, out, false))
  }
  return {
    step,
    initial: (now: number): Phase => ({ _tag: "AwaitingHello", openedAt: now }),
    deadline: (phase: Phase): number => deadlineOf(phase, options)
  }
}

export type Protocol = ReturnType<typeof makeProtocol>
