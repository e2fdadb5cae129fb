/**
 * The console page's WebCrypto code (src/console/static/webpush.js), run in Node's WebCrypto and
 * checked against the libraries applications use: what it encrypts, `http_ece` decrypts; what
 * `web-push` encrypts (aes128gcm and aesgcm), it decrypts; its VAPID header passes the endpoint's
 * own verification.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { createECDH, randomBytes } from "node:crypto"
import ece from "http_ece"
import webpush from "web-push"
import { parseVapid, senderWarnings, verifyVapid } from "../../src/endpoint/vapid.ts"
import { CONSOLE_VAPID_SUBJECT, decryptPush, encryptAes128gcm, makeSubscriberKeys, makeVapidKeys, maxPlaintextBytes, vapidAuthorization } from "../../src/console/static/webpush.js"

const text = "héllo from the console ✓"

describe("console page crypto", () => {
  it.effect("aes128gcm from the page decrypts with http_ece", () =>
    Effect.promise(async () => {
      const ecdh = createECDH("prime256v1")
      ecdh.generateKeys()
      const auth = randomBytes(16)
      const body = await encryptAes128gcm(
        { p256dh: ecdh.getPublicKey().toString("base64url"), auth: auth.toString("base64url") },
        new TextEncoder().encode(text)
      )
      assert.strictEqual(ece.decrypt(Buffer.from(body), { version: "aes128gcm", privateKey: ecdh, authSecret: auth }).toString(), text)
    }))

  it.effect("maxPlaintextBytes: the largest message whose body is within max_data_bytes and one record", () =>
    Effect.promise(async () => {
      const ecdh = createECDH("prime256v1")
      ecdh.generateKeys()
      const keys = { p256dh: ecdh.getPublicKey().toString("base64url"), auth: randomBytes(16).toString("base64url") }
      for (const maxBody of [4096, 2048]) {
        const fits = maxPlaintextBytes(maxBody)
        assert.strictEqual((await encryptAes128gcm(keys, new Uint8Array(fits))).length, maxBody)
        assert.strictEqual((await encryptAes128gcm(keys, new Uint8Array(fits + 1))).length, maxBody + 1)
      }
      // A server taking larger bodies: one 4096-byte record is the limit of the page's encryption.
      assert.strictEqual(maxPlaintextBytes(65_536), 4079)
      await encryptAes128gcm(keys, new Uint8Array(4079))
      const tooLong = await encryptAes128gcm(keys, new Uint8Array(4080)).then(() => undefined, (e: Error) => e.message)
      assert.strictEqual(tooLong, "at most 4079 bytes fit in one record")
    }))

  for (const contentEncoding of ["aes128gcm", "aesgcm"] as const) {
    it.effect(`${contentEncoding} from web-push decrypts in the page; a wrong auth secret fails`, () =>
      Effect.promise(async () => {
        const keys = await makeSubscriberKeys()
        const subscription = { endpoint: "http://localhost:8082/wpush/v1/x", keys: { p256dh: keys.p256dh, auth: keys.authText } }
        const details = webpush.generateRequestDetails(subscription, text, { TTL: 60, contentEncoding })
        const headers = {
          encoding: contentEncoding,
          ...(contentEncoding === "aesgcm" ? { crypto_key: String(details.headers["Crypto-Key"]), encryption: String(details.headers["Encryption"]) } : {})
        }
        const data = details.body!.toString("base64url")
        assert.strictEqual(new TextDecoder().decode(await decryptPush(keys, data, headers)), text)
        const wrong = { ...keys, auth: randomBytes(16) }
        const failed = await decryptPush(wrong, data, headers).then(() => false, () => true)
        assert.isTrue(failed)
      }))
  }

  it.effect("the page's VAPID header passes the endpoint's verification for the endpoint's origin, its contact with no sender warning", () =>
    Effect.gen(function*() {
      const vapid = yield* Effect.promise(() => makeVapidKeys())
      const header = yield* Effect.promise(() => vapidAuthorization(vapid, "http://localhost:8082/wpush/v1/abc", CONSOLE_VAPID_SUBJECT))
      const credentials = yield* Effect.fromResult(parseVapid({ authorization: header }))
      assert.isDefined(credentials)
      const verified = yield* verifyVapid(credentials!, "http://localhost:8082", Math.floor(Date.now() / 1000))
      assert.strictEqual(verified.rawKey.toString("base64url"), vapid.publicKey)
      assert.strictEqual(verified.claims.aud, "http://localhost:8082")
      // The console on a laptop (localhost) signs its own pushes: this server warns of nothing in them.
      assert.deepStrictEqual(senderWarnings(verified, "aes128gcm"), [])
      const elsewhere = yield* Effect.flip(verifyVapid(credentials!, "http://localhost:9999", Math.floor(Date.now() / 1000)))
      assert.strictEqual(elsewhere.message, "Invalid VAPID audience")
    }))
})
