/** A sender that leaves mid-push: once delivery has started, it runs to its end. */
import * as http from "node:http"
import { assert, describe, layer } from "@effect/vitest"
import { Deferred, Effect } from "effect"
import { boundPort } from "../../src/endpoint/server.ts"
import { fakeNode, messagesOf, nodeCalls, subscribe, TestEndpoint } from "./harness.ts"

/** POST a push and close the socket, unanswered, once `leave` is done. */
const pushAndLeave = (port: number, path: string, leave: Deferred.Deferred<void>) =>
  Effect.gen(function*() {
    const req = http.request({ host: "127.0.0.1", port, method: "POST", path, headers: { ttl: 60, "content-length": 0 }, agent: false })
    req.on("error", () => {})
    req.end()
    yield* Deferred.await(leave)
    req.destroy()
  })

describe("a push whose sender leaves mid-delivery", () => {
  layer(TestEndpoint, { excludeTestServices: true })((it) => {
    it.effect("is still stored (the node refused it after the sender left), and the node poked after the store", () =>
      Effect.gen(function*() {
        const entered = yield* Deferred.make<void>()
        const release = yield* Deferred.make<void>()
        // The client's node takes its time, then refuses the direct delivery: the message is stored.
        const node = yield* fakeNode((call) =>
          call.kind !== "push" ? Effect.succeed(200) : Deferred.succeed(entered, undefined).pipe(
            Effect.andThen(Deferred.await(release)),
            Effect.as(404)
          ))
        const sub = yield* subscribe({ nodeId: node })
        const left = yield* Deferred.make<void>()
        yield* Effect.forkChild(pushAndLeave(yield* boundPort, sub.path, left))
        yield* Deferred.await(entered)
        yield* Deferred.succeed(left, undefined)
        // The server sees the socket close (and interrupts the push's fiber) before the node answers.
        yield* Effect.sleep("100 millis")
        yield* Deferred.succeed(release, undefined)
        let stored = yield* messagesOf(sub)
        for (let i = 0; i < 100 && stored.length === 0; i++) {
          yield* Effect.sleep("20 millis")
          stored = yield* messagesOf(sub)
        }
        assert.strictEqual(stored.length, 1, "the push ran to its end")
        for (let i = 0; i < 100 && !(yield* nodeCalls(sub.uaid)).some((c) => c.kind === "notify"); i++) yield* Effect.sleep("20 millis")
        assert.deepStrictEqual((yield* nodeCalls(sub.uaid)).map((c) => c.kind), ["push", "notify"], "the re-read after the store found the node")
      }))
  })
})
