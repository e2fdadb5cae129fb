/**
 * A bound on work in flight: at most `permits` effects run through `withPermit` at once, the rest
 * wait their turn in order of arrival. Each step costs the same however many wait: a permit goes
 * from the one that ends straight to the first live waiter, and an interrupted waiter is marked,
 * never searched for. (Effect's `Semaphore` copies its whole waiter set on every release: with the
 * sessions of a node closing at once, tens of thousands wait, and the copies cost more than the
 * storage operations they wait for.)
 */
import * as Effect from "effect/Effect"
import type { SchedulerDispatcher } from "effect/Scheduler"

/** One effect waiting for a permit: resumed with it, or gone (interrupted) before its turn. */
interface Waiter {
  readonly resume: (effect: Effect.Effect<void>) => void
  /** Where the waiter's fiber runs: resumed from there, never inline in the fiber that released. */
  readonly dispatcher: SchedulerDispatcher
  gone: boolean
  granted: boolean
}

export class Permits {
  private free: number
  /** Waiters in order of arrival; `head` is the first not yet taken out (a queue without shifting). */
  private waiters: Array<Waiter> = []
  private head = 0

  constructor(permits: number) {
    this.free = permits
  }

  /** Effects waiting for a permit (those interrupted meanwhile counted until their turn comes). */
  get waiting(): number {
    return this.waiters.length - this.head
  }

  /** `effect` once a permit is free, the permit given back however it ends. */
  withPermit<A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> {
    return Effect.uninterruptibleMask((restore) =>
      Effect.andThen(restore(this.acquire()), Effect.ensuring(restore(effect), Effect.sync(() => this.release())))
    )
  }

  private acquire(): Effect.Effect<void> {
    return Effect.withFiber((fiber) => {
      if (this.free > 0 && this.waiting === 0) {
        this.free--
        return Effect.void
      }
      let waiter: Waiter | undefined
      const wait = Effect.callback<void>((resume) => {
        this.waiters.push(waiter = { resume, dispatcher: fiber.currentDispatcher, gone: false, granted: false })
      })
      // Interrupted while waiting, or once resumed and before it ran on (the whole wait, not just
      // the suspension): out of the line, and a permit handed over already goes to the next one.
      return Effect.onInterrupt(wait, () =>
        Effect.sync(() => {
          if (waiter === undefined) return
          waiter.gone = true
          if (waiter.granted) this.release()
        }))
    })
  }

  /** The permit goes to the first waiter still there, or back to the pool. */
  private release(): void {
    while (this.head < this.waiters.length) {
      const waiter = this.waiters[this.head]!
      this.waiters[this.head++] = undefined as unknown as Waiter
      if (this.head === this.waiters.length || this.head >= 1024 && this.head * 2 >= this.waiters.length) {
        this.waiters = this.waiters.slice(this.head)
        this.head = 0
      }
      if (waiter.gone) continue
      waiter.granted = true
      // Scheduled, not run here: resumed inline, a line of waiters whose work is synchronous would
      // each release into the next one's resume, one stack frame deeper each time.
      waiter.dispatcher.scheduleTask(() => waiter.resume(Effect.void), 0)
      return
    }
    this.free++
  }
}
