/**
 * The client's inbox (its frames waiting in the session's mailbox) stays within its bound whatever
 * the client sends and however the session keeps up: the socket (a model of it here) is told to stop
 * reading once the inbox is full and to read again once it drained, and it may still hand over a few
 * frames it had read already. Frames are never refused (nobody is closed for sending fast); what the
 * client sends once the session is closing is refused.
 */
import { assert, describe, it } from "@effect/vitest"
import { Arbitrary, Effect, Schema } from "effect"
import { TestClock } from "effect/testing"
import { textFrame } from "../../src/protocol/inputs.ts"
import { HELD_COMMANDS_MAX, heldList, heldOf, heldPush, heldTake, NO_HELD } from "../../src/protocol/phases.ts"
import type { ClientMessage } from "../../src/protocol/messages.ts"
import { makeHarness, pushMessage, TestParts } from "./harness.ts"

const START = Date.UTC(2026, 10, 27, 12, 0, 0)
const CHID = "eac8e1de-cddf-42d6-9919-a7b0e0f41e59"
const BOUND = { frames: 8, bytes: 4_096 }
/** Frames a socket may still hand over after it was told to stop (what it had read already). */
const SLACK = 4

const FRAMES: ReadonlyArray<string> = [
  JSON.stringify({ messageType: "register", channelID: CHID }),
  JSON.stringify({ messageType: "unregister", channelID: CHID }),
  JSON.stringify({ messageType: "ack", updates: [{ channelID: CHID, version: "unknown" }] }),
  JSON.stringify({ messageType: "nack", version: "unknown", code: 301 }),
  JSON.stringify({ messageType: "broadcast_subscribe", broadcasts: { "a/b": "v1" } }),
  JSON.stringify({ messageType: "urgency", min: "low" }),
  "{}",
  "{not json"
]

const Step = Schema.Union([
  /** The client sends `count` frames (of `pad` extra bytes), while the socket is read (or within the slack). */
  Schema.Struct({ op: Schema.Literal("send"), count: Schema.Literals([1, 4, 16]), frame: Schema.Int.check(Schema.isBetween({ minimum: 0, maximum: FRAMES.length - 1 })), pad: Schema.Literals([0, 100, 1_500, 3_000]) }),
  /** The session's fiber takes and handles one event. */
  Schema.Struct({ op: Schema.Literal("take") }),
  Schema.Struct({ op: Schema.Literal("push") }),
  Schema.Struct({ op: Schema.Literal("wait"), ms: Schema.Literals([10, 100, 1_000]) })
])

/** Runs in which reading paused and the client was still served (the property is not vacuous). */
const tally = { pausedAndServed: 0 }

const Steps = Arbitrary.array(Arbitrary.schema(Step), { minLength: 10, maxLength: 200 })

describe("the inbox bound", () => {
  it.effect.prop(
    "any interleaving of frames, deliveries, ticks and handling keeps the inbox within its bound; the socket is read again once it drained",
    [Steps, Arbitrary.schema(Schema.Boolean)],
    ([steps, garbageAllowed]) =>
      Effect.gen(function*() {
        yield* TestClock.setTime(START)
        const harness = yield* makeHarness({ inboxFrames: BOUND.frames, inboxBytes: BOUND.bytes, commandBurst: 3, commandsPerSecond: 2, minPingIntervalMs: 0 })
        const client = yield* harness.connect()
        const mailbox = client.handle.mailbox
        const socket = { reading: true, slack: 0, pauses: 0 }
        mailbox.gate = {
          inboxFull: () => {
            assert.isTrue(socket.reading, "told to stop once")
            socket.reading = false
            socket.slack = SLACK
            socket.pauses++
          },
          inboxDrained: () => {
            assert.isFalse(socket.reading, "told to read again only when stopped")
            socket.reading = true
          }
        }
        yield* client.frame({ messageType: "hello", use_webpush: true })
        yield* client.frame({ messageType: "register", channelID: CHID })
        const uaid = client.handle.uaid as string
        const takeOne = Effect.suspend(() => {
          const event = mailbox.poll()
          return event === undefined || client.machine.isClosed ? Effect.void : client.feed(event)
        })
        for (const step of steps) {
          switch (step.op) {
            case "send": {
              const text = FRAMES[step.frame] as string
              if (text === "{not json" && !garbageAllowed) break
              // Extra bytes in a field nobody reads (a message of its type all the same).
              const padded = step.pad === 0 || !text.startsWith("{\"messageType") ? text : text.replace(/^\{/, `{"pad":"${"x".repeat(step.pad)}",`)
              for (let i = 0; i < step.count; i++) {
                if (!socket.reading && socket.slack-- <= 0) break
                const offered = mailbox.offerFrame(textFrame(padded), Buffer.byteLength(padded))
                assert.strictEqual(offered, !mailbox.isClosed, "a frame is refused only once the session is closing")
                assert.isAtMost(mailbox.frames, BOUND.frames + SLACK, "frames waiting")
              }
              break
            }
            case "take":
              yield* takeOne
              break
            case "push":
              if (!client.machine.isClosed) yield* pushMessage(harness, uaid, CHID).pipe(Effect.ignore)
              break
            case "wait":
              yield* TestClock.adjust(step.ms)
              if (!client.machine.isClosed) mailbox.offer({ _tag: "Tick" })
              break
          }
          assert.isAtMost(mailbox.frames, BOUND.frames + SLACK, "frames waiting")
          assert.isAtMost(mailbox.bytes, BOUND.bytes + (SLACK + 1) * 3_200, "bytes waiting (the frame that filled it, then the slack)")
          if (!mailbox.isClosed) assert.strictEqual(socket.reading, !mailbox.full, "the socket is read exactly while the inbox is not full")
          const phase = client.machine.phase
          if ("session" in phase) {
            assert.isAtMost(phase.session.budget.held.length, HELD_COMMANDS_MAX + BOUND.frames + SLACK, "commands waiting for the budget")
          }
        }
        if (socket.pauses > 0 && !mailbox.isClosed) tally.pausedAndServed++
        // The session keeps up at last: everything it holds is handled, and the socket is read again.
        for (let i = 0; i < 10_000 && mailbox.size > 0; i++) yield* takeOne
        if (!mailbox.isClosed) {
          assert.strictEqual(mailbox.frames, 0)
          assert.strictEqual(mailbox.bytes, 0)
          assert.isTrue(socket.reading, "read again once drained")
          assert.isUndefined(client.sent.closed, "never closed for sending fast")
        }
      }).pipe(Effect.provide(TestParts)),
    { timeout: 120_000, arbitrary: { runs: 200 } }
  )

  it("reading paused in many of those runs, with the client still served", () => {
    assert.isAtLeast(tally.pausedAndServed, 20)
  })

  it.effect.prop(
    "commands waiting for the budget: a queue that keeps every earlier version, taken in order",
    [Arbitrary.array(Arbitrary.schema(Schema.Int.check(Schema.isBetween({ minimum: -1, maximum: 5 }))), { maxLength: 200 })],
    ([ops]) =>
      Effect.sync(() => {
        let held = NO_HELD
        let model: Array<ClientMessage> = []
        const versions: Array<readonly [typeof held, ReadonlyArray<ClientMessage>]> = []
        let n = 0
        for (const op of ops) {
          if (op < 0) {
            const message = { messageType: "nack", version: String(n++) } as ClientMessage
            held = heldPush(held, message)
            model = [...model, message]
          } else {
            const [taken, rest] = heldTake(held, op)
            assert.deepStrictEqual(taken, model.slice(0, op))
            held = rest
            model = model.slice(op)
          }
          assert.strictEqual(held.length, model.length)
          versions.push([held, model])
        }
        for (const [version, expected] of versions) assert.deepStrictEqual(heldList(version), expected)
        assert.deepStrictEqual(heldList(heldOf(model)), model)
      }),
    { arbitrary: { runs: 300 } }
  )
})
