/** The notify request's parts as pure functions: parsing, the message and its shrinking, urgency, our endpoints. */
import { assert, describe, it } from "@effect/vitest"
import { isRefusal, messageOf, type Notify, ownEndpointOf, parseNotify, urgencyOf } from "../../src/gateway/matrixRequest.ts"

const parse = (json: unknown): Notify => {
  const parsed = parseNotify(Buffer.from(JSON.stringify(json)))
  if (isRefusal(parsed)) throw new Error(parsed.error)
  return parsed
}

describe("parseNotify", () => {
  it("splits the devices off, keeps the rest in order, reads event_id and prio", () => {
    const notify = parse({ notification: { event_id: "$e", devices: [{ app_id: "a", pushkey: "k", data: { x: 1 } }], room_id: "!r", prio: "low", id: "" } })
    assert.deepStrictEqual(notify.devices, [{ appId: "a", pushkey: "k" }])
    assert.deepStrictEqual(Object.keys(notify.notification), ["event_id", "room_id", "prio", "id"])
    assert.strictEqual(notify.eventId, "$e")
    assert.strictEqual(notify.prio, "low")
    assert.strictEqual(parse({ notification: { devices: [], prio: "whatever" } }).prio, "high")
    assert.isUndefined(parse({ notification: { devices: [] } }).eventId)
  })

  it("refuses what is not JSON (M_NOT_JSON) and JSON of another shape (M_BAD_JSON)", () => {
    const errcode = (text: string) => {
      const parsed = parseNotify(Buffer.from(text))
      return isRefusal(parsed) ? parsed.errcode : "ok"
    }
    assert.strictEqual(errcode("{"), "M_NOT_JSON")
    assert.strictEqual(errcode(""), "M_NOT_JSON")
    for (const json of ["null", "[]", "{}", "{\"notification\":[]}", "{\"notification\":{\"devices\":null}}", "{\"notification\":{\"devices\":[null]}}", "{\"notification\":{\"devices\":[{\"app_id\":\"a\",\"pushkey\":1}]}}", "{\"notification\":{\"devices\":[],\"counts\":3}}", "{\"notification\":{\"devices\":[],\"prio\":1}}", "{\"notification\":{\"devices\":[],\"content\":\"x\"}}"]) {
      assert.strictEqual(errcode(json), "M_BAD_JSON", json)
    }
  })
})

describe("messageOf", () => {
  const notify = parse({
    notification: {
      event_id: "$e",
      room_id: "!r",
      counts: { unread: 1 },
      content: { body: "c".repeat(300) },
      unknown_field: "u".repeat(100),
      room_alias: "#a",
      room_name: "n".repeat(100),
      sender: "@s",
      devices: [{ app_id: "a", pushkey: "k" }]
    }
  })
  const keys = (bytes: Buffer | undefined) => Object.keys(JSON.parse(bytes?.toString() ?? "null").notification)

  it("is the notification without devices, with prio, when it fits", () => {
    const bytes = messageOf(notify, 4096)
    assert.deepStrictEqual(keys(bytes), ["event_id", "room_id", "counts", "content", "unknown_field", "room_alias", "room_name", "sender", "prio"])
  })

  it("drops content, then fields the spec does not name, then the optional fields in order, until it fits", () => {
    const fields = JSON.parse(messageOf(notify, 4096)!.toString()).notification as Record<string, unknown>
    /** The message's size with only `kept` of its fields. */
    const size = (kept: ReadonlyArray<string>) =>
      Buffer.byteLength(JSON.stringify({ notification: Object.fromEntries(Object.entries(fields).filter(([key]) => kept.includes(key))) }))
    const steps = [
      ["event_id", "room_id", "counts", "unknown_field", "room_alias", "room_name", "sender", "prio"],
      ["event_id", "room_id", "counts", "room_alias", "room_name", "sender", "prio"],
      ["event_id", "room_id", "counts", "room_name", "sender", "prio"],
      ["event_id", "room_id", "counts", "sender", "prio"],
      ["event_id", "room_id", "counts", "prio"]
    ]
    // At exactly a step's size that step is the message; one byte less, the next one.
    steps.forEach((kept, i) => {
      assert.deepStrictEqual(keys(messageOf(notify, size(kept))), kept)
      const less = messageOf(notify, size(kept) - 1)
      if (i + 1 < steps.length) assert.deepStrictEqual(keys(less), steps[i + 1])
      else assert.isUndefined(less)
    })
  })

  it("counts UTF-8 bytes", () => {
    const emoji = parse({ notification: { event_id: "$e", content: { body: "😀".repeat(1100) }, devices: [] } })
    const bytes = messageOf(emoji, 4096)!
    assert.isAtMost(bytes.length, 4096)
    assert.deepStrictEqual(keys(bytes), ["event_id", "prio"])
  })
})

describe("urgencyOf", () => {
  it("low → low, high → high", () => {
    assert.strictEqual(urgencyOf("low"), "low")
    assert.strictEqual(urgencyOf("high"), "high")
  })
})

describe("ownEndpointOf", () => {
  it("takes /wpush/{version}/{token} and /wpush/{token} under the endpoint URL, and nothing else", () => {
    const base = "https://push.example.com"
    assert.deepStrictEqual(ownEndpointOf(base)(`${base}/wpush/v1/gAAAA_tok-en=`), { version: "v1", token: "gAAAA_tok-en=" })
    assert.deepStrictEqual(ownEndpointOf(`${base}/`)(`${base}/wpush/v2/abc`), { version: "v2", token: "abc" })
    assert.deepStrictEqual(ownEndpointOf(base)(`${base}/wpush/abc`), { version: undefined, token: "abc" })
    assert.deepStrictEqual(ownEndpointOf(base)("HTTPS://PUSH.example.com:443/wpush/v1/abc"), { version: "v1", token: "abc" })
    assert.deepStrictEqual(ownEndpointOf("https://example.com/push")("https://example.com/push/wpush/v1/abc"), { version: "v1", token: "abc" })
    for (
      const pushkey of [
        "http://push.example.com/wpush/v1/abc",
        "https://push.example.com:8443/wpush/v1/abc",
        "https://evil.example.com/wpush/v1/abc",
        "https://push.example.com.evil.example/wpush/v1/abc",
        "https://user@push.example.com/wpush/v1/abc",
        `${base}/wpush/v1/abc?x=1`,
        `${base}/wpush/v1/abc#f`,
        `${base}/wpush/v1/a%62c`,
        `${base}/wpush/v1/abc/`,
        `${base}/wpush/v1/`,
        `${base}/m/abc`,
        `${base}/other/wpush/v1/abc`,
        "V2h5IG9uIGVhcnRoIGRpZCB5b3UgZGVjb2RlIHRoaXM/",
        ""
      ]
    ) assert.isUndefined(ownEndpointOf(base)(pushkey), pushkey)
    assert.isUndefined(ownEndpointOf("https://example.com/push")("https://example.com/wpush/v1/abc"))
  })
})
