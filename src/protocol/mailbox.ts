/**
 * The one ordered mailbox of a connection. `ws` callbacks and the router port push into it
 * synchronously; the connection's fiber takes from it. Deliveries are bounded (`capacity`): when the
 * queue holds that many, `offerDelivery` refuses and the router port answers so the endpoint stores.
 * Lean on purpose: an idle connection holds one of these, so no Queue/Deferred per connection.
 */
import * as Effect from "effect/Effect"

/** What takes a mailbox's events: the fiber goes on with `receive(event)`. */
export interface Consumer<E> {
  receive(event: E): Effect.Effect<void>
}

export class Mailbox<E> {
  /** Made when something is queued: an idle connection's mailbox is empty. */
  private items: Array<E> | undefined = undefined
  private head = 0
  /** While the fiber waits: its resume, and who receives the event it waits for. */
  private waiter: ((effect: Effect.Effect<void>) => void) | undefined = undefined
  private consumer: Consumer<E> | undefined = undefined
  private closed = false
  /** Deliveries queued and not yet taken. */
  deliveries = 0
  readonly capacity: number
  readonly isDelivery: (event: E) => boolean

  constructor(capacity: number, isDelivery: (event: E) => boolean) {
    this.capacity = capacity
    this.isDelivery = isDelivery
  }

  /** Queue an event; false once the mailbox is closed. */
  offer(event: E): boolean {
    if (this.closed) return false
    if (this.wake(event)) return true
    if (this.isDelivery(event)) this.deliveries++
    ;(this.items ??= []).push(event)
    return true
  }

  /** Queue an event ahead of everything waiting (a kick: nothing queued behind it matters any more). */
  offerFirst(event: E): boolean {
    if (this.closed) return false
    if (this.wake(event)) return true
    if (this.isDelivery(event)) this.deliveries++
    const items = this.items ??= []
    if (this.head > 0) items[--this.head] = event
    else items.unshift(event)
    return true
  }

  /** Queue a delivery unless `capacity` deliveries are already waiting. */
  offerDelivery(event: E): boolean {
    return this.deliveries < this.capacity && this.offer(event)
  }

  /** No more events are accepted (the session is going away); queued ones can still be taken. */
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
    const event = items[this.head] as E
    items[this.head++] = undefined as E
    if (this.head === items.length) {
      this.items = undefined
      this.head = 0
    }
    if (this.isDelivery(event)) this.deliveries--
    return event
  }
}
