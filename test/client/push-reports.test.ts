/**
 * What `push listen` makes of a notification frame (its report and its ack code), and what `send`
 * takes as a subscription: a frame's payload decrypted, a gateway's plaintext reported as such and
 * acked 100, a payload our keys do not open acked 101; the lines `listen > FILE` saves.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import webpush from "web-push"
import { makeKeys } from "../../src/client/keys.ts"
import { ackCodeOf, openPush, pushReport } from "../../src/client/listen.ts"
import { parseSubscription } from "../../src/client/send.ts"

const keys = makeKeys()
const frame = (fields: Record<string, unknown>) => ({ messageType: "notification", channelID: "5c0b6a4e-8a43-4a0e-9f1e-2f7f3c6c1d10", version: "v", ...fields })
const base64url = (text: string) => Buffer.from(text).toString("base64url")
/** A payload encrypted (aes128gcm) for `to`'s keys, as a sender's web-push makes it: base64url, as in a frame. */
const sealed = (to: typeof keys, text: string) =>
  webpush.generateRequestDetails({ endpoint: "http://localhost:8082/wpush/v1/x", keys: { p256dh: to.p256dh, auth: to.auth } }, text, { TTL: 60, contentEncoding: "aes128gcm" })
    .body!.toString("base64url")

describe("push listen: a notification's report and ack code", () => {
  it("a payload encrypted for our keys is decrypted, acked 100", () => {
    const opened = openPush(keys, frame({ data: sealed(keys, "hello"), headers: { encoding: "aes128gcm" } }))
    assert.deepStrictEqual(opened, { kind: "decrypted", encoding: "aes128gcm", text: "hello" })
    assert.strictEqual(ackCodeOf(opened), 100)
    assert.strictEqual(pushReport(opened), "push received (aes128gcm, 5 chars), acked 100: hello")
  })

  it("data without an encoding (the Matrix gateway's) is plaintext, shown as it came and acked 100", () => {
    const json = '{"notification":{"event_id":"$e","room_id":"!r:example.com"}}'
    // The gateway's frame carries empty headers; a frame without any is read the same way.
    for (const fields of [{ data: base64url(json), headers: {} }, { data: base64url(json) }]) {
      const opened = openPush(keys, frame(fields))
      assert.deepStrictEqual(opened, { kind: "plaintext", text: json })
      assert.strictEqual(ackCodeOf(opened), 100)
      assert.strictEqual(
        pushReport(opened),
        `push received (plaintext, ${json.length} chars: not encrypted, as a push gateway such as Matrix's sends it), acked 100: ${json}`
      )
    }
  })

  it("a payload our keys do not open is acked 101 and says why", () => {
    const other = makeKeys()
    const opened = openPush(keys, frame({ data: sealed(other, "for someone else"), headers: { encoding: "aes128gcm" } }))
    assert.strictEqual(opened.kind, "undecryptable")
    assert.strictEqual(ackCodeOf(opened), 101)
    assert.match(pushReport(opened), /^push received \(aes128gcm\) but not decrypted: .+; acked 101$/)
    const unknown = openPush(keys, frame({ data: base64url("x"), headers: { encoding: "aesgcm128" } }))
    assert.deepStrictEqual([unknown.kind, ackCodeOf(unknown)], ["undecryptable", 101])
    assert.include(pushReport(unknown), 'unsupported encoding "aesgcm128"')
  })

  it("no data is a push without payload, acked 100", () => {
    for (const fields of [{}, { data: "" }]) {
      const opened = openPush(keys, frame(fields))
      assert.deepStrictEqual([opened.kind, ackCodeOf(opened), pushReport(opened)], ["empty", 100, "push received (no payload), acked 100"])
    }
  })
})

describe("push send: the subscription text", () => {
  const subscription = (endpoint: string) => JSON.stringify({ endpoint, keys: { p256dh: keys.p256dh, auth: keys.auth } })

  it.effect("one subscription per line (listen's stdout after it subscribed again): the last line", () =>
    Effect.gen(function*() {
      const saved = `${subscription("http://localhost:8082/wpush/v1/old")}\n${subscription("http://localhost:8082/wpush/v1/new")}\n`
      assert.strictEqual((yield* parseSubscription(saved, "sub.json")).endpoint, "http://localhost:8082/wpush/v1/new")
    }))

  it.effect("pretty-printed JSON is one subscription; text that is not JSON is refused, naming where it came from", () =>
    Effect.gen(function*() {
      const pretty = JSON.stringify(JSON.parse(subscription("http://localhost:8082/wpush/v1/a")), null, 2)
      assert.strictEqual((yield* parseSubscription(pretty, "sub.json")).endpoint, "http://localhost:8082/wpush/v1/a")
      const refused = yield* Effect.flip(parseSubscription("subscribed\nnot json either", "sub.json"))
      assert.strictEqual(refused.message, "the subscription (sub.json) is not JSON")
    }))
})
