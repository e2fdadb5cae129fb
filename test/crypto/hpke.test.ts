/**
 * The tests' HPKE (test/crypto/hpke.ts) is RFC 9180's: it opens the first ciphertext of the RFC's
 * test vector A.1.1 (DHKEM(X25519, HKDF-SHA256), HKDF-SHA256, AES-128-GCM, base mode), and what it
 * seals opens only for its recipient, unaltered.
 */
import { assert, describe, it } from "@effect/vitest"
import { hpkeRecipient, hpkeSeal } from "./hpke.ts"

const hex = (text: string) => Buffer.from(text, "hex")

describe("the tests' HPKE", () => {
  it("opens RFC 9180 A.1.1's first message", () => {
    const recipient = hpkeRecipient(hex("4612c550263fc8ad58375df3f557aac531d26850903e55a9f23f21d8534e8ac8"))
    assert.strictEqual(recipient.publicKey.toString("hex"), "3948cfe0ad1ddb695d780e59077195da6c56506b027329794ab02bca80815c4d")
    const enc = hex("37fda3567bdbd628e88668c3c8d7e97d1d1253b6d4ea6d44c150f741f1bf4431")
    const ciphertext = hex("f938558b5d72f1a23810b4be2ab4f84331acc02fc97babc53a52ae8218a355a96d8770ac83d07bea87e13c512a")
    const info = Buffer.from("Ode on a Grecian Urn")
    const plaintext = recipient.open(Buffer.concat([enc, ciphertext]), info, Buffer.from("Count-0"))
    assert.strictEqual(plaintext.toString(), "Beauty is truth, truth beauty")
  })

  it("a sealed message opens for its recipient with its info, and for no one else or altered", () => {
    const recipient = hpkeRecipient()
    const info = Buffer.from("WebPush: info")
    const message = hpkeSeal(recipient.publicKey, info, Buffer.from("hello"))
    assert.strictEqual(message.length, 32 + 5 + 16)
    assert.strictEqual(recipient.open(message, info).toString(), "hello")
    assert.throws(() => hpkeRecipient().open(message, info))
    assert.throws(() => recipient.open(message, Buffer.from("other info")))
    const altered = Buffer.from(message)
    altered[40] = (altered[40] ?? 0) ^ 1
    assert.throws(() => recipient.open(altered, info))
  })
})
