/**
 * Storage goes away under load and comes back (separate node processes; the dynalite process is
 * killed and restarted): the endpoint answers 503 with Retry-After while it cannot store or route,
 * never a 201 for a message that then goes missing; the connection node keeps its clients' sockets;
 * both recover on their own, and every message that got a 201 reaches its client.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { openClient, type TestClient } from "../connection/client.ts"
import { type Deployment, startSeparate } from "./servers.ts"

interface Client {
  readonly ws: TestClient
  readonly endpoint: string
  readonly received: Set<string>
}

const CLIENTS = 10

describe("storage outage under load (separate processes)", () => {
  let deployment: Deployment
  beforeAll(async () => {
    deployment = await startSeparate()
  }, 60_000)
  afterAll(async () => {
    await deployment?.stop()
  })

  it("503 + Retry-After while storage is down, sockets kept, everything that got a 201 delivered after", async () => {
    const clients: Array<Client> = []
    for (let i = 0; i < CLIENTS; i++) {
      const ws = await openClient(deployment.wsUrl)
      ws.send({ messageType: "hello", use_webpush: true })
      await ws.next((f) => f["messageType"] === "hello")
      ws.send({ messageType: "register", channelID: crypto.randomUUID() })
      const reply = await ws.next((f) => f["messageType"] === "register")
      const client: Client = { ws, endpoint: reply["pushEndpoint"] as string, received: new Set() }
      // Ack everything, as Firefox does.
      ws.ws.on("message", (data) => {
        const frame = JSON.parse(data.toString()) as Record<string, unknown>
        if (frame["messageType"] !== "notification") return
        client.received.add(frame["version"] as string)
        ws.send({ messageType: "ack", updates: [{ channelID: frame["channelID"], version: frame["version"], code: 100 }] })
      })
      clients.push(client)
    }
    let closed = 0
    for (const c of clients) void c.ws.closed.then(() => closed++)

    const accepted = new Map<Client, Array<string>>()
    const statuses = new Map<number, number>()
    let retryAfterMissing = 0
    let stop = false
    const load = (async () => {
      for (let i = 0; !stop; i++) {
        const client = clients[i % CLIENTS]!
        try {
          const res = await fetch(client.endpoint, { method: "POST", headers: { ttl: "600" }, signal: AbortSignal.timeout(5_000) })
          statuses.set(res.status, (statuses.get(res.status) ?? 0) + 1)
          if (res.status === 201) {
            const location = res.headers.get("location") as string
            accepted.set(client, [...(accepted.get(client) ?? []), location.slice(location.lastIndexOf("/") + 1)])
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
    await deployment.storageOutage!(3_000)
    const during = statuses.get(503) ?? 0
    await new Promise((r) => setTimeout(r, 3_000))
    stop = true
    await load
    const after = (statuses.get(201) ?? 0) - before

    const seen = Object.fromEntries(statuses)
    expect(before, JSON.stringify(seen)).toBeGreaterThan(0)
    expect(during, `no 503 while storage was down: ${JSON.stringify(seen)}`).toBeGreaterThan(0)
    expect(after, `no recovery: ${JSON.stringify(seen)}`).toBeGreaterThan(0)
    expect(retryAfterMissing).toBe(0)
    expect(Object.keys(seen).map(Number).filter((s) => s !== 201 && s !== 503), JSON.stringify(seen)).toEqual([])
    expect(closed, "the connection node kept its clients' sockets").toBe(0)

    // Every 201 arrives.
    const deadline = Date.now() + 15_000
    const missing = () => [...accepted].flatMap(([c, versions]) => versions.filter((v) => !c.received.has(v)))
    while (missing().length > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100))
    expect(missing(), "accepted but never delivered").toEqual([])
    for (const c of clients) await c.ws.close()
  }, 90_000)
})
