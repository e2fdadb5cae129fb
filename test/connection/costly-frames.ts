/**
 * The most expensive WebSocket frames of each command that fit in one message (`max_message_size`):
 * many keys, deep nesting, long runs of one character, unicode, many channel ids in a hello, many
 * broadcasts, many acks in one frame. Shared by the adversarial tests and `bench:abuse`, with the way
 * both time a frame: on a connection of its own, the frame and then a `{}` ping; the server handles
 * a client's frames in order, so the ping's answer comes once the frame was handled.
 */
import { randomUUID } from "node:crypto"
import { openClient } from "./client.ts"

export interface CostlyFrame {
  /** The command it is (its `messageType`). */
  readonly command: string
  readonly name: string
  readonly text: string
}

/** `head`, then `unit(i)` for i = 0, 1, … joined by `separator` as long as it fits in `bytes`, then `tail`. */
const fill = (bytes: number, head: string, unit: (i: number) => string, tail: string, separator = ""): string => {
  const parts: Array<string> = []
  let size = Buffer.byteLength(head) + Buffer.byteLength(tail)
  for (let i = 0;; i++) {
    const part = unit(i)
    const more = Buffer.byteLength(part) + (i === 0 ? 0 : separator.length)
    if (size + more > bytes) break
    parts.push(part)
    size += more
  }
  return head + parts.join(separator) + tail
}

/** A JSON string of `char` repeated (then `last`) to fill what is left of `bytes` around `head` and `tail`. */
const run = (bytes: number, head: string, char: string, tail: string, last = ""): string =>
  fill(bytes - Buffer.byteLength(last), `${head}"`, () => char, `${last}"${tail}`)

/** `levels` of nesting (`open` … `close`, as many as fit), as the value of an ignored field. */
const nested = (bytes: number, head: string, open: string, inner: string, close: string, tail: string): string => {
  const levels = Math.floor((bytes - head.length - inner.length - tail.length) / (open.length + close.length))
  return `${head}${open.repeat(levels)}${inner}${close.repeat(levels)}${tail}`
}

/**
 * The frames, each at most `bytes` long. `broadcastIds`: ids the node has (a hello or subscribe
 * naming them makes the node look each up and remember it).
 */
export const costlyFrames = (bytes: number, broadcastIds: ReadonlyArray<string> = []): ReadonlyArray<CostlyFrame> => {
  const broadcast = (i: number) => `"${broadcastIds[i] ?? `b${i}`}":"v0"`
  const hello = `{"messageType":"hello","use_webpush":true`
  const uuid = randomUUID()
  const register = `{"messageType":"register","channelID":"${uuid}"`
  return [
    { command: "hello", name: "many channelIDs", text: fill(bytes, `${hello},"channelIDs":[`, () => `"${randomUUID()}"`, "]}", ",") },
    { command: "hello", name: "many broadcasts", text: fill(bytes, `${hello},"broadcasts":{`, broadcast, "}}", ",") },
    { command: "hello", name: "uaid: one character repeated", text: run(bytes, `${hello},"uaid":`, "0", "}") },
    { command: "hello", name: "uaid: unicode repeated", text: run(bytes, `${hello},"uaid":`, "\u{1F600}", "}") },
    { command: "hello", name: "deep nesting", text: nested(bytes, `${hello},"x":`, "[", "", "]", "}") },
    { command: "hello", name: "many keys", text: fill(bytes, hello, (i) => `,"k${i}":0`, "}") },
    { command: "register", name: "key: '=' repeated", text: run(bytes, `${register},"key":`, "=", "}", "A") },
    { command: "register", name: "key: unicode repeated", text: run(bytes, `${register},"key":`, "\u00e9", "}") },
    { command: "register", name: "channelID: one character repeated", text: run(bytes, `{"messageType":"register","channelID":`, "a", "}") },
    { command: "register", name: "many keys", text: fill(bytes, register, (i) => `,"k${i}":0`, "}") },
    { command: "unregister", name: "channelID: '-' repeated", text: run(bytes, `{"messageType":"unregister","channelID":`, "-", "}") },
    { command: "unregister", name: "channelID: unicode repeated", text: run(bytes, `{"messageType":"unregister","channelID":`, "\u4e00", "}") },
    {
      command: "ack",
      name: "many updates",
      text: fill(bytes, `{"messageType":"ack","updates":[`, (i) => `{"channelID":"${uuid}","version":"v${i}","code":100}`, "]}", ",")
    },
    { command: "ack", name: "version: one character repeated", text: run(bytes, `{"messageType":"ack","updates":[{"channelID":"${uuid}","version":`, "A", "}]}") },
    { command: "ack", name: "deep nesting", text: nested(bytes, `{"messageType":"ack","updates":[],"x":`, `{"a":`, "1", "}", "}") },
    { command: "nack", name: "version: one character repeated", text: run(bytes, `{"messageType":"nack","code":301,"version":`, "A", "}") },
    { command: "ping", name: "many keys", text: fill(bytes, `{"messageType":"ping"`, (i) => `,"k${i}":0`, "}") },
    { command: "ping", name: "escapes repeated", text: run(bytes, `{"messageType":"ping","x":`, "\\\\", "}") },
    { command: "broadcast_subscribe", name: "many broadcasts", text: fill(bytes, `{"messageType":"broadcast_subscribe","broadcasts":{`, broadcast, "}}", ",") },
    { command: "broadcast_subscribe", name: "id: one character repeated", text: run(bytes, `{"messageType":"broadcast_subscribe","broadcasts":{`, "/", `:"v0"}}`) },
    { command: "urgency", name: "min: one character repeated", text: run(bytes, `{"messageType":"urgency","min":`, "w", "}") }
  ]
}

export interface Timed {
  /** From the frame's sending to the answer of the ping that follows it (ms). */
  readonly ms: number
  /** The close the server sent instead, if it closed. */
  readonly close: { readonly code: number; readonly reason: string } | undefined
  /** What the server answered to the frame itself (before the ping's `{}`). */
  readonly replies: ReadonlyArray<Record<string, unknown>>
}

/**
 * Time one frame on a connection of its own (after a hello, unless the frame is one), as described
 * above. `timeoutMs`: how long to wait for the answer at most (then it fails).
 */
export const timeFrame = async (wsUrl: string, frame: CostlyFrame, timeoutMs = 30_000): Promise<Timed> => {
  const client = await openClient(wsUrl)
  try {
    if (frame.command !== "hello") {
      client.send({ messageType: "hello", use_webpush: true })
      await client.next((f) => f["messageType"] === "hello", timeoutMs)
    }
    const before = client.received.length
    const started = performance.now()
    client.ws.send(frame.text)
    client.send("{}")
    const answered = client.next((f) => Object.keys(f).length === 0, timeoutMs).then(() => undefined)
    const close = await Promise.race([answered, client.closed])
    const ms = performance.now() - started
    const replies = client.received.slice(before).filter((f) => Object.keys(f).length > 0)
    return { ms, close, replies }
  } finally {
    await client.close()
  }
}
