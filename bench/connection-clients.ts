/**
 * Clients for `bench:connections`, run as a child process:
 * `node connection-clients.ts PORT COUNT LOCAL_ADDRESS [register]`. Opens COUNT WebSockets from
 * LOCAL_ADDRESS (or from several, comma-separated, in turn) to the server, sends hello on each (and with `register`, then registers one channel
 * on each), and reports `{ identified, registered, failed }` once every one was answered. Holds them
 * open until the parent disconnects.
 *
 * Then, on `{ cmd: "resume", port, localAddress }` (the server was restarted: these sockets are
 * closed), opens COUNT new ones from `localAddress`, each saying hello with the uaid it was given
 * (and its channel), as a browser does when it comes back, and reports
 * `{ resumed, changed, failed }`: answered with the same uaid, with another one, not answered.
 */
import WebSocket from "ws"

const [port, count, localAddresses] = [Number(process.argv[2]), Number(process.argv[3]), (process.argv[4] ?? "127.0.0.1").split(",")]
/** Client i's source address: LOCAL_ADDRESS may be several, comma-separated, taken in turn. */
const addressOf = (addresses: ReadonlyArray<string>, i: number) => addresses[i % addresses.length] as string
const REGISTER = process.argv[5] === "register"
/** With BENCH_BROADCASTS=1 every client follows a broadcast, as Firefox follows Remote Settings'. */
const BROADCASTS = process.env["BENCH_BROADCASTS"] === "1" ? { broadcasts: { "remote-settings/monitor_changes": "\"1600000000000\"" } } : {}
const HELLO = JSON.stringify({ messageType: "hello", use_webpush: true, ...BROADCASTS })
/** Handshakes in flight at once. */
const IN_FLIGHT = 200

/** Each client: its socket, and what the server gave it. */
interface Client {
  ws: WebSocket
  uaid?: string | undefined
  channelID?: string
}
const clients: Array<Client> = []

/**
 * Runs `open(i)` for 0..count-1, at most IN_FLIGHT unanswered at once; `open` calls `done(ok)` once
 * the client is answered (or failed). Resolves with the number of each outcome.
 */
const each = (open: (i: number, done: (outcome: string) => void) => void): Promise<Record<string, number>> =>
  new Promise((resolve) => {
    const outcomes: Record<string, number> = {}
    let next = 0
    let finished = 0
    const one = () => {
      if (next >= count) return
      const i = next++
      let answered = false
      open(i, (outcome) => {
        if (answered) return
        answered = true
        outcomes[outcome] = (outcomes[outcome] ?? 0) + 1
        if (++finished === count) resolve(outcomes)
        one()
      })
    }
    if (count === 0) resolve(outcomes)
    for (let i = 0; i < IN_FLIGHT; i++) one()
  })

const first = await each((i, done) => {
  const ws = new WebSocket(`ws://127.0.0.1:${port}/`, { localAddress: addressOf(localAddresses, i), perMessageDeflate: false })
  const client: Client = { ws }
  clients[i] = client
  ws.once("open", () => ws.send(HELLO))
  ws.on("message", (data) => {
    const m = JSON.parse(data.toString()) as { messageType?: string; uaid?: string; status?: number }
    if (m.messageType === "hello") {
      client.uaid = m.uaid
      if (!REGISTER) return done("identified")
      client.channelID = crypto.randomUUID()
      ws.send(JSON.stringify({ messageType: "register", channelID: client.channelID }))
    } else if (m.messageType === "register") {
      done(m.status === 200 ? "registered" : "failed")
    }
  })
  ws.once("error", () => done("failed"))
  ws.once("close", () => done("failed"))
})
const registered = first["registered"] ?? 0
process.send?.({ identified: (first["identified"] ?? 0) + registered, registered, failed: first["failed"] ?? 0 })

process.on("message", (m: { cmd?: string; port?: number; localAddress?: string }) => {
  if (m.cmd !== "resume") return
  const started = Date.now()
  void each((i, done) => {
    const client = clients[i]
    if (client?.uaid === undefined) return done("failed")
    const ws = new WebSocket(`ws://127.0.0.1:${m.port}/`, { localAddress: addressOf((m.localAddress ?? "127.0.0.1").split(","), i), perMessageDeflate: false })
    client.ws = ws
    ws.once("open", () =>
      ws.send(JSON.stringify({
        messageType: "hello",
        uaid: client.uaid,
        use_webpush: true,
        ...(client.channelID === undefined ? {} : { channelIDs: [client.channelID] }),
        ...BROADCASTS
      })))
    ws.on("message", (data) => {
      const reply = JSON.parse(data.toString()) as { messageType?: string; uaid?: string; status?: number }
      if (reply.messageType === "hello") done(reply.status === 200 && reply.uaid === client.uaid ? "resumed" : "changed")
    })
    ws.once("error", () => done("failed"))
    ws.once("close", () => done("failed"))
  }).then((outcomes) =>
    process.send?.({ resumed: outcomes["resumed"] ?? 0, changed: outcomes["changed"] ?? 0, failed: outcomes["failed"] ?? 0, seconds: (Date.now() - started) / 1000 })
  )
})
process.on("disconnect", () => process.exit(0))
