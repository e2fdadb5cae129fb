/**
 * The one ordered mailbox of a connection. `ws` callbacks and the router port push into it
 * synchronously; the connection's fiber takes from it. Deliveries are bounded (`capacity`): when the
 * queue holds that many, `offerDelivery` refuses and the router port answers so the endpoint stores.
 * The client's frames (its inbox) are bounded in count and bytes (`inbox`): a frame is never refused
 * (the client is not closed for sending fast), but once the inbox is full the `gate` is told to stop
 * reading the socket, and to read it again once the fiber has taken half of it.
 * Some events mean the same however many wait (a storage check, a timer, a kick): at most one of
 * each such kind (`once`) waits, and offering another while it waits is taken as done — a storm of
 * storage pokes costs the session one check, not one mailbox entry each.
 * Lean on purpose: an idle connection holds one of these, so no Queue/Deferred per connection.
 */
import * as Effect from "effect/Effect"

/** What takes a mailbox's events: the fiber goes on with `receive(event)`. */
export interface Consumer<E> {
  receive(event: E): Effect.Effect<void>
}

/** How many of the client's frames, and how many of their bytes, may wait before reading pauses. */
export interface InboxBound {
  readonly frames: number
  readonly bytes: number
}

/** The socket, as the inbox sees it: stop reading while the inbox is full, read again once it drained. */
export interface InboxGate {
  inboxFull(): void
  inboxDrained(): void
}

const UNBOUNDED: InboxBound = { frames: Number.POSITIVE_INFINITY, bytes: Number.POSITIVE_INFINITY }
const ANY_NUMBER = (): number => 0

/** Taken slots at the head beyond which the queue is compacted (when they are at least half of it). */
const COMPACT_AFTER = 256

export class Mailbox<E> {
  /** Made when something is queued: an idle connection's mailbox is empty. */
  private items: Array<E> | undefined = undefined
  /** Alongside `items`: a client frame's weight (its bytes, at least 1), 0 for any other event. */
  private weights: Array<number> | undefined = undefined
  private head = 0
  /** While the fiber waits: its resume, and who receives the event it waits for. */
  private waiter: ((effect: Effect.Effect<void>) => void) | undefined = undefined
  private consumer: Consumer<E> | undefined = undefined
  private closed = false
  /** Deliveries queued and not yet taken. */
  deliveries = 0
  /** The client's frames queued and not yet taken, and their bytes. */
  frames = 0
  bytes = 0
  /** The `once` kinds (bits) waiting now. */
  private waiting = 0
  /** Whether the gate was told the inbox is full (and not yet that it drained). */
  full = false
  /** Told when the inbox fills and drains (the socket); none: the bound is only counted. */
  gate: InboxGate | undefined = undefined
  readonly capacity: number
  readonly isDelivery: (event: E) => boolean
  readonly inbox: InboxBound
  /** An event's kind of which at most one waits (a bit of its own), or 0: any number may wait. */
  readonly once: (event: E) => number

  constructor(capacity: number, isDelivery: (event: E) => boolean, inbox: InboxBound = UNBOUNDED, once: (event: E) => number = ANY_NUMBER) {
    this.capacity = capacity
    this.isDelivery = isDelivery
    this.inbox = inbox
    this.once = once
  }

  /** Queue an event (one of its `once` kind waiting already: taken as done); false once the mailbox is closed. */
  offer(event: E): boolean {
    return this.push(event, 0)
  }

  /**
   * Queue a frame from the client, of `bytes` bytes; false once the mailbox is closed. It counts
   * toward the inbox bound until taken: reaching it, the gate is told to stop reading.
   */
  offerFrame(event: E, bytes: number): boolean {
    return this.push(event, Math.max(1, bytes))
  }

  private push(event: E, weight: number): boolean {
    if (this.closed) return false
    if (this.joins(event)) return true
    if (this.wake(event)) return true
    this.waiting |= this.once(event)
    if (this.isDelivery(event)) this.deliveries++
    ;(this.items ??= []).push(event)
    ;(this.weights ??= []).push(weight)
    if (weight > 0) {
      this.frames++
      this.bytes += weight
      if (!this.full && (this.frames >= this.inbox.frames || this.bytes >= this.inbox.bytes)) {
        this.full = true
        this.gate?.inboxFull()
      }
    }
    return true
  }

  /** Queue an event ahead of everything waiting (a kick: nothing queued behind it matters any more). */
  offerFirst(event: E): boolean {
    if (this.closed) return false
    if (this.joins(event)) return true
    if (this.wake(event)) return true
    this.waiting |= this.once(event)
    if (this.isDelivery(event)) this.deliveries++
    const items = this.items ??= []
    const weights = this.weights ??= []
    if (this.head > 0) {
      items[--this.head] = event
      weights[this.head] = 0
    } else {
      items.unshift(event)
      weights.unshift(0)
    }
    return true
  }

  /** Queue a delivery unless `capacity` deliveries are already waiting. */
  offerDelivery(event: E): boolean {
    return this.deliveries < this.capacity && this.offer(event)
  }

  /**
   * No more events are accepted (the session is going away); queued ones can still be taken. The
   * gate is not told the inbox drained any more: nothing the client sends now is read.
   */
  close(): void {
    this.closed = true
  }

  get isClosed(): boolean {
    return this.closed
  }

  get size(): number {
    return (this.items?.length ?? 0) - this.head
  }

  /**
   * Go on with `consumer.receive(next event)`, waiting for one if there is none. The fiber resumes
   * straight into `receive`, so while it waits it holds no continuation of its own (an idle
   * connection's fiber stays small). No cancel hook: an interrupted take leaves a waiter whose
   * resume is ignored, and the mailbox is dropped with its session anyway.
   */
  take(consumer: Consumer<E>): Effect.Effect<void> {
    if (this.size > 0) return consumer.receive(this.shift())
    return Effect.callback<void>((resume) => {
      this.waiter = resume
      this.consumer = consumer
    })
  }

  /** Whether one of `event`'s `once` kind waits already (`event` then adds nothing). */
  private joins(event: E): boolean {
    return (this.waiting & this.once(event)) !== 0
  }

  /** Hand `event` to a waiting fiber, if one waits. */
  private wake(event: E): boolean {
    const waiter = this.waiter
    const consumer = this.consumer
    if (waiter === undefined || consumer === undefined) return false
    this.waiter = undefined
    this.consumer = undefined
    // Built in the fiber: a bug in `receive` ends that session, not the caller (a `ws` callback).
    waiter(Effect.suspend(() => consumer.receive(event)))
    return true
  }

  /** Take without waiting, or undefined when empty. */
  poll(): E | undefined {
    return this.size > 0 ? this.shift() : undefined
  }

  /** The first queued event (there is one). */
  private shift(): E {
    const items = this.items as Array<E>
    const weights = this.weights as Array<number>
    const event = items[this.head] as E
    const weight = weights[this.head] as number
    items[this.head++] = undefined as E
    if (this.head === items.length) {
      this.items = undefined
      this.weights = undefined
      this.head = 0
    } else if (this.head >= COMPACT_AFTER && this.head * 2 >= items.length) {
      // A queue that never empties (a steady flood) would otherwise only grow.
      this.items = items.slice(this.head)
      this.weights = weights.slice(this.head)
      this.head = 0
    }
    this.waiting &= ~this.once(event)
    if (this.isDelivery(event)) this.deliveries--
    if (weight > 0) {
      this.frames--
      this.bytes -= weight
      if (this.full && !this.closed && this.frames <= this.inbox.frames / 2 && this.bytes <= this.inbox.bytes / 2) {
        this.full = false
        this.gate?.inboxDrained()
      }
    }
    return event
  }
}
