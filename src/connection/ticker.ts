/**
 * One fiber per node for every connection's timers (hello timeout, keepalive ping, pong timeout):
 * each session publishes its next deadline on its handle; the ticker wakes only the sessions whose
 * deadline has passed. Cheaper than a timer per connection, and driven by the Effect Clock so tests
 * move it with TestClock.
 */
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { NodeRegistry } from "./registry.ts"

const tickOnce = Effect.fnUntraced(function*() {
  const registry = yield* NodeRegistry
  const now = yield* Clock.currentTimeMillis
  for (const handle of registry.connections) {
    if (handle.deadline <= now) {
      handle.deadline = Number.POSITIVE_INFINITY
      handle.mailbox.offer({ _tag: "Tick" })
    }
  }
})

/** The ticker as a layer owning its fiber; `intervalMs` is the timer resolution. */
export const SessionTicker = (intervalMs: number) =>
  Layer.effectDiscard(
    tickOnce().pipe(
      Effect.andThen(Effect.sleep(intervalMs)),
      Effect.forever,
      Effect.forkScoped
    )
  )
