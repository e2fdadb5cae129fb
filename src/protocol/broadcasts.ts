/**
 * Broadcasts (megaphone): what a client follows, told in the hello reply, on `broadcast_subscribe`,
 * and at a keepalive tick when a followed version moves on.
 */
import type { ClientMessage } from "./messages.ts"
import { broadcastFrame } from "./messages.ts"
import { NOTHING, type Out, withSession } from "./out.ts"
import { BROADCAST_ID_MAX, type BroadcastSet, BROADCASTS_PER_MESSAGE, type Live, type Phase, type Session } from "./phases.ts"

type Msg<T extends ClientMessage["messageType"]> = Extract<ClientMessage, { readonly messageType: T }>

/** The id strings of a node set, to share rather than keep each client's copy (memory per connection). */
const ownIds = new WeakMap<BroadcastSet, ReadonlyMap<string, string>>()
const ownId = (set: BroadcastSet, id: string): string => {
  let ids = ownIds.get(set)
  if (ids === undefined) {
    ids = new Map(Array.from(set.keys(), (key) => [key, key]))
    ownIds.set(set, ids)
  }
  return ids.get(id) ?? id
}

interface Followed {
  /** The flat id/version list the session keeps. */
  readonly broadcasts: ReadonlyArray<string>
  /** Broadcasts whose node version the client did not have (now sent), if any. */
  readonly changed: Readonly<Record<string, string>> | undefined
  /** Requested ids the node does not have, if any. */
  readonly unknown: ReadonlyArray<string> | undefined
}

/**
 * Follow what a client asks for (hello or `broadcast_subscribe`): the ids the node has are kept with
 * the node's version (sent when the client's differs), unknown ids are answered as errors. At most
 * `BROADCASTS_PER_MESSAGE` ids are looked at; ids longer than `BROADCAST_ID_MAX` are ignored.
 */
export const follow = (
  current: ReadonlyArray<string>,
  requested: Readonly<Record<string, string>> | undefined,
  set: BroadcastSet
): Followed => {
  if (requested === undefined) return { broadcasts: current, changed: undefined, unknown: undefined }
  // The list is copied once (it holds at most the node's set: `MAX_BROADCASTS` ids), and each id is
  // found by its position, not by a scan of the list (a subscribe of 100 ids while following 1,000
  // cost 200,000 comparisons).
  const kept = current.slice()
  let positions: Map<string, number> | undefined
  let changed: Record<string, string> | undefined
  let unknown: Array<string> | undefined
  let looked = 0
  for (const id in requested) {
    if (looked++ >= BROADCASTS_PER_MESSAGE) break
    if (id.length > BROADCAST_ID_MAX) continue
    const version = set.get(id)
    if (version === undefined) {
      ;(unknown ??= []).push(id)
      continue
    }
    if (requested[id] !== version) (changed ??= {})[id] = version
    const own = ownId(set, id)
    positions ??= positionsOf(kept)
    const at = positions.get(own)
    if (at !== undefined) kept[at + 1] = version
    else {
      positions.set(own, kept.length)
      kept.push(own, version)
    }
  }
  return { broadcasts: kept.length === 0 ? NOTHING : kept, changed, unknown }
}

/** Where each id of a flat id/version list is. */
const positionsOf = (flat: ReadonlyArray<string>): Map<string, number> => {
  const positions = new Map<string, number>()
  for (let i = 0; i < flat.length; i += 2) positions.set(flat[i] as string, i)
  return positions
}

/** Followed broadcasts whose node version moved on: the new versions, and the list updated. */
export const behind = (session: Session, set: BroadcastSet): Followed => {
  let changed: Record<string, string> | undefined
  let kept: Array<string> | undefined
  const flat = session.broadcasts
  for (let i = 0; i < flat.length; i += 2) {
    const id = flat[i]
    const version = id === undefined ? undefined : set.get(id)
    if (id === undefined || version === undefined || version === flat[i + 1]) continue
    ;(changed ??= {})[id] = version
    ;(kept ??= flat.slice())[i + 1] = version
  }
  return { broadcasts: kept ?? flat, changed, unknown: undefined }
}

/** The wire object: changed versions, and `errors` for unknown ids. */
export const broadcastsReply = ({ changed, unknown }: Followed): Record<string, unknown> => {
  const reply: Record<string, unknown> = { ...changed }
  if (unknown !== undefined) reply["errors"] = Object.fromEntries(unknown.map((id) => [id, BROADCAST_NOT_FOUND]))
  return reply
}

const BROADCAST_NOT_FOUND = "Broadcast not found"

/** Subscribe: follow more ids; anything new to the client is answered at once (nothing: no reply). */
export const broadcastSubscribe = (phase: Live, message: Msg<"broadcast_subscribe">, out: Out): Phase => {
  const s = phase.session
  const pending = behind(s, out.broadcasts)
  const followed = follow(pending.broadcasts, message.broadcasts, out.broadcasts)
  const changed = pending.changed === undefined ? followed.changed : { ...pending.changed, ...followed.changed }
  const all: Followed = { ...followed, changed }
  if (changed !== undefined || followed.unknown !== undefined) out.frame(broadcastFrame(broadcastsReply(all)))
  if (changed !== undefined) out.event("broadcast.delivered.1", s.uaid, { broadcasts: changed, reason: "subscribe" })
  return withSession(phase, { ...s, broadcasts: followed.broadcasts })
}

