/**
 * Clients of `bench:storm --workers W`, a child process (`node storm-clients.ts`): one share of the
 * storm's clients (a process here cannot open more than 20,000 files). Commands over IPC:
 *
 * - `{ cmd: "seed", wsUrl, first, count, inflight }`: clients first..first+count-1 each say hello,
 *   register one channel and go away; answers `{ users: [{ uaid, endpoint }] }`;
 * - `{ cmd: "prepare", wsUrl, first, uaids, inflight, timeoutMs }` answers `{ prepared: true }`; then
 *   `{ cmd: "go" }`: all of them reconnect at once (at most `inflight` handshakes of this process in
 *   flight), say hello with their uaid, wait for their stored message and ack it. Answers
 *   `{ storm: { times, failed, hellos, lastHelloAt, doneAt } }` (times in ms from connecting to the
 *   message; instants in ms since the epoch, to be compared across processes);
 * - `{ cmd: "share", endpoints, sample }`: two pushes, one after the other, to each of `sample` of the
 *   clients that got their message (still connected), each waiting for its frame; answers
 *   `{ share: [messageIds of the first pushes, of the second] }`.
 *
 * Client i connects from the same source address as in the single-process storm (`connect`, storm-node.ts).
 */
import { randomBytes } from "node:crypto"
import { connect, pool, pushFromClients as push, resume, type Session, subscribe } from "./storm-node.ts"

const seed = async (wsUrl: string, first: number, count: number, inflight: number) => {
  const users: Array<{ uaid: string; endpoint: string }> = []
  await pool(count, inflight, async (n) => {
    const s = await connect(wsUrl, first + n)
    users[n] = await subscribe(s)
    s.ws.close()
  })
  return users
}

/** The sessions that got their message, by client index in this process. */
const resumed: Array<Session | undefined> = []

const storm = async (wsUrl: string, first: number, uaids: ReadonlyArray<string>, inflight: number, timeoutMs: number) => {
  const times: Array<number> = []
  let failed = 0
  let hellos = 0
  let lastHelloAt = 0
  await pool(uaids.length, inflight, async (n) => {
    const t0 = performance.now()
    try {
      const s = await connect(wsUrl, first + n)
      await resume(s, uaids[n] as string, timeoutMs, () => {
        hellos++
        lastHelloAt = Date.now()
      })
      times.push(performance.now() - t0)
      resumed[n] = s
    } catch {
      failed++
    }
  })
  return { times, failed, hellos, lastHelloAt, doneAt: Date.now() }
}

const share = async (endpoints: ReadonlyArray<string>, sample: number) => {
  const got = resumed.flatMap((s, n) => (s === undefined ? [] : [n]))
  const picked = got.filter((_, k) => k % Math.max(1, Math.floor(got.length / sample)) === 0).slice(0, sample)
  const ids: [Array<string>, Array<string>] = [[], []]
  await pool(picked.length, 8, async (k) => {
    const n = picked[k] as number
    const session = resumed[n] as Session
    for (const sent of ids) {
      const arrived = new Promise<void>((resolve) => session.ws.once("message", () => resolve()))
      const messageId = await push(endpoints[n] as string, randomBytes(128))
      if (messageId !== undefined) sent.push(messageId)
      await Promise.race([arrived, new Promise((r) => setTimeout(r, 5_000))])
    }
  })
  return ids
}

let prepared: (() => Promise<void>) | undefined
process.on("message", (m: Record<string, unknown>) => {
  const reply = (message: unknown) => process.send?.(message)
  const fail = (error: unknown) => reply({ error: String(error) })
  switch (m["cmd"]) {
    case "seed":
      seed(m["wsUrl"] as string, m["first"] as number, m["count"] as number, m["inflight"] as number).then((users) => reply({ users }), fail)
      break
    case "prepare":
      prepared = async () => {
        reply({ storm: await storm(m["wsUrl"] as string, m["first"] as number, m["uaids"] as Array<string>, m["inflight"] as number, m["timeoutMs"] as number) })
      }
      reply({ prepared: true })
      break
    case "go":
      prepared?.().catch(fail)
      break
    case "share":
      share(m["endpoints"] as Array<string>, m["sample"] as number).then((ids) => reply({ share: ids }), fail)
      break
  }
})
process.on("disconnect", () => process.exit(0))
