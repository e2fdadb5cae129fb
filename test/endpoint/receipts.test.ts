/**
 * The endpoint's side of push receipts, over in-memory storage with injectable faults: the status
 * row of a push with a receipt is written before the message goes anywhere, so a storage failure
 * then is a 503 with nothing sent (the sender's retry is not a duplicate); a failure after the
 * message went leaves the answer 202.
 */
import { assert, describe, layer } from "@effect/vitest"
import { Effect } from "effect"
import { EndpointCrypto } from "../../src/crypto/endpoint.ts"
import { Storage } from "../../src/storage/Storage.ts"
import { fakeNode, messagesOf, nodeCalls, push, request, subscribe, TestEndpoint, withStorageFaults } from "./harness.ts"

const headers = { ttl: 60, "content-encoding": "aes128gcm" }
const BODY = "x"

const receiptSubscription = Effect.map(request({ method: "POST", path: "/receipts" }), (reply) => {
  assert.strictEqual(reply.status, 201)
  return String(reply.headers["location"])
})

describe("push receipts at the endpoint", () => {
  layer(TestEndpoint, { excludeTestServices: true })((it) => {
    it.effect("the status row is written before the message goes: accepted, with its deadline", () =>
      Effect.gen(function*() {
        const node = yield* fakeNode(200)
        const sub = yield* subscribe({ nodeId: node })
        const receipts = yield* receiptSubscription
        const reply = yield* push(sub, { ...headers, "push-receipt": receipts }, BODY)
        assert.strictEqual(reply.status, 202)
        const messageId = String(reply.headers["location"]).split("/m/")[1] as string
        const ids = yield* (yield* EndpointCrypto).parseMessageId(messageId)
        const status = yield* (yield* Storage).getMessageStatus(ids.receipt as string, messageId)
        assert.isDefined(status?.acceptedAt)
        assert.strictEqual(status?.deadline, (Math.floor((status?.acceptedAt ?? 0) / 1000) + 60) * 1000)
      }))

    it.effect("storage failing as the row is written: 503, and nothing sent or stored", () =>
      Effect.gen(function*() {
        const node = yield* fakeNode(200)
        const sub = yield* subscribe({ nodeId: node })
        const receipts = yield* receiptSubscription
        const reply = yield* withStorageFaults(["updateMessageStatus"], push(sub, { ...headers, "push-receipt": receipts }, BODY))
        assert.deepStrictEqual([reply.status, JSON.parse(reply.text).errno], [503, 201])
        assert.deepStrictEqual(yield* nodeCalls(sub.uaid), [])
        assert.deepStrictEqual(yield* messagesOf(sub), [])
      }))
  })
})
