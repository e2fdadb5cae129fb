/**
 * Clients of the rolling restart, a child process (`node clients.ts`): one share of them (a
 * process here may open 20,000 files). Each client behaves as a browser does: a session is a hello
 * (its uaid once it has one), one channel registered in its first session, then a `{}` ping, whose
 * answer makes the session a working one; every notification is acked at once and its data kept;
 * when the socket closes (or cannot be opened), it connects again after a random delay; a session
 * not working within 30 s of its start (the handshake, the hello or the ping unanswered) is given
 * up and counted as failed, and the client connects again. Commands
 * over IPC:
 *
 * - `{ cmd: "open", wsUrl, first, count, inflight, delayMs }`: clients first..first+count-1 connect
 *   (at most `inflight` first sessions at once) and stay connected; answers `{ opened: endpoints }`
 *   once each has a working session;
 * - `{ cmd: "report" }`: answers `{ report }` (`Report`).
 *
 * Client i connects from the same source address as in the storm benches (`connect`).
 */
import { connect, pool } from "../../bench/storm-node.ts"

export interface Report {
  readonly clients: number
  /** Clients whose current session is working (hello answered, ping answered). */
  readonly working: number
  /** For each session after a close: ms from the close to the session working. */
  readonly reconnects: ReadonlyArray<number>
  /** Close codes the clients saw, how many of each. */
  readonly closeCodes: Readonly<Record<string, number>>
  /** Attempts that did not reach a hello's answer (refused, reset). */
  readonly failedAttempts: number
  /** Why they failed (the connection's error, or the close code before the hello's answer), how many. */
  readonly failures: Readonly<Record<string, number>>
  /** Hellos answered with another uaid than the client's. */
  readonly uaidChanged: number
  /** The data of every notification received, as sent (one entry per delivery). */
  readonly received: ReadonlyArray<string>
}

interface Client {
  readonly index: number
  uaid?: string
  endpoint?: string
  working: boolean
  /** When its last session closed, until the next one works. */
  closedAt: number | undefined
}

const clients: Array<Client> = []
const reconnects: Array<number> = []
const closeCodes: Record<string, number> = {}
const received: Array<string> = []
let failedAttempts = 0
const failures: Record<string, number> = {}
const failed = (why: string) => {
  failedAttempts++
  failures[why] = (failures[why] ?? 0) + 1
}
let uaidChanged = 0

/** A session not working this long after it began is given up and tried again, as a browser gives up a hello. */
const SESSION_TIMEOUT_MS = 30_000
const GAVE_UP = `no working session within ${SESSION_TIMEOUT_MS / 1000} s`

const session = (client: Client, wsUrl: string, delayMs: number, onWorking?: () => void): void => {
  const again = () => setTimeout(() => session(client, wsUrl, delayMs, onWorking), Math.random() * delayMs)
  let answered = false
  connect(wsUrl, client.index, SESSION_TIMEOUT_MS).then((s) => {
    const giveUp = setTimeout(() => {
      failed(GAVE_UP)
      // Counted here, not again as a close before the hello's answer.
      answered = true
      s.ws.terminate()
    }, SESSION_TIMEOUT_MS)
    s.ws.on("error", () => {})
    s.ws.once("close", (code) => {
      clearTimeout(giveUp)
      closeCodes[code] = (closeCodes[code] ?? 0) + 1
      if (!answered) failed(`closed ${code} before the hello's answer`)
      client.working = false
      client.closedAt ??= Date.now()
      again()
    })
    s.frames((m) => {
      switch (m["messageType"]) {
        case "hello":
          answered = true
          // A refused hello (a storage error): this session will not work, try again.
          if (m["status"] !== 200) return void s.ws.close()
          if (client.uaid !== undefined && m["uaid"] !== client.uaid) uaidChanged++
          client.uaid = m["uaid"] as string
          // Its channel, until a register was answered (a session may close before).
          if (client.endpoint === undefined) s.ws.send(JSON.stringify({ messageType: "register", channelID: crypto.randomUUID() }))
          else s.ws.send("{}")
          return
        case "register":
          if (m["status"] !== 200) return void s.ws.close()
          client.endpoint = m["pushEndpoint"] as string
          s.ws.send("{}")
          return
        case "notification":
          s.ws.send(JSON.stringify({ messageType: "ack", updates: [{ channelID: m["channelID"], version: m["version"] }] }))
          received.push(Buffer.from(m["data"] as string, "base64url").toString())
          return
        case undefined:
          // The ping's answer.
          clearTimeout(giveUp)
          client.working = true
          if (client.closedAt !== undefined) reconnects.push(Date.now() - client.closedAt)
          client.closedAt = undefined
          onWorking?.()
          onWorking = undefined
          return
      }
    })
    s.ws.send(JSON.stringify({ messageType: "hello", use_webpush: true, ...(client.uaid === undefined ? {} : { uaid: client.uaid }) }))
  }, (error: unknown) => {
    failed(error instanceof Error ? error.message : String(error))
    client.closedAt ??= Date.now()
    again()
  })
}

const open = async (wsUrl: string, first: number, count: number, inflight: number, delayMs: number) => {
  await pool(count, inflight, (n) =>
    new Promise<void>((resolve) => {
      const client: Client = { index: first + n, working: false, closedAt: undefined }
      clients.push(client)
      session(client, wsUrl, delayMs, resolve)
    }))
  return clients.map((c) => c.endpoint as string)
}

const report = (): Report => ({
  clients: clients.length,
  working: clients.filter((c) => c.working).length,
  reconnects,
  closeCodes,
  failedAttempts,
  failures,
  uaidChanged,
  received
})

process.on("message", (m: Record<string, unknown>) => {
  const reply = (message: unknown) => process.send?.(message)
  switch (m["cmd"]) {
    case "open":
      open(m["wsUrl"] as string, m["first"] as number, m["count"] as number, m["inflight"] as number, m["delayMs"] as number).then(
        (opened) => reply({ opened }),
        (error: unknown) => reply({ error: String(error) })
      )
      break
    case "report":
      reply({ report: report() })
      break
  }
})
process.on("disconnect", () => process.exit(0))
