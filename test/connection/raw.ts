/**
 * Raw sockets for tests that must control every byte: an HTTP exchange over plain TCP (so malformed
 * requests really go out), a WebSocket handshake on a raw socket, client frames of any shape
 * (masked or not, fragments, reserved bits and opcodes) and a reader of the server's frames.
 */
import { connect as tcpConnect, type Socket } from "node:net"

/**
 * A raw HTTP exchange: what the server answered, and whether it closed the connection, within `ms`
 * (or as soon as `settled` says the answer is complete).
 */
export const rawHttp = (
  port: number,
  head: string | Buffer,
  body: Buffer | string = "",
  ms = 3_000,
  settled?: (received: Buffer) => boolean
) =>
  new Promise<{ readonly text: string; readonly bytes: Buffer; readonly closed: boolean }>((resolve) => {
    const socket = tcpConnect(port, "127.0.0.1")
    const chunks: Array<Buffer> = []
    let closed = false
    let done = false
    const finish = () => {
      if (done) return
      done = true
      clearTimeout(timer)
      const bytes = Buffer.concat(chunks)
      resolve({ text: bytes.toString(), bytes, closed })
      socket.destroy()
    }
    socket.on("data", (d: Buffer) => {
      chunks.push(d)
      if (settled?.(Buffer.concat(chunks))) finish()
    })
    socket.on("close", () => {
      closed = true
      finish()
    })
    socket.on("error", () => {})
    socket.write(head)
    if (body.length > 0) socket.write(body)
    const timer = setTimeout(finish, ms)
  })

/** A WebSocket handshake on a raw socket (so the test controls every frame, and whether it reads). */
export const rawWebSocket = (port: number) =>
  new Promise<{ readonly socket: Socket; readonly received: () => Buffer }>((resolve, reject) => {
    const socket = tcpConnect(port, "127.0.0.1", () =>
      socket.write(
        "GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
          "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
      ))
    // Chunks are kept as they come and joined when read: a non-reading client may get megabytes at once.
    let chunks: Array<Buffer> = []
    let upgraded = false
    const received = () => {
      if (chunks.length > 1) chunks = [Buffer.concat(chunks)]
      return chunks[0] ?? Buffer.alloc(0)
    }
    socket.on("data", (chunk: Buffer) => {
      chunks.push(chunk)
      if (upgraded) return
      const data = received()
      if (data.includes("\r\n\r\n")) {
        upgraded = true
        chunks = [data.subarray(data.indexOf("\r\n\r\n") + 4)]
        resolve({ socket, received })
      }
    })
    socket.on("error", reject)
  })

export interface FrameShape {
  readonly opcode: number
  readonly payload?: Buffer | undefined
  /** FIN bit (default true); false for all but the last fragment. */
  readonly fin?: boolean | undefined
  /** The three reserved bits, as a number 0–7 (default 0). */
  readonly rsv?: number | undefined
  /** Clients must mask (default true). */
  readonly masked?: boolean | undefined
  /** Announce this payload length instead of the real one (e.g. 2^40). */
  readonly declaredLength?: number | undefined
  /** Use the 64-bit length form even for a short payload (a non-minimal encoding). */
  readonly longLength?: boolean | undefined
}

/** A client frame of any shape, by default a well-formed masked final frame. */
export const wsFrame = (shape: FrameShape): Buffer => {
  const payload = shape.payload ?? Buffer.alloc(0)
  const length = shape.declaredLength ?? payload.length
  const maskBit = shape.masked === false ? 0 : 0x80
  const first = Buffer.from([((shape.fin ?? true) ? 0x80 : 0) | ((shape.rsv ?? 0) << 4) | (shape.opcode & 0x0f)])
  let lengthBytes: Buffer
  if (shape.longLength === true || length > 0xffff) {
    lengthBytes = Buffer.alloc(9)
    lengthBytes[0] = maskBit | 127
    lengthBytes.writeBigUInt64BE(BigInt(length), 1)
  } else if (length >= 126) {
    lengthBytes = Buffer.from([maskBit | 126, length >> 8, length & 0xff])
  } else {
    lengthBytes = Buffer.from([maskBit | length])
  }
  if (maskBit === 0) return Buffer.concat([first, lengthBytes, payload])
  const mask = Buffer.from([1, 2, 3, 4])
  const masked = Buffer.from(payload.map((b, i) => b ^ (mask[i % 4] as number)))
  return Buffer.concat([first, lengthBytes, mask, masked])
}

/** A masked final client frame. */
export const frame = (opcode: number, payload: Buffer = Buffer.alloc(0)): Buffer => wsFrame({ opcode, payload })

/** Server frames in a byte stream: opcode and payload (an incomplete last frame is left out). */
export const frames = (data: Buffer): Array<{ readonly opcode: number; readonly payload: Buffer }> => {
  const out: Array<{ opcode: number; payload: Buffer }> = []
  let at = 0
  while (at + 2 <= data.length) {
    let length = (data[at + 1] as number) & 0x7f
    let start = at + 2
    if (length === 126) {
      if (at + 4 > data.length) break
      length = data.readUInt16BE(at + 2)
      start = at + 4
    } else if (length === 127) {
      if (at + 10 > data.length) break
      length = Number(data.readBigUInt64BE(at + 2))
      start = at + 10
    }
    if (start + length > data.length) break
    out.push({ opcode: (data[at] as number) & 0x0f, payload: data.subarray(start, start + length) })
    at = start + length
  }
  return out
}

/** The server's close frame in a byte stream, if any: its code and reason. */
export const closeOf = (data: Buffer) => {
  const close = frames(data).find((f) => f.opcode === 8)
  if (close === undefined) return undefined
  return close.payload.length < 2
    ? { code: 1005, reason: "" }
    : { code: close.payload.readUInt16BE(0), reason: close.payload.subarray(2).toString() }
}
