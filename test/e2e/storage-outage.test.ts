/**
 * Storage goes away under load and comes back (separate node processes; the dynalite process is
 * killed and restarted): the endpoint answers 503 with Retry-After while it cannot store or route —
 * pushes to clients that are offline — and keeps delivering to connected clients whose channel it
 * knows (that needs no storage), never a 201 for a message that then goes missing; the connection
 * node keeps its clients' sockets; both recover on their own, and every message that got a 201
 * reaches its client (the offline ones when they connect again: hellos are closed until the
 * storage breaker's next probe finds the store back, and the clients say hello again).
 */
import { describe, expect, it } from "vitest"
import { openClient, type TestClient } from "../connection/client.ts"
import { deploymentFor, startSeparate } from "./servers.ts"

interface Client {
  readonly ws: TestClient
  readonly uaid: string
  readonly endpoint: string
  readonly received: Set<string>
}

const CLIENTS = 10
const OFFLINE = 4

/** A client that acks everything, as Firefox does, keeping the versions it received. */
const connect = async (wsUrl: string, uaid?: string): Promise<Omit<Client, "endpoint">> => {
  const ws = await openClient(wsUrl)
  const received = new Set<string>()
  ws.ws.on("message", (data) => {
    const frame = JSON.parse(data.toString()) as Record<string, unknown>
    if (frame["messageType"] !== "notification") return
    received.add(frame["version"] as string)
    ws.send({ messageType: "ack", updates: [{ channelID: frame["channelID"], version: frame["version"], code: 100 }] })
  })
  ws.send({ messageType: "hello", use_webpush: true, ...(uaid === undefined ? {} : { uaid }) })
  const hello = await ws.next((f) => f["messageType"] === "hello")
  return { ws, uaid: hello["uaid"] as string, received }
}

/**
 * A client coming back as Firefox does: after a hello closed (storage may still be refusing: the
 * storage breaker lets one probe through per back-off), it says hello again, until one is answered.
 */
const reconnect = async (wsUrl: string, uaid: string): Promise<Omit<Client, "endpoint">> => {
  const deadline = Date.now() + 40_000
  for (;;) {
    try {
      return await connect(wsUrl, uaid)
    } catch (error) {
      if (Date.now() > deadline) throw error
      await new Promise((r) => setTimeout(r, 500))
    }
  }
}

describe("storage outage under load (separate processes)", () => {
  const deployment = deploymentFor(() => startSeparate())

  it("503 + Retry-After while storage is down, sockets kept, everything that got a 201 delivered after", async () => {
    const subscribe = async (): Promise<Client> => {
      const client = await connect(deployment().wsUrl)
      client.ws.send({ messageType: "register", channelID: crypto.randomUUID() })
      const reply = await client.ws.next((f) => f["messageType"] === "register")
      return { ...client, endpoint: reply["pushEndpoint"] as string }
    }
    const clients: Array<Client> = []
    for (let i = 0; i < CLIENTS; i++) clients.push(await subscribe())
    const offline: Array<Client> = []
    for (let i = 0; i < OFFLINE; i++) {
      const client = await subscribe()
      await client.ws.close()
      offline.push(client)
    }
    let closed = 0
    for (const c of clients) void c.ws.closed.then(() => closed++)

    const accepted = new Map<Client, Array<string>>()
    const statuses = new Map<number, number>()
    let retryAfterMissing = 0
    let connectedDuringOutage = 0
    let outage = false
    let stop = false
    const everyone = [...clients, ...offline]
    const load = (async () => {
      for (let i = 0; !stop; i++) {
        const client = everyone[i % everyone.length]!
        try {
          const res = await fetch(client.endpoint, { method: "POST", headers: { ttl: "600" }, signal: AbortSignal.timeout(5_000) })
          statuses.set(res.status, (statuses.get(res.status) ?? 0) + 1)
          if (res.status === 201) {
            const location = res.headers.get("location") as string
            accepted.set(client, [...(accepted.get(client) ?? []), location.slice(location.lastIndexOf("/") + 1)])
            if (outage && !offline.includes(client)) connectedDuringOutage++
          } else if (res.status === 503) {
            const body = (await res.json()) as { errno: number }
            expect(body.errno).toBe(201)
            if (res.headers.get("retry-after") === null) retryAfterMissing++
          } else {
            await res.text()
          }
        } catch {
          statuses.set(0, (statuses.get(0) ?? 0) + 1)
        }
        await new Promise((r) => setTimeout(r, 10))
      }
    })()

    await new Promise((r) => setTimeout(r, 1_000))
    const before = statuses.get(201) ?? 0
    outage = true
    await deployment().storageOutage!(3_000)
    outage = false
    const during = statuses.get(503) ?? 0
    await new Promise((r) => setTimeout(r, 3_000))
    stop = true
    await load
    const after = (statuses.get(201) ?? 0) - before

    const seen = Object.fromEntries(statuses)
    expect(before, JSON.stringify(seen)).toBeGreaterThan(0)
    expect(during, `no 503 while storage was down: ${JSON.stringify(seen)}`).toBeGreaterThan(0)
    expect(connectedDuringOutage, "connected clients kept getting their pushes").toBeGreaterThan(0)
    expect(after, `no recovery: ${JSON.stringify(seen)}`).toBeGreaterThan(0)
    expect(retryAfterMissing).toBe(0)
    expect(Object.keys(seen).map(Number).filter((s) => s !== 201 && s !== 503), JSON.stringify(seen)).toEqual([])
    expect(closed, "the connection node kept its clients' sockets").toBe(0)

    // Every 201 arrives: the offline clients' ones when they connect again.
    for (const [i, client] of offline.entries()) {
      const again = await reconnect(deployment().wsUrl, client.uaid)
      expect(again.uaid).toBe(client.uaid)
      offline[i] = { ...client, ws: again.ws, received: again.received }
      accepted.set(offline[i]!, accepted.get(client) ?? [])
      accepted.delete(client)
    }
    const deadline = Date.now() + 15_000
    const missing = () => [...accepted].flatMap(([c, versions]) => versions.filter((v) => !c.received.has(v)))
    while (missing().length > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100))
    expect(missing(), "accepted but never delivered").toEqual([])
    for (const c of [...clients, ...offline]) await c.ws.close()
  }, 150_000)
})
