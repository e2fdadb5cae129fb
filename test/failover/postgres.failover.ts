/**
 * A PostgreSQL failover under load, as an operator runs it: a primary with a synchronous
 * streaming-replication standby (Debian's PostgreSQL), two connection and two endpoint nodes (real
 * processes) whose `db_dsn` names the address operators move (here a TCP proxy, standing for a
 * virtual IP or a DNS name), WebSocket clients subscribed, the `web-push` library sending up to 50
 * pushes a second through both endpoint nodes (fewer on a busy machine: each sender waits for its answer). The primary is killed (`pg_ctl stop -m immediate`),
 * the standby promoted at once, the address moved to it 3 s after the kill. Meanwhile pushes are
 * answered 201 or 503 with Retry-After, nothing else; every push answered 201 is delivered exactly
 * once (those of the clients that were away from the promoted standby's rows); no node restarts,
 * no open socket closes; the nodes reach the new primary by themselves.
 */
import ece from "http_ece"
import { createECDH, randomBytes } from "node:crypto"
import pg from "pg"
import webpush from "web-push"
import { describe, expect, it } from "vitest"
import { openClient } from "../connection/client.ts"
import { type Deployment, startOnPostgres } from "../e2e/servers.ts"
import { replicatedPostgres } from "../storage/postgresServer.ts"
import { movableAddress } from "./movableAddress.ts"

/** Push rate of the senders together (per second), how many, and how long they push before the kill, between the kill and the move, after the move (ms). */
const RATE = 50
const SENDERS = 10
const BEFORE_MS = 4_000
const MOVE_AFTER_MS = 3_000
const AFTER_MS = 5_000

const until = async (done: () => boolean | Promise<boolean>, timeoutMs: number) => {
  const deadline = Date.now() + timeoutMs
  while (!(await done()) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100))
}

/** A client that decrypts and acks everything, as Firefox does, counting the payloads it receives (`received`). */
const connect = async (wsUrl: string, keys: { readonly ecdh: ReturnType<typeof createECDH>; readonly auth: Buffer }, uaid?: string) => {
  const ws = await openClient(wsUrl)
  const received = new Map<string, number>()
  ws.ws.on("message", (data) => {
    const frame = JSON.parse(data.toString()) as Record<string, unknown>
    if (frame["messageType"] !== "notification") return
    const body = Buffer.from(frame["data"] as string, "base64url")
    const payload = ece.decrypt(body, { version: "aes128gcm", privateKey: keys.ecdh, authSecret: keys.auth }).toString()
    received.set(payload, (received.get(payload) ?? 0) + 1)
    ws.send({ messageType: "ack", updates: [{ channelID: frame["channelID"], version: frame["version"], code: 100 }] })
  })
  ws.send({ messageType: "hello", use_webpush: true, ...(uaid === undefined ? {} : { uaid }) })
  const hello = await ws.next((f) => f["messageType"] === "hello")
  expect(hello["status"]).toBe(200)
  return { ws, uaid: hello["uaid"] as string, received }
}

const subscribe = async (deployment: Deployment) => {
  const keys = { ecdh: createECDH("prime256v1"), auth: randomBytes(16) }
  keys.ecdh.generateKeys()
  const client = await connect(deployment.wsUrl, keys)
  client.ws.send({ messageType: "register", channelID: crypto.randomUUID() })
  const reply = await client.ws.next((f) => f["messageType"] === "register")
  const subscription = {
    endpoint: reply["pushEndpoint"] as string,
    keys: { p256dh: keys.ecdh.getPublicKey().toString("base64url"), auth: keys.auth.toString("base64url") }
  }
  return { ...client, subscription, keys }
}

/** The endpoint URL as served by `node` (the same push through either endpoint node). */
const through = (endpoint: string, node: Deployment) => {
  const url = new URL(endpoint)
  url.port = new URL(node.endpointUrl).port
  return url.href
}

/** One statement on its own connection. */
const queryOnce = async (dsn: string, sql: string) => {
  const client = new pg.Client({ connectionString: dsn })
  await client.connect()
  try {
    return (await client.query(sql)).rows
  } finally {
    await client.end()
  }
}

describe("PostgreSQL failover under load (synchronous standby promoted, address moved)", () => {
  it("pushes answered 201 or 503 with Retry-After; every 201 delivered exactly once; no node restarted", async () => {
    const { primary, standby } = await replicatedPostgres({ synchronous: true })
    const address = await movableAddress(primary.port)
    const nodes: Array<Deployment> = []
    try {
      // The standby streams and is synchronous before the load starts.
      const replication = () => queryOnce(primary.dsn, "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby'")
      await until(async () => (await replication())[0]?.["sync_state"] === "sync", 20_000)
      expect(await replication()).toEqual([{ sync_state: "sync" }])

      const dsn = new URL(primary.dsn)
      dsn.port = String(address.port)
      const first = await startOnPostgres(dsn.href)
      nodes.push(first)
      const second = await startOnPostgres(dsn.href, { joining: first })
      nodes.push(second)

      const online = await Promise.all(Array.from({ length: 8 }, (_, i) => subscribe(nodes[i % 2]!)))
      const away = await Promise.all(Array.from({ length: 4 }, (_, i) => subscribe(nodes[i % 2]!)))
      for (const c of away) await c.ws.close()
      let socketsClosed = 0
      for (const c of online) void c.ws.closed.then(() => socketsClosed++)
      const everyone = [...online, ...away]

      /** The payload of every push answered 201, by uaid; every answer's status; 503s without Retry-After. */
      const accepted = new Map<string, Array<string>>()
      const statuses = new Map<number, number>()
      let withoutRetryAfter = 0
      const push = async (n: number) => {
        const client = everyone[n % everyone.length]!
        const payload = `push ${n}`
        const details = webpush.generateRequestDetails(client.subscription, payload, { TTL: 600 })
        const headers = Object.fromEntries(Object.entries(details.headers).map(([k, v]) => [k, String(v)]))
        try {
          const res = await fetch(through(details.endpoint, nodes[n % 2]!), {
            method: details.method,
            headers,
            body: details.body as Buffer,
            signal: AbortSignal.timeout(15_000)
          })
          await res.arrayBuffer()
          statuses.set(res.status, (statuses.get(res.status) ?? 0) + 1)
          if (res.status === 201) accepted.set(client.uaid, [...(accepted.get(client.uaid) ?? []), payload])
          if (res.status === 503 && res.headers.get("retry-after") === null) withoutRetryAfter++
        } catch {
          // No answer within 15 s: counted as status 0, which fails below.
          statuses.set(0, (statuses.get(0) ?? 0) + 1)
        }
      }
      // SENDERS senders, each pushing at most RATE / SENDERS times a second and only once it has
      // its previous answer: RATE pushes a second on an idle machine, fewer on a busy one (a load
      // the nodes cannot answer would be refused for the machine's sake, not the failover's).
      let sent = 0
      let stopped = false
      const senders = Promise.all(Array.from({ length: SENDERS }, async () => {
        while (!stopped) {
          const next = Date.now() + (SENDERS * 1_000) / RATE
          await push(sent++)
          await new Promise((r) => setTimeout(r, Math.max(0, next - Date.now())))
        }
      }))
      const stopSenders = () => {
        stopped = true
        return senders
      }
      const accepted201 = () => statuses.get(201) ?? 0
      const refused = () => statuses.get(503) ?? 0
      try {
        await new Promise((r) => setTimeout(r, BEFORE_MS))
        const beforeKill = accepted201()
        const sentBeforeKill = sent
        const refusedBeforeKill = refused()
        const killedAt = Date.now()
        await primary.kill()
        await standby.promote()
        await new Promise((r) => setTimeout(r, Math.max(0, killedAt + MOVE_AFTER_MS - Date.now())))
        address.moveTo(standby.port)
        const atMove = accepted201()
        const sentBeforeMove = sent
        const refusedBeforeMove = refused()
        await new Promise((r) => setTimeout(r, AFTER_MS))
        await stopSenders()
        const seen = JSON.stringify(Object.fromEntries(statuses))
        console.log(
          `failover: ${sent} pushes (${sentBeforeKill} before the kill, ${sentBeforeMove - sentBeforeKill} until the move), statuses ${seen}, ` +
            `201 before the kill ${beforeKill}, between the kill and the move ${atMove - beforeKill}, after the move ${accepted201() - atMove}; ` +
            `503 before the kill ${refusedBeforeKill}, between the kill and the move ${refusedBeforeMove - refusedBeforeKill}, after the move ${refused() - refusedBeforeMove}`
        )

        expect(beforeKill, seen).toBeGreaterThan(0)
        expect(refused(), `no 503 while the primary was gone: ${seen}`).toBeGreaterThan(0)
        expect(accepted201() - atMove, `no 201 after the move: ${seen}`).toBeGreaterThan(0)
        expect([...statuses.keys()].filter((s) => s !== 201 && s !== 503), seen).toEqual([])
        expect(withoutRetryAfter, "503s without Retry-After").toBe(0)
      } finally {
        await stopSenders()
      }
      expect(nodes.flatMap((n) => n.output.filter((line) => line.includes(" exited: "))), "a node process exited").toEqual([])
      expect(socketsClosed, "open sockets closed").toBe(0)
      // Every node's pool is on the new primary, reached through the moved address.
      const onNewPrimary = await queryOnce(standby.dsn, "SELECT count(DISTINCT client_port) AS n FROM pg_stat_activity WHERE application_name = 'autopush'")
      expect(Number(onNewPrimary[0]?.["n"])).toBeGreaterThan(0)

      // The clients that were away come back: what was stored for them is read from the promoted standby.
      const back = await Promise.all(away.map((c) => connect(nodes[0]!.wsUrl, c.keys, c.uaid)))
      expect(back.map((c) => c.uaid)).toEqual(away.map((c) => c.uaid))
      const receivers = new Map([...online, ...back].map((c) => [c.uaid, c]))
      const missing = () => [...accepted].flatMap(([uaid, payloads]) => payloads.filter((p) => !receivers.get(uaid)!.received.has(p)))
      await until(() => missing().length === 0, 20_000)
      expect(missing(), "answered 201, never delivered").toEqual([])
      const twice = [...receivers.values()].flatMap((c) => [...c.received].filter(([, times]) => times > 1))
      expect(twice, "delivered more than once").toEqual([])
      for (const c of receivers.values()) await c.ws.close()
    } finally {
      for (const node of nodes.reverse()) await node.stop()
      await address.close()
      standby.remove()
      primary.remove()
    }
  }, 110_000)
})
