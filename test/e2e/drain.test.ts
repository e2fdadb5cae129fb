/**
 * Graceful drain under load: clients that never ack, pushes flowing, SIGTERM to the connection node
 * in the middle. Every push the endpoint accepted (201) must reach its client after the node is back.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { openClient, type TestClient } from "../connection/client.ts"
import { type Deployment, deploymentFor, startAllInOne, startSeparate } from "./servers.ts"

const CLIENTS = 40
const PUSHES = 400

interface Sub {
  readonly uaid: string
  readonly endpoint: string
  client: TestClient
}

const subscribe = async (deployment: Deployment): Promise<Sub> => {
  const client = await openClient(deployment.wsUrl)
  client.send({ messageType: "hello", use_webpush: true })
  const uaid = (await client.next((f) => f["messageType"] === "hello"))["uaid"] as string
  client.send({ messageType: "register", channelID: crypto.randomUUID() })
  const endpoint = (await client.next((f) => f["messageType"] === "register"))["pushEndpoint"] as string
  return { uaid, endpoint, client }
}

/** A push whose body names it; the server relays bodies without decrypting them. */
const push = async (endpoint: string, id: number): Promise<number> => {
  try {
    const res = await fetch(endpoint, {
      method: "POST",
      headers: { TTL: "3600", "Content-Encoding": "aes128gcm" },
      body: `push-${id}`
    })
    await res.arrayBuffer()
    return res.status
  } catch {
    return 0 // refused: not accepted, the sender would retry
  }
}

const drainScenario = (name: string, start: () => Promise<Deployment>) =>
  describe(name, () => {
    const deployment = deploymentFor(start)

    it.live("SIGTERM under load loses nothing; clients are closed with 1001", () =>
      Effect.tryPromise({
        try: async () => {
          const subs: Array<Sub> = []
          for (let i = 0; i < CLIENTS; i++) subs.push(await subscribe(deployment()))
          const closes = subs.map((s) => s.client.closed)
          const accepted = new Map<string, string>() // push id → uaid
          let next = 0
          const sender = async () => {
            while (next < PUSHES) {
              const id = next++
              const sub = subs[id % CLIENTS]!
              if ((await push(sub.endpoint, id)) === 201) accepted.set(`push-${id}`, sub.uaid)
            }
          }
          const load = Promise.all(Array.from({ length: 8 }, sender))
          while (next < PUSHES / 3) await new Promise((r) => setTimeout(r, 5))
          const stopping = Date.now()
          // Pushes keep coming while the node drains and while it is down.
          await deployment().restartConnection(async () => {
            const codes = await Promise.all(closes)
            assert.isTrue(codes.every((c) => c.code === 1001), `close codes ${JSON.stringify([...new Set(codes.map((c) => c.code))])}`)
            assert.isBelow(Date.now() - stopping, 15_000)
          })
          await load
          // The all-in-one refuses pushes while it is down; the split endpoint stores them.
          assert.isAtLeast(accepted.size, PUSHES / 4)

          // Everyone comes back and acks everything until nothing more arrives.
          const got = new Map<string, Set<string>>()
          await Promise.all(subs.map(async (sub) => {
            const client = await openClient(deployment().wsUrl)
            client.send({ messageType: "hello", uaid: sub.uaid, use_webpush: true })
            assert.strictEqual((await client.next((f) => f["messageType"] === "hello"))["uaid"], sub.uaid)
            // Nothing was acked before the restart: every accepted push must come (again) now.
            const ids = new Set<string>()
            for (;;) {
              const frame = await client.next((f) => f["messageType"] === "notification", 1_500).catch(() => undefined)
              if (frame === undefined) break
              ids.add(Buffer.from(frame["data"] as string, "base64url").toString())
              client.send({ messageType: "ack", updates: [{ channelID: frame["channelID"], version: frame["version"] }] })
            }
            got.set(sub.uaid, ids)
            await client.close()
          }))
          const lost = [...accepted].filter(([id, uaid]) => !got.get(uaid)?.has(id))
          assert.deepStrictEqual(lost, [], `${lost.length} of ${accepted.size} accepted pushes were lost`)
        },
        catch: (e) => new Error(`${String(e)}\n--- server output (last 30 lines) ---\n${deployment().output.slice(-30).join("\n")}`)
      }), 120_000)
  })

drainScenario("graceful drain: separate processes (the endpoint stays up)", startSeparate)
drainScenario("graceful drain: all-in-one process", startAllInOne)
