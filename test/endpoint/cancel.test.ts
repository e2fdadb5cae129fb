/** `DELETE /m/{message_id}`: cancel a stored message. */
import { assert, describe, layer } from "@effect/vitest"
import { Effect, Result } from "effect"
import { TEST_CRYPTO_KEY, TEST_ENDPOINT_URL } from "../../src/crypto/endpoint.ts"
import { encrypt, parseFernetKey } from "../../src/crypto/fernet.ts"
import { MORE_INFO } from "../../src/domain/errors.ts"
import { fakeNode, messagesOf, push, request, subscribe, TestEndpoint, withStorageFaults } from "./harness.ts"

const pathOf = (location: string | string[] | undefined) => String(location).slice(TEST_ENDPOINT_URL.length)

const invalidId = { code: 400, errno: null, error: "Bad Request", message: "Invalid message ID", more_info: MORE_INFO }

describe("DELETE /m/{message_id}", () => {
  layer(TestEndpoint, { excludeTestServices: true })((it) => {
    it.effect("cancels a stored timestamp message; again is still 204", () =>
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
        assert.strictEqual((yield* request({ method: "DELETE", path })).status, 204)
      }))

    it.effect("cancels a stored topic message", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        const reply = yield* push(sub, { topic: "news" })
        assert.strictEqual((yield* messagesOf(sub)).length, 1)
        assert.strictEqual((yield* request({ method: "DELETE", path: pathOf(reply.headers["location"]) })).status, 204)
        assert.deepStrictEqual(yield* messagesOf(sub), [])
      }))

    it.effect("a directly delivered message: 204, nothing to delete", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe({ nodeId: yield* fakeNode(200) })
        const reply = yield* push(sub)
        assert.strictEqual((yield* request({ method: "DELETE", path: pathOf(reply.headers["location"]) })).status, 204)
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
          ["deleteMessage"],
          request({ method: "DELETE", path: pathOf(posted.headers["location"]) })
        )
        assert.strictEqual(reply.status, 503)
        assert.strictEqual(reply.headers["retry-after"], "120")
        assert.strictEqual(reply.json().errno, 201)
      }))
  })
})
