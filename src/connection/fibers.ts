/**
 * The node's own background fibers (health checks, log lines, the finishing of sessions that ended
 * early), in one set the node waits for on shutdown.
 */
import * as Effect from "effect/Effect"
import type * as Fiber from "effect/Fiber"
import * as FiberSet from "effect/FiberSet"

export interface NodeFibers {
  /** Start an effect in a fiber of the node's. */
  readonly run: <A, E>(effect: Effect.Effect<A, E>) => Fiber.Fiber<A, E>
  /** Start it and hand its outcome to a promise (for `node:http` callbacks). */
  readonly runPromise: <A, E>(effect: Effect.Effect<A, E>) => Promise<A>
  /** Until every fiber started here has ended. */
  readonly awaitEmpty: Effect.Effect<void>
}

export const nodeFibers = Effect.gen(function*() {
  const fibers = yield* FiberSet.make()
  const run = yield* FiberSet.runtime(fibers)<never>()
  return {
    run,
    runPromise: <A, E>(effect: Effect.Effect<A, E>) =>
      new Promise<A>((resolve, reject) => run(effect).addObserver((exit) => exit._tag === "Success" ? resolve(exit.value) : reject(exit.cause))),
    awaitEmpty: FiberSet.awaitEmpty(fibers)
  } satisfies NodeFibers
})
