/** The notify request's parts as pure functions: parsing, the message and its shrinking, urgency, our endpoints' form. */
import { assert, describe, it } from "@effect/vitest"
import {
  isRefusal,
  MAX_DEVICES,
  MAX_NESTING,
  messageOf,
  type Notify,
  type NotifyRefusal,
  type PushEndpoint,
  parseNotify,
  pushEndpointOf,
  urgencyOf
} from "../../src/gateway/matrixRequest.ts"

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

  const refusal = (text: string): NotifyRefusal | undefined => {
    const parsed = parseNotify(Buffer.from(text))
    return isRefusal(parsed) ? parsed : undefined
  }

  it(`refuses more than ${MAX_DEVICES} devices with 413 M_TOO_LARGE, and takes ${MAX_DEVICES}`, () => {
    const devices = (n: number) => JSON.stringify({ notification: { devices: Array.from({ length: n }, (_, i) => ({ app_id: "a", pushkey: `k${i}` })) } })
    assert.isUndefined(refusal(devices(MAX_DEVICES)))
    assert.deepStrictEqual(refusal(devices(MAX_DEVICES + 1)), {
      status: 413,
      errcode: "M_TOO_LARGE",
      error: `A notification may name at most ${MAX_DEVICES} devices, not ${MAX_DEVICES + 1}`
    })
  })

  it(`refuses nesting deeper than ${MAX_NESTING} levels with 400 M_BAD_JSON (brackets inside strings do not count)`, () => {
    const nested = (depth: number) => `{"notification":{"devices":[],"content":{"x":${"[".repeat(depth - 3)}${"]".repeat(depth - 3)}}}}`
    assert.isUndefined(refusal(nested(MAX_NESTING)))
    assert.strictEqual(refusal(nested(MAX_NESTING + 1))?.errcode, "M_BAD_JSON")
    assert.isUndefined(refusal(JSON.stringify({ notification: { devices: [], content: { body: "[{\\\"[".repeat(5_000) } } })))
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

  /** The message as it was first made: the whole notification written out again after each field dropped. */
  const reference = (notify: Notify, maxBytes: number): Buffer | undefined => {
    const fields: Record<string, unknown> = { ...notify.notification, prio: notify.prio }
    const known = new Set(["event_id", "room_id", "counts", "prio", "content", "room_alias", "room_name", "sender_display_name", "sender", "type", "user_is_target"])
    const order = ["content", ...Object.keys(fields).filter((key) => !known.has(key)), "room_alias", "room_name", "sender_display_name", "sender", "type", "user_is_target"]
    for (const key of [undefined, ...order]) {
      if (key !== undefined) delete fields[key]
      const bytes = Buffer.from(JSON.stringify({ notification: fields }))
      if (bytes.length <= maxBytes) return bytes
    }
    return undefined
  }

  it("is byte for byte the message of writing it all out again after each field dropped (generated notifications)", () => {
    let seed = 0x9e3779b9
    const random = (n: number) => {
      seed = (seed * 1_103_515_245 + 12_345) >>> 0
      return (seed >>> 8) % n
    }
    const text = () => ["x", "é", "😀", "\"", "\u0000", "\ud800"][random(6)]!.repeat(random(400))
    const names = ["event_id", "room_id", "counts", "content", "room_alias", "room_name", "sender_display_name", "sender", "type", "user_is_target", "prio", "x", "1", "__proto__", "zz"]
    for (let round = 0; round < 300; round++) {
      const notification: Record<string, unknown> = {}
      for (const name of names) {
        if (random(3) === 0) continue
        notification[name] = name === "counts" || name === "content" ? { body: text(), n: [random(9), { t: text() }] }
          : name === "user_is_target" ? random(2) === 0
          : name === "prio" ? ["low", "high", "other"][random(3)]
          : text()
      }
      const parsed = parse({ notification: { ...notification, devices: [] } })
      const maxBytes = 60 + random(2_000)
      assert.deepStrictEqual(messageOf(parsed, maxBytes), reference(parsed, maxBytes), `round ${round}`)
    }
  })

  it("a 64 KiB notification of thousands of small fields is made in one pass (well within a second)", () => {
    const fields = Array.from({ length: 7_000 }, (_, i) => `"f${i}":1`).join(",")
    const body = Buffer.from(`{"notification":{"devices":[],"event_id":"$e",${fields}}}`)
    assert.isAtLeast(body.length, 60_000)
    const started = performance.now()
    const parsed = parseNotify(body)
    if (isRefusal(parsed)) throw new Error(parsed.error)
    const message = messageOf(parsed, 4096)
    const elapsed = performance.now() - started
    assert.isAtMost(message?.length ?? 0, 4096)
    assert.isBelow(elapsed, 1_000)
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

describe("pushEndpointOf", () => {
  const endpoint = (version: "v1" | "v2" | undefined, token: string): PushEndpoint => ({ _tag: "PushEndpoint", version, token })

  it("takes /wpush/{version}/{token} and /wpush/{token} on any http(s) origin and path prefix, query and fragment aside", () => {
    const base = "https://push.example.com"
    assert.deepStrictEqual(pushEndpointOf(`${base}/wpush/v1/gAAAA_tok-en=`), endpoint("v1", "gAAAA_tok-en="))
    assert.deepStrictEqual(pushEndpointOf(`${base}/wpush/v2/abc`), endpoint("v2", "abc"))
    assert.deepStrictEqual(pushEndpointOf(`${base}/wpush/abc`), endpoint(undefined, "abc"))
    for (
      const pushkey of [
        "HTTPS://PUSH.example.com:443/wpush/v1/abc",
        "http://push.example.com/wpush/v1/abc",
        "http://127.0.0.1:8082/wpush/v1/abc",
        "https://push.example.com:8443/wpush/v1/abc",
        "https://elsewhere.example.org/wpush/v1/abc",
        "https://user:pass@push.example.com/wpush/v1/abc",
        "https://example.com/push/wpush/v1/abc",
        `${base}/x/../wpush/v1/abc`,
        `${base}/wpush/v1/abc?x=1`,
        `${base}/wpush/v1/abc?`,
        `${base}/wpush/v1/abc#f`
      ]
    ) assert.deepStrictEqual(pushEndpointOf(pushkey), endpoint("v1", "abc"), pushkey)
  })

  it("refuses what is not an http(s) URL, or whose path is not a push endpoint's, saying why", () => {
    const base = "https://push.example.com"
    for (const pushkey of ["V2h5IG9uIGVhcnRoIGRpZCB5b3UgZGVjb2RlIHRoaXM/", "", "ftp://push.example.com/wpush/v1/abc", "mailto:me@example.com"]) {
      assert.deepStrictEqual(pushEndpointOf(pushkey), { _tag: "NotPushEndpoint", reason: "not an http(s) URL" }, pushkey)
    }
    for (const pushkey of [`${base}/wpush/v1/a%62c`, `${base}/wpush/v1/abc/`, `${base}/wpush/v1/`, `${base}/wpush/v9/abc`, `${base}/m/abc`, `${base}/wpush`]) {
      assert.deepStrictEqual(pushEndpointOf(pushkey), { _tag: "NotPushEndpoint", reason: "its path is not a push endpoint's (/wpush/v1/{token})" }, pushkey)
    }
  })

  it("reads pushkeys at the size limit built to make a parser backtrack in linear time", () => {
    const started = performance.now()
    for (
      const pushkey of [
        `https://h/${"wpush/".repeat(10_000)}`,
        `https://h/wpush/v1/${"a".repeat(64_000)}/`,
        `https://h/${"x/../".repeat(12_000)}wpush/v1/abc`,
        `https://h/wpush/${"v1/".repeat(20_000)}`,
        `https://${"a.".repeat(30_000)}/wpush/v1/abc`,
        `https://h/${"%41".repeat(20_000)}`
      ]
    ) pushEndpointOf(pushkey)
    assert.isBelow(performance.now() - started, 1_000)
  })
})
