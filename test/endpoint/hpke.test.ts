/**
 * Pushes encrypted with HPKE (the HPKE Web Push draft): no `Content-Encoding`, `Content-Type:
 * application/webpush-message`. Accepted under the same rules as the others, with 1024 bytes more
 * than `max_data_bytes`, stored with their content type and no encoding, without a sender warning;
 * a body with neither header is refused as before.
 */
import { assert, describe, it, layer } from "@effect/vitest"
import { randomBytes } from "node:crypto"
import { Effect } from "effect"
import * as Result from "effect/Result"
import { encryptionOf, HPKE_CONTENT_TYPE, isHpkeMessage } from "../../src/endpoint/headers.ts"
import { HPKE_EXTRA_BYTES } from "../../src/endpoint/pushRequest.ts"
import { hpkeRecipient, hpkeSeal } from "../crypto/hpke.ts"
import { goodClaims, messagesOf, options, push, subscribe, TestEndpoint, vapidKeys } from "./harness.ts"

const HPKE = { "content-type": HPKE_CONTENT_TYPE }
const INFO = Buffer.from("WebPush: info")

describe("isHpkeMessage", () => {
  it("the media type in any case, with parameters and spaces; never with a Content-Encoding", () => {
    for (const type of [HPKE_CONTENT_TYPE, "Application/WebPush-Message", " application/webpush-message ; v=1"]) {
      assert.isTrue(isHpkeMessage({ "content-type": type }), type)
    }
    for (const type of ["application/octet-stream", "application/webpush-messages", "text/plain; x=application/webpush-message"]) {
      assert.isFalse(isHpkeMessage({ "content-type": type }), type)
    }
    assert.isFalse(isHpkeMessage({}))
    assert.isFalse(isHpkeMessage({ ...HPKE, "content-encoding": "aes128gcm" }))
  })

  it("an HPKE body is kept with its content type only; the encryption headers of the other schemes are not", () => {
    const found = encryptionOf({ ...HPKE, encryption: "salt=abc", "crypto-key": "p256ecdsa=abc" }, true)
    assert.deepStrictEqual(Result.getOrUndefined(found), { content_type: HPKE_CONTENT_TYPE })
    assert.isUndefined(Result.getOrUndefined(encryptionOf(HPKE, false)), "an empty body keeps no headers")
  })
})

describe("HPKE pushes", () => {
  layer(TestEndpoint, { excludeTestServices: true })((it) => {
    it.effect("a real HPKE message is accepted without a warning and stored byte for byte, with its content type and no encoding", () =>
      Effect.gen(function*() {
        const recipient = hpkeRecipient()
        const plaintext = Buffer.from("a message for the HPKE draft")
        const message = hpkeSeal(recipient.publicKey, INFO, plaintext)
        const sub = yield* subscribe()
        const reply = yield* push(sub, HPKE, message)
        assert.strictEqual(reply.status, 201, reply.text)
        assert.isUndefined(reply.headers["autopush-warning"])
        const [stored] = yield* messagesOf(sub)
        assert.deepStrictEqual(stored?.headers, { content_type: HPKE_CONTENT_TYPE })
        const carried = Buffer.from(stored?.data ?? "", "base64url")
        assert.isTrue(carried.equals(message))
        assert.isTrue(recipient.open(carried, INFO).equals(plaintext))
      }))

    it.effect("the same VAPID rules: a v2 endpoint refuses an unsigned HPKE push and takes a signed one", () =>
      Effect.gen(function*() {
        const keys = yield* vapidKeys
        const sub = yield* subscribe({ key: keys.raw })
        const body = randomBytes(200)
        const unsigned = yield* push(sub, HPKE, body)
        assert.deepStrictEqual([unsigned.status, unsigned.json().errno], [401, 109])
        const jwt = yield* Effect.promise(() => keys.sign(goodClaims()))
        const signed = yield* push(sub, { ...HPKE, authorization: `vapid t=${jwt}, k=${keys.publicKey}` }, body)
        assert.strictEqual(signed.status, 201, signed.text)
        assert.isUndefined(signed.headers["autopush-warning"])
      }))

    it.effect(`an HPKE body may be ${HPKE_EXTRA_BYTES} bytes longer than max_data_bytes; the other schemes may not`, () =>
      Effect.gen(function*() {
        const largest = options.maxDataBytes + HPKE_EXTRA_BYTES
        const sub = yield* subscribe()
        const fits = yield* push(sub, HPKE, randomBytes(largest))
        assert.strictEqual(fits.status, 201, fits.text)
        const over = yield* push(sub, HPKE, randomBytes(largest + 1))
        assert.deepStrictEqual([over.status, over.json().errno, over.json().message], [413, 104, `Data payload must be smaller than ${largest} bytes`])
        const aes128gcm = yield* push(sub, { ...HPKE, "content-encoding": "aes128gcm" }, randomBytes(options.maxDataBytes + 1))
        assert.deepStrictEqual([aes128gcm.status, aes128gcm.json().message], [413, `Data payload must be smaller than ${options.maxDataBytes} bytes`])
      }))

    it.effect("a body with neither Content-Encoding nor the HPKE content type is refused as before", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        for (const headers of [{}, { "content-type": "application/octet-stream" }]) {
          const reply = yield* push(sub, headers, randomBytes(100))
          assert.deepStrictEqual([reply.status, reply.json().errno, reply.json().message], [400, 110, "Missing Content-Encoding header"])
        }
        assert.deepStrictEqual(yield* messagesOf(sub), [])
      }))

    it.effect("with a Content-Encoding the content type changes nothing: the encoding's rules apply", () =>
      Effect.gen(function*() {
        const sub = yield* subscribe()
        const reply = yield* push(sub, { ...HPKE, "content-encoding": "aesgcm" }, randomBytes(100))
        assert.deepStrictEqual([reply.status, reply.json().message], [400, "Missing Encryption header"])
      }))
  })
})
