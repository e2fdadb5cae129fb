/** `DELETE /m/{message_id}`: cancel a stored message. */
import { assert, describe, it, layer } from "@effect/vitest"
import { Effect, Result } from "effect"
import { TestClock } from "effect/testing"
import { EndpointCrypto, TEST_CRYPTO_KEY, TEST_ENDPOINT_URL } from "../../src/crypto/endpoint.ts"
import { encrypt, parseFernetKey } from "../../src/crypto/fernet.ts"
import { MORE_INFO } from "../../src/domain/errors.ts"
import { removeStoredMessage } from "../../src/endpoint/webpush.ts"
import { Storage } from "../../src/storage/Storage.ts"
import { type Client, makeHarness, pump, pushMessage, TestParts } from "../protocol/harness.ts"
import { fakeNode, messagesOf, push, request, subscribe, TestEndpoint, withStorageFaults } from "./harness.ts"

const pathOf = (location: string | string[] | undefined) => String(location).slice(TEST_ENDPOINT_URL.length)

const notStored = { code: 404, errno: null, error: "Not Found", message: "No stored message has this ID", more_info: MORE_INFO }

const invalidId = { code: 400, errno: null, error: "Bad Request", message: "Invalid message ID", more_info: MORE_INFO }

describe("DELETE /m/{message_id}", () => {
  layer(TestEndpoint, { excludeTestServices: true })((it) => {
    it.effect("cancels a stored timestamp message; again: 404, nothing is stored under that id", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        const keep = yield* push(sub)
        const gone = yield* push(sub)
        assert.strictEqual((yield* messagesOf(sub)).length, 2)
        const path = pathOf(gone.headers["location"])
        assert.match(path, /^\/m\//)
        const reply = yield* request({ method: "DELETE", path })
        assert.strictEqual(reply.status, 204)
        assert.strictEqual(reply.text, "")
        assert.deepStrictEqual((yield* messagesOf(sub)).map((m) => m.version), [pathOf(keep.headers["location"]).slice(3)])
        const again = yield* request({ method: "DELETE", path })
        assert.strictEqual(again.status, 404)
        assert.deepStrictEqual(again.json(), notStored)
      }))

    it.effect("cancels a stored topic message", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        const reply = yield* push(sub, { topic: "news" })
        assert.strictEqual((yield* messagesOf(sub)).length, 1)
        assert.strictEqual((yield* request({ method: "DELETE", path: pathOf(reply.headers["location"]) })).status, 204)
        assert.deepStrictEqual(yield* messagesOf(sub), [])
      }))

    it.effect("a message delivered to a connected client: 404, nothing is stored to take back", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe({ nodeId: yield* fakeNode(200) })
        const reply = yield* push(sub)
        assert.deepStrictEqual((yield* request({ method: "DELETE", path: pathOf(reply.headers["location"]) })).json(), notStored)
      }))

    it.effect("an id that does not decrypt → 400, errno null", () =>
      Effect.gen(function*() {
        for (const id of ["nope", "gAAAAABkZXJwCg==", "A".repeat(300)]) {
          const reply = yield* request({ method: "DELETE", path: `/m/${id}` })
          assert.strictEqual(reply.status, 400, id)
          assert.deepStrictEqual(reply.json(), invalidId)
        }
      }))

    it.effect("an id that decrypts to something else than a message key → 400", () =>
      Effect.gen(function*() {
        const key = Result.getOrThrow(parseFernetKey(TEST_CRYPTO_KEY))
        for (const plaintext of ["03:abc:def:1", "02:abc", `01:${"a".repeat(32)}`]) {
          const reply = yield* request({ method: "DELETE", path: `/m/${encrypt(key, plaintext, { now: Math.floor(Date.now() / 1000) })}` })
          assert.strictEqual(reply.status, 400, plaintext)
          assert.deepStrictEqual(reply.json(), invalidId)
        }
      }))

    it.effect("storage failure → 503/201", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        const posted = yield* push(sub)
        const reply = yield* withStorageFaults(
          ["cancelMessage"],
          request({ method: "DELETE", path: pathOf(posted.headers["location"]) })
        )
        assert.strictEqual(reply.status, 503)
        assert.strictEqual(reply.headers["retry-after"], "120")
        assert.strictEqual(reply.json().errno, 201)
      }))
  })
})

// ── cancel by identity, with a connection node that saves what its client left unacked ──────────

const CHID = "eac8e1de-cddf-42d6-9919-a7b0e0f41e59"
const NOW = Date.UTC(2026, 10, 21, 12, 0, 0)

const helloed = (client: Client, uaid?: string) =>
  client.frame(uaid === undefined ? { messageType: "hello", use_webpush: true } : { messageType: "hello", uaid, use_webpush: true })

/** What `DELETE /m/{id}` does with an id: true when it took a stored message back (answered 204). */
const cancelById = (messageId: string) =>
  Effect.gen(function*() {
    const data = yield* (yield* EndpointCrypto).parseMessageId(messageId).pipe(Effect.orDie)
    return yield* removeStoredMessage(yield* Storage, data, messageId).pipe(Effect.orDie)
  })

describe("cancel by identity: a message id names one message wherever it is stored", () => {
  it.effect("delivered directly, left unacked, its client gone: cancelled by the push's Location, never delivered again", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(NOW)
      const harness = yield* makeHarness()
      const client = yield* harness.connect()
      yield* helloed(client)
      yield* client.frame({ messageType: "register", channelID: CHID })
      const uaid = client.of("hello")[0]!["uaid"] as string
      const { notification, direct } = yield* pushMessage(harness, uaid, CHID)
      assert.isTrue(direct)
      yield* pump(client)
      assert.strictEqual(client.of("notification").length, 1)
      yield* TestClock.adjust(1_000)
      // The client leaves without acking: its node saves the message for its next connection.
      yield* client.feed({ _tag: "SocketClosed" })
      assert.isTrue(yield* cancelById(notification.version), "the saved message is found by its id")
      assert.isFalse(yield* cancelById(notification.version))
      const again = yield* harness.connect()
      yield* helloed(again, uaid)
      assert.deepStrictEqual(again.of("notification"), [], "a cancelled message is never delivered")
    }).pipe(Effect.provide(TestParts)))

  it.effect("a cancel never takes another message of the channel stored at the ms its id names", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(NOW)
      const harness = yield* makeHarness()
      const client = yield* harness.connect()
      yield* helloed(client)
      yield* client.frame({ messageType: "register", channelID: CHID })
      const uaid = client.of("hello")[0]!["uaid"] as string
      const { notification: delivered } = yield* pushMessage(harness, uaid, CHID)
      // Another endpoint node stores a message of this channel at that same ms under its own id.
      const storage = yield* Storage
      const table = (yield* storage.getUser(uaid))!.currentMonth!
      const crypto = yield* EndpointCrypto
      const otherId = yield* crypto.makeMessageId({ kind: "timestamp", uaid, channelId: CHID, sortkeyTimestamp: delivered.sortkeyTimestamp! })
      assert.strictEqual(yield* storage.saveMessage(uaid, table, { ...delivered, version: otherId }), "stored")
      yield* client.feed({ _tag: "SocketClosed" })
      assert.isTrue(yield* cancelById(delivered.version))
      const again = yield* harness.connect()
      yield* helloed(again, uaid)
      assert.deepStrictEqual(again.of("notification").map((f) => f["version"]), [otherId], "the other message is still delivered")
    }).pipe(Effect.provide(TestParts)))
})
