/**
 * What every handler shares: `Out`, where one transition's frames, events, signals, command and
 * close are collected while it is decided, and the small helpers over sessions.
 */
import type { Mutable } from "effect/Types"
import { closeFrame, type CloseKind } from "./close.ts"
import type { Command, Signal, Transition } from "./inputs.ts"
import { notificationFrame } from "./messages.ts"
import { Ledger } from "./ledger.ts"
import { type Acks, type BroadcastSet, type Closed, type Closing, type Live, type Phase, type ProtocolOptions, type Session, sweepOf, type TopicSent, type Topics, TOPICS_GENERATION, type Unacked } from "./phases.ts"
import { domainEvent, type DomainEvent, type DomainEventType, type EventData, withReceipt } from "../domain/events.ts"
import { memoize } from "../platform/memo.ts"
import { type Notification, sortkeyMs } from "../domain/notification.ts"
import { activeTableNames, currentTableName } from "../storage/tables.ts"

export const NOTHING: ReadonlyArray<never> = []

/**
 * A step's output. Its lists are made on their first item: a step (a delivery, an ack) has one or
 * two of them, and a list not made is the shared empty one.
 */
export class Out {
  private frames: Array<string> | undefined = undefined
  private events: Array<DomainEvent> | undefined = undefined
  private signals: Array<Signal> | undefined = undefined
  command: Command | undefined = undefined
  close: CloseKind | undefined = undefined
  readonly now: number
  readonly options: ProtocolOptions
  /** The node's broadcasts as of this step. */
  readonly broadcasts: BroadcastSet

  constructor(now: number, options: ProtocolOptions, broadcasts: BroadcastSet) {
    this.now = now
    this.options = options
    this.broadcasts = broadcasts
  }

  frame(text: string): void {
    ;(this.frames ??= []).push(text)
  }

  event<T extends DomainEventType>(type: T, uaid: string, data: EventData<T>): void {
    ;(this.events ??= []).push(domainEvent(type, uaid, this.now, data))
  }

  run(command: Command): void {
    if (this.command !== undefined) throw new Error(`two commands in one transition: ${this.command._tag}, ${command._tag}`)
    this.command = command
  }

  signal(signal: Signal): void {
    ;(this.signals ??= []).push(signal)
  }

  done(phase: Phase): Transition {
    return {
      phase,
      frames: this.frames ?? NOTHING,
      events: this.events ?? NOTHING,
      signals: this.signals ?? NOTHING,
      command: this.command,
      close: this.close
    }
  }
}

/** A handler of one (phase, input) cell of the table. */
export type Handler<P extends Phase, I> = (phase: P, input: I, out: Out, admitted: boolean) => Phase

const isStored = (entry: Unacked): boolean => entry._tag === "Stored"
/** Unacked messages by version (`counted`: the stored ones). */
export const unackedOf = (entries: Iterable<readonly [string, Unacked]>): Ledger<Unacked> => Ledger.of(entries, isStored)
const NO_TOPICS: Topics = { young: Ledger.empty(), old: Ledger.empty() }
export const NO_ACKS: Acks = { unacked: unackedOf([]), ackedRows: NOTHING, newestTopic: NO_TOPICS }

// ── tables ──────────────────────────────────────────────────────────────────────────────────────

/** Table names as one string each: every session keeps its table's, built afresh or read from storage. */
export const tableName = memoize(16, (name) => name)

export const currentTable = (o: ProtocolOptions, now: number): string =>
  tableName(currentTableName({ routerTable: "", messageTablePrefix: o.messageTablePrefix, noTableRotation: o.noTableRotation }, now))

export const activeTables = (o: ProtocolOptions, now: number): ReadonlyArray<string> =>
  activeTableNames({ routerTable: "", messageTablePrefix: o.messageTablePrefix, noTableRotation: o.noTableRotation }, now)

export const backoff = (o: ProtocolOptions, attempt: number): number => Math.min(o.storageRetryMaxMs, o.storageRetryMs * 2 ** attempt)

// ── sessions ────────────────────────────────────────────────────────────────────────────────────

export const withSession = <P extends Live>(phase: P, session: Session): P => ({ ...phase, session })

export const storedOutstanding = (acks: Acks): number => acks.unacked.counted

/** Direct messages sent and not acked (counted with those queued against the client's capacity). */
export const directOutstanding = (acks: Acks): number => acks.unacked.size - acks.unacked.counted

const topicKey = (n: Notification): string => `${n.channelId}:${n.topic}`

const newestSent = (topics: Topics, key: string): TopicSent | undefined => topics.young.get(key) ?? topics.old.get(key)

/** A topic message older than one of its topic the client was sent: replaced (topic messages keep the ms they were accepted at). */
export const replacedTopic = (acks: Acks, n: Notification): boolean => {
  if (n.topic === undefined) return false
  const newest = newestSent(acks.newestTopic, topicKey(n))
  return newest !== undefined && newest.version !== n.version && newest.ms > sortkeyMs(n)
}

/** Whether `n` is the newest message of its topic the client was sent (a message without topic always is). */
export const newestOfTopic = (acks: Acks, n: Notification): boolean =>
  n.topic === undefined || newestSent(acks.newestTopic, topicKey(n))?.version === n.version

/**
 * `sent` is the newest of its topic now. A full young generation becomes the old one (the old one is
 * forgotten, but for the topics of messages still unacked: carried over, so that what is saved at the
 * end still knows it is the newest). Amortized O(1): a generation turns after `TOPICS_GENERATION` topics.
 */
const rememberTopic = (topics: Topics, unacked: Ledger<Unacked>, sent: TopicSent): Topics => {
  const { young, old } = topics
  if (young.has(sent.key) || young.size < TOPICS_GENERATION + unacked.size) return { young: young.set(sent.key, sent), old }
  let carried = Ledger.empty<TopicSent>()
  for (const kept of old.values()) if (!young.has(kept.key) && unacked.has(kept.version)) carried = carried.set(kept.key, kept)
  return { young: carried.set(sent.key, sent), old: young }
}

/** Track a message until it is acked. TTL 0 direct messages are fire-and-forget: nothing to save. */
export const remember = (s: Session, n: Notification, table: string | undefined): Session => {
  const tracked = table !== undefined || n.ttl > 0
  const entry: Unacked = table === undefined ? { _tag: "Direct", notification: n } : { _tag: "Stored", notification: n, table }
  const { acks } = s
  const unacked = tracked ? acks.unacked.set(n.version, entry) : acks.unacked
  const newestTopic = n.topic === undefined || replacedTopic(acks, n)
    ? acks.newestTopic
    : rememberTopic(acks.newestTopic, unacked, { key: topicKey(n), version: n.version, ms: sortkeyMs(n) })
  return unacked === acks.unacked && newestTopic === acks.newestTopic ? s : { ...s, acks: { ...acks, unacked, newestTopic } }
}

/** Send one notification frame (directly, or from a row of `table`) and track it. */
export const send = (s: Session, n: Notification, table: string | undefined, out: Out): Session => {
  out.frame(notificationFrame(n))
  const data: Mutable<EventData<"notification.delivered.1">> = {
    channelId: n.channelId,
    version: n.version,
    source: table === undefined ? "direct" : "stored"
  }
  if (n.traceparent !== undefined) data.traceparent = n.traceparent
  out.event("notification.delivered.1", s.uaid, withReceipt(data, n))
  return remember(s, n, table)
}

// ── closing ─────────────────────────────────────────────────────────────────────────────────────

/** The first stage of every end: what is still in the mailbox is collected. */
export const COLLECTING = { _tag: "Collecting" } as const

/**
 * Close a live connection: the close frame goes out, the acks the client sends until it answers
 * are taken, and then what is unacked is saved (`Closing`).
 */
export const closeLive = (phase: Live, kind: CloseKind, out: Out): Closing => {
  out.close = kind
  const { code, reason } = closeFrame(kind)
  out.event("session.closed.1", phase.session.uaid, { code, reason })
  return {
    _tag: "Closing",
    session: phase.session,
    reason,
    nodeStops: kind === "shutdown",
    since: out.now,
    retry: undefined,
    stage: { _tag: "Answering", until: out.now + out.options.closeGraceMs },
    sweep: sweepOf(phase)
  }
}

/** Close a connection that has no session yet: nothing to save. */
export const closeEarly = (kind: CloseKind, out: Out): Closed => {
  out.close = kind
  return { _tag: "Closed" }
}
