/**
 * Hello: a claimed uaid is resumed (its router record read and written back with this node), or a
 * new uaid is minted; then the hello reply, and the session begins (draining what is stored).
 */
import { broadcastsReply, follow } from "./broadcasts.ts"
import { advanceMigrating, newDrain, startDrain } from "./drain.ts"
import type { CommandResult } from "./inputs.ts"
import { helloReply, type ClientMessage } from "./messages.ts"
import { activeTables, closeEarly, currentTable, NO_ACKS, NOTHING, type Out, tableName } from "./out.ts"
import { type AwaitingHello, type Budget, type Minting, NO_HELD, type Phase, type ProtocolOptions, type Rechecking, type Resuming, type Session, type Unidentified } from "./phases.ts"
import { parseUaid } from "../domain/ids.ts"
import type { UserRecord } from "../domain/user.ts"

type HelloMessage = Extract<ClientMessage, { readonly messageType: "hello" }>

/** The hello: resume the uaid it claims, or mint one. */
export const hello = (phase: AwaitingHello, message: HelloMessage, out: Out): Phase => {
  const claimed = typeof message.uaid === "string" ? parseUaid(message.uaid) : undefined
  const asked = { openedAt: phase.openedAt, broadcasts: message.broadcasts }
  if (claimed === undefined) return mint({ ...asked, claimed }, out)
  out.run({ _tag: "ReadUser", uaid: claimed, attempt: 0 })
  return { _tag: "Resuming", ...asked, claimed }
}

const mint = (from: Omit<Minting, "_tag">, out: Out): Minting => {
  out.run({ _tag: "MintUaid" })
  return { _tag: "Minting", openedAt: from.openedAt, broadcasts: from.broadcasts, claimed: from.claimed }
}

const resumable = (user: UserRecord | undefined): user is UserRecord => user !== undefined && user.routerType === "webpush"

/**
 * The claimed uaid's record: resume it (written back with this node, connected now), or a new uaid
 * (no record, a bridged one, or a stale month: that user is dropped and the client starts over).
 */
export const userRead = (phase: Resuming, { user }: { readonly user: UserRecord | undefined }, out: Out): Phase => {
  if (!resumable(user)) return mint(phase, out)
  if (user.connectedAt > out.now) return closeEarly("already-connected", out)
  if (!out.options.noTableRotation && (user.currentMonth === undefined || !activeTables(out.options, out.now).includes(user.currentMonth))) {
    out.run({ _tag: "DropUser", uaid: user.uaid, connectedAt: user.connectedAt, reason: "stale_month", attempt: 0 })
    return phase
  }
  out.run({ _tag: "WriteUser", user: { ...user, nodeId: out.options.routerUrl, connectedAt: out.now }, purpose: { _tag: "Resume", previous: user } })
  return phase
}

/** Read again after the resume write lost: gone (dropped meanwhile) → a new uaid; there → a newer session has it. */
export const userReread = (phase: Rechecking, { user }: { readonly user: UserRecord | undefined }, out: Out): Phase =>
  resumable(user) ? closeEarly("already-connected", out) : mint(phase, out)

export const staleUserDropped = (phase: Resuming, { dropped }: { readonly dropped: boolean }, out: Out): Phase => {
  if (dropped) out.event("uaid.reset.1", phase.claimed, { reason: "stale_month" })
  return mint(phase, out)
}

/**
 * Resumed: the node the record named before (if another) is told to drop its stale session. A write
 * that lost means the record is gone (dropped meanwhile → a new uaid) or newer (→ close): read again.
 */
export const resumed = (phase: Resuming, input: Extract<CommandResult, { _tag: "UserWritten" }>, out: Out): Phase => {
  const { user, purpose } = input.command
  if (!input.written) {
    out.run({ _tag: "ReadUser", uaid: user.uaid, attempt: 0 })
    return { ...phase, _tag: "Rechecking" }
  }
  const previous = purpose._tag === "Resume" ? purpose.previous : undefined
  if (previous?.nodeId !== undefined && previous.nodeId !== out.options.routerUrl) {
    out.signal({ _tag: "DisconnectPeer", nodeId: previous.nodeId, uaid: user.uaid, connectedAt: previous.connectedAt })
  }
  return identify(phase, user.uaid, user, "existing", out)
}

export const uaidMinted = (phase: Minting, { uaid }: { readonly uaid: string }, out: Out): Phase =>
  identify(phase, uaid, undefined, phase.claimed === undefined ? "new" : "reassigned", out)

/** A session's budget while it is full: one shared record per node's options (memory per connection). */
const fullBudgets = new WeakMap<ProtocolOptions, Budget>()
const fullBudget = (o: ProtocolOptions): Budget => {
  let budget = fullBudgets.get(o)
  if (budget === undefined) fullBudgets.set(o, budget = { tokens: o.commandBurst, tokensAt: 0, held: NO_HELD, readingPaused: false })
  return budget
}

/**
 * The hello reply (with the broadcasts the client is behind on), and the session begins. A resumed
 * session is the one its router record names: its `connectedAt` is the value it wrote there (time
 * has passed since), which every condition on `connected_at` compares with; a new uaid's is now, and
 * its first register writes it.
 */
const identify = (
  phase: Unidentified,
  uaid: string,
  user: UserRecord | undefined,
  kind: "new" | "existing" | "reassigned",
  out: Out
): Phase => {
  const now = out.now
  const connectedAt = user?.connectedAt ?? now
  const current = currentTable(out.options, now)
  const table = user?.currentMonth === undefined ? current : tableName(user.currentMonth)
  const followed = follow(NOTHING, phase.broadcasts, out.broadcasts)
  const session: Session = {
    uaid,
    connectedAt,
    table,
    recorded: user !== undefined,
    acks: NO_ACKS,
    keepalive: { lastActivity: now, pingSentAt: undefined, lastClientPing: undefined },
    budget: fullBudget(out.options),
    broadcasts: followed.broadcasts,
    retry: undefined,
    minUrgency: user?.urgency
  }
  out.signal({ _tag: "Claim", uaid, connectedAt, minUrgency: session.minUrgency })
  out.frame(helloReply(uaid, broadcastsReply(followed)))
  out.event("client.hello.1", uaid, { kind })
  if (followed.changed !== undefined) out.event("broadcast.delivered.1", uaid, { broadcasts: followed.changed, reason: "hello" })
  // A new uaid has nothing stored. A user on last month's table drains it there, then moves.
  if (user === undefined) return { _tag: "Identified", session }
  if (!out.options.noTableRotation && table !== current) return advanceMigrating({ _tag: "Migrating", session, drain: newDrain(table), deferred: NOTHING }, out)
  return startDrain({ _tag: "Identified", session }, out)
}
