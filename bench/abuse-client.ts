/**
 * The abusers of `bench:abuse`, each run as its own child process so that its work does not share
 * the measuring process's event loop. `argv`: kind, then the kind's arguments; it sends `"ready"`
 * once the abuse is under way, and on the message `"stop"` (or a disconnect) stops, closes
 * everything, reports `{ note }` (what it did and what the server answered) and exits.
 *
 *   silent   <host:port> <count> <localAddress>   hold `count` TCP connections that send nothing;
 *                                                 one the server closes after holding it is
 *                                                 opened again at once, one it closes within 1 s
 *                                                 (a refusal: 503 beyond max_connections_per_address)
 *                                                 1 s later. Counted: of the first `count`, how
 *                                                 many were held (still open 1 s after connecting)
 *                                                 and how many closed at once (of them, answered
 *                                                 503); over the whole run, the same, the answers
 *                                                 (408, 503) and the most held at once
 *   ping     <wsUrl>                              one WebSocket says hello, then sends `{}` as fast
 *                                                 as its socket takes them; reconnects when closed
 *   garbage  <wsUrl>                              the same with random non-JSON text frames
 *   receipts <endpointUrl> <count> <localAddress> POST /receipts, then `count` GETs of it with
 *                                                 Accept: text/event-stream, held open; a refused or
 *                                                 ended one is asked again 500 ms later
 */
import { randomBytes } from "node:crypto"
import { request } from "node:http"
import { connect, type Socket } from "node:net"
import WebSocket from "ws"

const [kind = "", target = "", countArg = "0", localAddress = "127.0.0.2"] = process.argv.slice(2)
const count = Number(countArg)
let stopping = false
const closers = new Set<() => void>()
const counts: Record<string, number> = {}
const bump = (key: string, by = 1) => {
  counts[key] = (counts[key] ?? 0) + by
}
let ready = false
const markReady = () => {
  if (!ready) {
    ready = true
    process.send?.("ready")
  }
}

// ── silent TCP connections ───────────────────────────────────────────────────────────────────────

/** A silent connection still open this long after connecting is held; one closed before, closed at once. */
const HELD_MS = 1_000

const silent = () => {
  const [host = "127.0.0.1", port = "0"] = target.split(":")
  const first = `first ${count}`
  // In this order in the note: the first wave's fate, then the whole run's.
  for (const key of [`${first} held`, `${first} closed at once`, `${first} answered 503`]) counts[key] = 0
  let held = 0
  let settled = 0
  // One of the first `count` is held or closed: once all are, the abuse is under way.
  const settle = (inFirst: boolean, outcome: string) => {
    if (!inFirst) return
    bump(`${first} ${outcome}`)
    if (++settled >= count) markReady()
  }
  const openOne = (inFirst: boolean) => {
    if (stopping) return
    const socket: Socket = connect({ host, port: Number(port), localAddress })
    const close = () => socket.destroy()
    closers.add(close)
    bump("opened")
    let isHeld = false
    let answered503 = false
    let holding: NodeJS.Timeout | undefined
    socket.on("connect", () => {
      holding = setTimeout(() => {
        isHeld = true
        held++
        counts["held at most"] = Math.max(counts["held at most"] ?? 0, held)
        settle(inFirst, "held")
      }, HELD_MS)
    })
    socket.on("data", (chunk) => {
      // A 408 (request timeout) or 503 (too many connections) before the close.
      const status = /^HTTP\/1\.1 (\d{3})/.exec(chunk.toString("latin1"))?.[1]
      if (status === undefined) return
      bump(`answered ${status}`)
      if (status === "503") answered503 = true
    })
    socket.on("error", () => bump("errors"))
    socket.on("close", () => {
      closers.delete(close)
      clearTimeout(holding)
      if (isHeld) held--
      if (stopping) return
      if (isHeld) {
        bump("closed after being held")
        setImmediate(() => openOne(false))
        return
      }
      bump("closed at once")
      settle(inFirst, "closed at once")
      if (inFirst && answered503) bump(`${first} answered 503`)
      // Refused: asked again a little later, as a 503 invites, not in a tight loop.
      setTimeout(() => openOne(false), HELD_MS)
    })
  }
  // At most 200 connects in flight while the first `count` are opened.
  let started = 0
  const ramp = () => {
    const batch = Math.min(200, count - started)
    for (let i = 0; i < batch; i++) openOne(true)
    started += batch
    if (started < count) setTimeout(ramp, 5)
  }
  ramp()
}

// ── frame floods on one WebSocket ────────────────────────────────────────────────────────────────

const flood = (frame: () => string) => {
  const connectOnce = () => {
    if (stopping) return
    const ws = new WebSocket(target, "push-notification", { perMessageDeflate: false })
    const close = () => ws.terminate()
    closers.add(close)
    bump("connections")
    let flooding = false
    const pump = () => {
      // Closed by the server: its close frame came while we were still writing; go at once.
      if (ws.readyState === WebSocket.CLOSING) ws.terminate()
      if (stopping || ws.readyState !== WebSocket.OPEN) return
      // Write while the socket takes them: the server stops reading when its inbox for us is full.
      let n = 0
      while (ws.bufferedAmount < 1 << 20 && n < 2_000) {
        ws.send(frame())
        n++
      }
      bump("frames sent", n)
      if (ws.bufferedAmount >= 1 << 20) setTimeout(pump, 5)
      else setImmediate(pump)
    }
    ws.on("open", () => ws.send(JSON.stringify({ messageType: "hello", use_webpush: true })))
    ws.on("message", () => {
      if (flooding) return
      flooding = true
      markReady()
      pump()
    })
    ws.on("error", () => bump("errors"))
    ws.on("close", (code) => {
      closers.delete(close)
      if (stopping) return
      bump(`closed ${code}`)
      setTimeout(connectOnce, 10)
    })
  }
  connectOnce()
}

// ── receipt collectors ───────────────────────────────────────────────────────────────────────────

const receipts = async () => {
  const base = new URL(target)
  const created = await new Promise<string>((resolve, reject) => {
    const req = request(new URL("/receipts", base), { method: "POST", localAddress, agent: false }, (res) => {
      res.resume()
      const location = res.headers.location
      if (res.statusCode !== 201 || location === undefined) reject(new Error(`POST /receipts answered ${res.statusCode}`))
      else resolve(location)
    })
    req.on("error", reject)
    req.end()
  })
  const path = new URL(created).pathname
  let held = 0
  const getOne = () => {
    if (stopping) return
    bump("GETs")
    const req = request(
      { host: base.hostname, port: base.port, path, localAddress, agent: false, headers: { Accept: "text/event-stream" } },
      (res) => {
        bump(`answered ${res.statusCode}`)
        if (res.statusCode === 200) {
          held++
          counts["held at most"] = Math.max(counts["held at most"] ?? 0, held)
          res.once("close", () => held--)
        }
        res.resume()
        res.once("close", () => {
          closers.delete(close)
          if (!stopping) setTimeout(getOne, 500)
        })
      }
    )
    const close = () => req.destroy()
    closers.add(close)
    req.on("error", () => bump("errors"))
    req.end()
  }
  for (let i = 0; i < count; i++) getOne()
  setTimeout(markReady, 500)
}

// ── stop ─────────────────────────────────────────────────────────────────────────────────────────

const stop = () => {
  if (stopping) return
  stopping = true
  for (const close of closers) close()
  const note = Object.entries(counts).map(([k, v]) => `${k}: ${v}`).join(", ")
  process.send?.({ note }, () => process.exit(0))
  setTimeout(() => process.exit(0), 1_000).unref()
}
process.on("message", (message) => {
  if (message === "stop") stop()
})
process.on("disconnect", () => {
  stopping = true
  process.exit(0)
})

switch (kind) {
  case "silent":
    silent()
    break
  case "ping":
    flood(() => "{}")
    break
  case "garbage":
    flood(() => randomBytes(48).toString("latin1"))
    break
  case "receipts":
    receipts().catch((error: unknown) => {
      console.error(String(error))
      process.exit(1)
    })
    break
  default:
    console.error(`unknown abuse: ${kind}`)
    process.exit(2)
}
