/**
 * Generated WebSocket traffic against the public port of a running node, over raw sockets: every
 * message type with every field of the wrong type, huge, or named like a prototype key; text that
 * is not JSON or not UTF-8; binary frames; ping and pong floods; fragmented messages (well formed
 * or not); bad opcodes, reserved bits, unmasked frames, absurd lengths; close frames of every code.
 *
 * Invariants, per case: everything the server sends is a frame of the protocol (a reply JSON the
 * protocol knows, a pong, a ping), and it ends the socket only with a close frame whose code and
 * reason the README's close table lists (or the echo of the client's own close); the node logs no
 * defect. Afterwards the node still serves hello → register → push → ack.
 */
import { assert, describe, it } from "@effect/vitest"
import { Arbitrary, Effect } from "effect"
import { closeOf, frames, rawWebSocket, wsFrame } from "../connection/raw.ts"
import {
  anyString,
  bool,
  check,
  documented,
  FUZZ_RUNS,
  type FuzzNode,
  int,
  jsonObject,
  KNOWN_UAID,
  normalFlow,
  oneOf,
  pick,
  PROTOTYPE_KEYS,
  startNode,
  Tally,
  unexpectedErrors
} from "./node.ts"

// ── generated frames ─────────────────────────────────────────────────────────────────────────────

const TEXT = 1
const BINARY = 2
const CONTINUATION = 0
const CLOSE = 8
const PING = 9
const PONG = 10

const UUIDS = [
  "eac8e1de-cddf-42d6-9919-a7b0e0f41e59",
  "EAC8E1DE-CDDF-42D6-9919-A7B0E0F41E59",
  "eac8e1decddf42d69919a7b0e0f41e59",
  "00000000-0000-0000-0000-000000000000",
  "eac8e1de-cddf-42d6-9919-a7b0e0f41e5"
] as const

const SHARED_UAID = KNOWN_UAID

/** A base64url P-256 public key (65 bytes, 0x04 first), a short one, and other strings a `key` may be. */
const KEYS = [
  `BA${"A".repeat(85)}`,
  "BAAA",
  "not base64!",
  `B${"_".repeat(86)}`
] as const

const huge = Arbitrary.map(pick([300, 5_000, 20_000, 70_000]), (n) => "x".repeat(n))

/** Any JSON value a field could hold, right type or not. */
const value: Arbitrary.Arbitrary<unknown> = oneOf<unknown>(
  anyString,
  pick(UUIDS),
  pick(KEYS),
  pick([SHARED_UAID, "", " ", "null", "\u0000", "\ud800", "😀".repeat(3)]),
  pick([0, -1, 1, 1.5, 1e308, -1e308, 2 ** 53 + 1, 200, 401]),
  bool,
  pick([null]),
  huge,
  Arbitrary.array(oneOf<unknown>(anyString, pick(UUIDS), int(-5, 5)), { maxLength: 4 }),
  Arbitrary.map(pick(PROTOTYPE_KEYS), (key) => JSON.parse(jsonObject([[key, { polluted: true }]]))),
  Arbitrary.map(int(1, 200), (depth) => JSON.parse("[".repeat(depth) + "]".repeat(depth))),
  Arbitrary.map(pick(UUIDS), (channelID) => [{ channelID, version: "v1" }, { channelID, version: 3 }])
)

const FIELDS: Readonly<Record<string, ReadonlyArray<string>>> = {
  hello: ["uaid", "channelIDs", "broadcasts", "use_webpush"],
  register: ["channelID", "key"],
  unregister: ["channelID", "code"],
  ack: ["updates"],
  nack: ["version", "code"],
  ping: [],
  broadcast_subscribe: ["broadcasts"]
}
const MESSAGE_TYPES = [...Object.keys(FIELDS), "bogus", "HELLO", "__proto__", "constructor", "toString"] as const

/** A JSON message: a messageType (or none, or not a string) and fields of any value. */
const message: Arbitrary.Arbitrary<string> = Arbitrary.flatMap(
  Arbitrary.all([oneOf<unknown>(pick(MESSAGE_TYPES), pick([undefined, null, 7, ["hello"]])), bool]),
  ([messageType, typical]) => {
    const own = typeof messageType === "string" && Object.hasOwn(FIELDS, messageType) ? FIELDS[messageType] ?? [] : []
    const names = [...own, ...(typical ? [] : [...PROTOTYPE_KEYS, "messageType"])]
    const field = Arbitrary.all([oneOf(pick(names.length > 0 ? names : ["x"]), anyString), value])
    return Arbitrary.map(Arbitrary.array(field, { maxLength: 5 }), (fields) =>
      jsonObject([...(messageType === undefined ? [] : [["messageType", messageType] as const]), ...fields]))
  }
)

/** A message of the right shape, with values that are odd but of the right type. */
const wellTyped: Arbitrary.Arbitrary<string> = oneOf<ReadonlyArray<readonly [string, unknown]>>(
  Arbitrary.map(Arbitrary.all([oneOf<unknown>(pick([SHARED_UAID, null, "", "0123456789abcdef"]), anyString), Arbitrary.array(pick(UUIDS), { maxLength: 3 })]), ([uaid, channelIDs]) => [
    ["messageType", "hello"], ["use_webpush", true], ["uaid", uaid], ["channelIDs", channelIDs]
  ]),
  Arbitrary.map(Arbitrary.all([oneOf(pick(UUIDS), anyString), oneOf<unknown>(pick(KEYS), pick([null, ""]))]), ([channelID, key]) => [
    ["messageType", "register"], ["channelID", channelID], ["key", key]
  ]),
  Arbitrary.map(Arbitrary.all([oneOf(pick(UUIDS), anyString), int(-1, 500)]), ([channelID, code]) => [
    ["messageType", "unregister"], ["channelID", channelID], ["code", code]
  ]),
  Arbitrary.map(Arbitrary.array(Arbitrary.all([pick(UUIDS), oneOf(anyString, huge), int(100, 302)]), { maxLength: 3 }), (updates) => [
    ["messageType", "ack"], ["updates", updates.map(([channelID, version, code]) => ({ channelID, version, code }))]
  ]),
  Arbitrary.map(Arbitrary.all([oneOf(anyString, huge), int(0, 302)]), ([version, code]) => [
    ["messageType", "nack"], ["version", version], ["code", code]
  ]),
  Arbitrary.map(Arbitrary.array(Arbitrary.all([oneOf(anyString, pick(PROTOTYPE_KEYS)), anyString]), { maxLength: 3 }), (entries) => [
    ["messageType", "broadcast_subscribe"], ["broadcasts", JSON.parse(jsonObject(entries))]
  ]),
  Arbitrary.map(pick([true]), () => [["messageType", "ping"]])
).pipe(Arbitrary.map(jsonObject))

const INVALID_UTF8 = [[0xff], [0xc0, 0x80], [0xed, 0xa0, 0x80], [0xf4, 0x90, 0x80, 0x80], [0xe2, 0x82], [0x80]] as const

type Step = { readonly label: string; readonly bytes: Buffer; readonly closeCode?: number | undefined }

const text = (s: string) => wsFrame({ opcode: TEXT, payload: Buffer.from(s) })
const times = (n: number, b: Buffer) => Buffer.concat(Array.from({ length: n }, () => b))

const step: Arbitrary.Arbitrary<Step> = oneOf<Step>(
  Arbitrary.map(wellTyped, (m) => ({ label: "typed", bytes: text(m) })),
  Arbitrary.map(wellTyped, (m) => ({ label: "typed", bytes: text(m) })),
  Arbitrary.map(message, (m) => ({ label: "json", bytes: text(m) })),
  Arbitrary.map(oneOf(anyString, pick(["", "{", "[]", "null", "1", "\"x\"", "{\"messageType\":", "{}", "{}{}", "{\"messageType\":\"ping\"}"])), (s) => ({
    label: "text",
    bytes: text(s)
  })),
  Arbitrary.map(Arbitrary.all([pick(INVALID_UTF8), bool]), ([bad, inJson]) => ({
    label: "invalid-utf8",
    bytes: wsFrame({
      opcode: TEXT,
      payload: inJson
        ? Buffer.concat([Buffer.from("{\"messageType\":\"register\",\"channelID\":\""), Buffer.from(bad), Buffer.from("\"}")])
        : Buffer.from(bad)
    })
  })),
  Arbitrary.map(pick([0, 1, 100, 70_000]), (n) => ({ label: "binary", bytes: wsFrame({ opcode: BINARY, payload: Buffer.alloc(n, 7) }) })),
  Arbitrary.map(Arbitrary.all([pick([1, 3, 11, 40]), pick([0, 10, 125])]), ([n, size]) => ({
    label: "pings",
    bytes: times(n, wsFrame({ opcode: PING, payload: Buffer.alloc(size, 1) }))
  })),
  Arbitrary.map(pick([1, 11]), (n) => ({ label: "pongs", bytes: times(n, wsFrame({ opcode: PONG })) })),
  Arbitrary.map(Arbitrary.all([pick([1000, 1001, 1003, 3000, 4999, 999, 1004, 1005, 1006, 1015, 2999, 5000, -1, -2]), pick(["", "bye", "\u00ff"]), bool]), ([code, reason, badUtf8]) => {
    const payload = code === -1 ? Buffer.alloc(0)
      : code === -2 ? Buffer.from([3])
      : Buffer.concat([Buffer.from([code >> 8, code & 0xff]), badUtf8 ? Buffer.from([0xff]) : Buffer.from(reason)])
    return { label: "close", bytes: wsFrame({ opcode: CLOSE, payload }), closeCode: code === -1 ? 1005 : code }
  }),
  Arbitrary.map(Arbitrary.all([message, pick([2, 3, 5]), pick(["whole", "ping-inside", "no-end", "no-start", "text-inside", "binary"] as const)]), ([m, parts, variant]) => {
    const payload = Buffer.from(m)
    const size = Math.ceil(payload.length / parts)
    const chunks = Array.from({ length: parts }, (_, i) => payload.subarray(i * size, (i + 1) * size))
    const out = chunks.map((chunk, i) =>
      wsFrame({ opcode: i === 0 && variant !== "no-start" ? (variant === "binary" ? BINARY : TEXT) : CONTINUATION, payload: chunk, fin: i === parts - 1 && variant !== "no-end" })
    )
    if (variant === "ping-inside") out.splice(1, 0, wsFrame({ opcode: PING, payload: Buffer.from("mid") }))
    if (variant === "text-inside") out.splice(1, 0, text("{}"))
    return { label: `fragments-${variant}`, bytes: Buffer.concat(out) }
  }),
  Arbitrary.map(pick([3, 4, 5, 6, 7, 11, 12, 13, 14, 15]), (opcode) => ({ label: "bad-opcode", bytes: wsFrame({ opcode, payload: Buffer.from("{}") }) })),
  Arbitrary.map(int(1, 7), (rsv) => ({ label: "rsv", bytes: wsFrame({ opcode: TEXT, rsv, payload: Buffer.from("{}") }) })),
  Arbitrary.map(message, (m) => ({ label: "unmasked", bytes: wsFrame({ opcode: TEXT, masked: false, payload: Buffer.from(m) }) })),
  Arbitrary.map(pick([TEXT, PING, CLOSE]), (opcode) => ({ label: "control-fragment-or-huge", bytes: wsFrame({ opcode, fin: opcode === TEXT, payload: Buffer.alloc(opcode === TEXT ? 4 : 126, 0x20), ...(opcode === TEXT ? { declaredLength: 2 ** 40 } : {}) }) })),
  Arbitrary.map(message, (m) => ({ label: "long-length", bytes: wsFrame({ opcode: TEXT, payload: Buffer.from(m), longLength: true }) })),
  Arbitrary.map(pick([65_537, 100_000]), (n) => ({ label: "oversize", bytes: text(`"${"y".repeat(n)}"`) }))
)

const Case = Arbitrary.all({
  /** Whether the case starts with a hello: as a new user, or as the one user all such cases share. */
  hello: pick(["none", "new", "known"] as const),
  steps: Arbitrary.array(step, { minLength: 1, maxLength: 4 })
})
type Case = { readonly hello: "none" | "new" | "known"; readonly steps: ReadonlyArray<Step> }

// ── one case over a raw socket ───────────────────────────────────────────────────────────────────

const KNOWN_REPLIES: ReadonlySet<string> = new Set(["hello", "register", "unregister", "notification", "broadcast"])

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))

/** Run one case; its outcome (`close <code> <reason>`, `echo <code>` or `open`), or why it broke an invariant. */
const runCase = async (node: FuzzNode, docs: ReturnType<typeof documented>, c: Case): Promise<{ outcome: string } | { failure: string }> => {
  const { socket, received } = await rawWebSocket(node.wsPort)
  let ended = false
  socket.on("close", () => (ended = true))
  // A server that closes while the case's bytes are still arriving has unread data: its kernel
  // answers with a reset, and a reset discards what this side had not read yet — the close frame
  // too, when this process was slow to read (a busy machine).
  let reset = false
  socket.on("error", (error: NodeJS.ErrnoException) => void (reset ||= error.code === "ECONNRESET"))
  try {
    if (c.hello !== "none") {
      socket.write(text(JSON.stringify({ messageType: "hello", use_webpush: true, ...(c.hello === "known" ? { uaid: KNOWN_UAID } : {}) })))
      for (let waited = 0; frames(received()).length === 0 && !ended; waited += 10) {
        if (waited > 3_000) return { failure: "no answer to hello" }
        await sleep(10)
      }
    }
    socket.write(Buffer.concat(c.steps.map((s) => s.bytes)))
    // Until the socket ends, or nothing more arrives for a while.
    let seen = -1
    for (let waited = 0; !ended && waited < 5_000; waited += 50) {
      await sleep(50)
      const now = received().length
      if (now === seen && (closeOf(received()) === undefined || waited >= 1_000)) break
      seen = now
    }
    const data = received()
    for (const f of frames(data)) {
      if (f.opcode === PONG || f.opcode === PING || f.opcode === CLOSE) continue
      if (f.opcode !== TEXT) return { failure: `a frame of opcode ${f.opcode} in ${data.subarray(0, 400).toString("hex")}` }
      const body = f.payload.toString()
      if (body === "{}") continue
      let reply: Record<string, unknown>
      try {
        reply = JSON.parse(body) as Record<string, unknown>
      } catch {
        return { failure: `a text frame that is not JSON: ${body.slice(0, 80)}` }
      }
      const type = String(reply["messageType"])
      if (!KNOWN_REPLIES.has(type)) return { failure: `a reply of unknown type: ${body.slice(0, 120)}` }
      if (type === "register" && !docs.registerStatuses.has(reply["status"] as number)) {
        return { failure: `register answered with a status the README does not list: ${body.slice(0, 120)}` }
      }
      if (type === "hello" && reply["status"] !== 200) return { failure: `hello answered ${body.slice(0, 120)}` }
    }
    const close = closeOf(data)
    if (close === undefined) {
      return !ended ? { outcome: "open" } : reset ? { outcome: "reset (unread close frame discarded)" } : { failure: "the server ended the connection without a close frame" }
    }
    if (docs.closes.get(close.code)?.has(close.reason)) return { outcome: `close ${close.code}${close.reason === "" ? "" : ` ${close.reason}`}` }
    if (c.steps.some((s) => s.closeCode === close.code)) return { outcome: `echo ${close.code}` }
    return { failure: `closed ${close.code} ${JSON.stringify(close.reason)}, which the README's close table does not list` }
  } finally {
    socket.destroy()
  }
}

const describeCase = (c: Case) =>
  `${c.hello === "none" ? "" : `after hello (${c.hello} user): `}${c.steps.map((s) => `${s.label} ${s.bytes.subarray(0, 60).toString("hex")}${s.bytes.length > 60 ? `… (${s.bytes.length} bytes)` : ""}`).join(" | ")}`

describe("WebSocket fuzz", () => {
  it.live("generated frames of every kind get a protocol reply or a documented close; the node keeps serving", () =>
    Effect.gen(function*() {
      const node = yield* startNode
      const docs = documented()
      const tally = new Tally()
      yield* check(
        Case,
        (c) =>
          Effect.flatMap(Effect.promise(() => runCase(node, docs, c)), (result) => {
            if ("failure" in result) return Effect.fail(result.failure)
            tally.add("websocket (public port)", [result.outcome])
            return Effect.void
          }),
        FUZZ_RUNS * 2,
        describeCase,
        32
      )
      yield* normalFlow(node)
      assert.deepStrictEqual(unexpectedErrors(node), [])
      for (const line of tally.lines()) console.log(line)
    }).pipe(Effect.scoped), 600_000)
})
