/**
 * Clients of `bench:stop`, a child process (`node stop-clients.ts`): one share of the clients (a
 * process here cannot open more than 20,000 files). Commands over IPC:
 *
 * - `{ cmd: "open", wsUrl, first, count, inflight }`: clients first..first+count-1 each connect, say
 *   hello as a new user, register one channel and stay connected; answers `{ opened: n }`;
 * - `{ cmd: "push", inflight, timeoutMs, share }`: one push to each of the first `share` (0–1) of the
 *   open clients through its endpoint, which the client receives and does not ack (the others hold
 *   nothing); answers `{ pushed: { accepted, arrived, messages } }` once
 *   every accepted one has arrived (or `timeoutMs` passed), `messages` being `[uaid, version]` of each
 *   that arrived;
 * - `{ cmd: "closed", timeoutMs }`: answers `{ closed: { codes, open } }` once every socket is closed
 *   (or `timeoutMs` passed): how many closed with each close code, and how many are still open;
 * - `{ cmd: "resume", wsUrl, first, clients: [[index, uaid, version]], timeoutMs }`: each of these
 *   clients comes back (hello with its uaid) and waits for its first notification, not acking it;
 *   answers `{ resumed: { same, other, none } }`: how many got the version they had not acked, another
 *   one, or none in time.
 *
 * Client i connects from the same source address as in the storm (`connect`, storm-node.ts).
 */
import { randomBytes } from "node:crypto"
import { connect, pool, pushFromClients, type Session, subscribe } from "./storm-node.ts"

interface Client {
  readonly session: Session
  readonly uaid: string
  readonly endpoint: string
  /** The version of the notification it received (and did not ack). */
  version?: string
  closeCode?: number
}

const clients: Array<Client> = []
/** Called with a client when its notification arrives. */
let onArrival: ((client: Client) => void) | undefined

const open = async (wsUrl: string, first: number, count: number, inflight: number) => {
  await pool(count, inflight, async (n) => {
    const session = await connect(wsUrl, first + n)
    const { uaid, endpoint } = await subscribe(session)
    const client: Client = { session, uaid, endpoint }
    session.frames((m) => {
      if (m["messageType"] !== "notification") return
      client.version = m["version"] as string
      onArrival?.(client)
    })
    session.ws.once("close", (code) => (client.closeCode = code))
    clients.push(client)
  })
  return clients.length
}

const push = async (inflight: number, timeoutMs: number, share: number) => {
  let accepted = 0
  let arrived = 0
  let allArrived = () => {}
  const done = new Promise<void>((resolve) => (allArrived = resolve))
  let pushing = true
  onArrival = () => {
    arrived++
    if (!pushing && arrived >= accepted) allArrived()
  }
  await pool(Math.round(clients.length * share), inflight, async (n) => {
    if ((await pushFromClients(clients[n]!.endpoint, randomBytes(128))) !== undefined) accepted++
  })
  pushing = false
  if (arrived >= accepted) allArrived()
  await Promise.race([done, new Promise((r) => setTimeout(r, timeoutMs))])
  const messages = clients.flatMap((c) => (c.version === undefined ? [] : [[c.uaid, c.version] as const]))
  return { accepted, arrived, messages }
}

const closed = async (timeoutMs: number) => {
  const deadline = Date.now() + timeoutMs
  while (clients.some((c) => c.closeCode === undefined) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100))
  const codes: Record<string, number> = {}
  for (const c of clients) if (c.closeCode !== undefined) codes[c.closeCode] = (codes[c.closeCode] ?? 0) + 1
  return { codes, open: clients.filter((c) => c.closeCode === undefined).length }
}

const resume = async (wsUrl: string, sample: ReadonlyArray<readonly [number, string, string]>, timeoutMs: number) => {
  const found = { same: 0, other: 0, none: 0 }
  await pool(sample.length, 100, async (k) => {
    const [index, uaid, version] = sample[k]!
    const got = await connect(wsUrl, index).then((session) =>
      new Promise<string | undefined>((resolve) => {
        const timer = setTimeout(() => resolve(undefined), timeoutMs)
        session.ws.once("close", () => resolve(undefined))
        session.frames((m) => {
          if (m["messageType"] !== "notification") return
          clearTimeout(timer)
          resolve(m["version"] as string)
          session.ws.terminate()
        })
        session.ws.send(JSON.stringify({ messageType: "hello", uaid, use_webpush: true }))
      }), () => undefined)
    if (got === version) found.same++
    else if (got === undefined) found.none++
    else found.other++
  })
  return found
}

process.on("message", (m: Record<string, unknown>) => {
  const reply = (message: unknown) => process.send?.(message)
  const fail = (error: unknown) => reply({ error: String(error) })
  switch (m["cmd"]) {
    case "open":
      open(m["wsUrl"] as string, m["first"] as number, m["count"] as number, m["inflight"] as number).then((opened) => reply({ opened }), fail)
      break
    case "push":
      push(m["inflight"] as number, m["timeoutMs"] as number, m["share"] as number).then((pushed) => reply({ pushed }), fail)
      break
    case "closed":
      closed(m["timeoutMs"] as number).then((result) => reply({ closed: result }), fail)
      break
    case "resume":
      resume(m["wsUrl"] as string, m["clients"] as Array<[number, string, string]>, m["timeoutMs"] as number).then((resumed) => reply({ resumed }), fail)
      break
  }
})
process.on("disconnect", () => process.exit(0))
