/** Waits for what a test expects to happen soon, in place of a fixed sleep. */
import { Effect } from "effect"

/**
 * Waits until `check` holds, for at most `ms`: for what the server does shortly after (closing its
 * side of a socket, a gauge coming down), which a loaded machine delays by an unknown time. The
 * assertion that follows says what was expected.
 */
export const eventually = <E, R>(check: Effect.Effect<boolean, E, R>, ms: number): Effect.Effect<void, E, R> =>
  Effect.gen(function*() {
    const deadline = performance.now() + ms
    while (!(yield* check) && performance.now() < deadline) yield* Effect.sleep("20 millis")
  })

/** `eventually` for a check outside Effect. */
export const waitUntil = async (check: () => boolean | Promise<boolean>, ms: number): Promise<void> => {
  for (const deadline = performance.now() + ms; !(await check()) && performance.now() < deadline;) {
    await new Promise((resolve) => setTimeout(resolve, 20))
  }
}
