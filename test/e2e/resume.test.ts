/**
 * Returning clients as Firefox is one: hello, register, disconnect, real time passes, hello again
 * with the same uaid — on the all-in-one (embedded dynalite) and on separate nodes sharing a dynalite
 * server. A resumed session must be indistinguishable from a fresh one: pushes to it are delivered
 * directly (the connection node's trace says `direct`), what it did not ack is saved when it ends and
 * comes on the next resume, the router record names no node once it ended, and `msg_limit` holds.
 */
import { Effect } from "effect"
import { assert, describe, it } from "vitest"
import { Storage } from "../../src/storage/Storage.ts"
import type { TestClient } from "../connection/client.ts"
import { waitUntil } from "../eventually.ts"
import { type Deployment, deliveredAs, deploymentFor, startAllInOne, startSeparate, storageOf } from "./servers.ts"
import { ack, helloAs, register, withServerOutput } from "./userAgent.ts"

const MSG_LIMIT = 20
const FLAGS = ["--msg-limit", String(MSG_LIMIT)]

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

/** A push whose body names it (the server relays bodies as they are); its message id. */
const push = async (endpoint: string, text: string): Promise<string> => {
  const res = await fetch(endpoint, { method: "POST", headers: { TTL: "3600", "Content-Encoding": "aes128gcm" }, body: text })
  await res.arrayBuffer()
  assert.strictEqual(res.status, 201, text)
  return (res.headers.get("location") as string).split("/").pop() as string
}

const dataOf = (frame: Record<string, unknown>) => Buffer.from(frame["data"] as string, "base64url").toString()

const nodeIdOf = (deployment: Deployment, uaid: string) =>
  Effect.runPromise(
    Storage.use((storage) => storage.getUser(uaid)).pipe(
      Effect.provide(storageOf(deployment))
    )
  ).then((user) => user?.nodeId)

/**
 * Take notifications, acking each: the `expected` ones, each waited for as long as a frame that
 * should come (seconds late on a loaded machine), then any more that come within 1.5 s or until
 * the socket closes.
 */
const drain = async (client: TestClient, expected: number): Promise<Array<string>> => {
  const got: Array<string> = []
  for (;;) {
    const frame = await client.next((f) => f["messageType"] === "notification", got.length < expected ? undefined : 1_500).catch(() => undefined)
    if (frame === undefined) return got
    got.push(dataOf(frame))
    ack(client, frame)
  }
}

const scenario = (name: string, start: () => Promise<Deployment>) =>
  describe(name, () => {
    const deployment = deploymentFor(start)
    const failing = withServerOutput(deployment)

    it("resumed after a second: direct delivery, unacked saved and redelivered, node_id cleared, twice", failing(async () => {
      const first = await helloAs(deployment())
      const { endpoint } = await register(first.client)
      await first.client.close()
      await sleep(1_100)

      for (const round of [1, 2]) {
        const { client, uaid } = await helloAs(deployment(), first.uaid)
        assert.strictEqual(uaid, first.uaid, `round ${round}: the uaid is resumed`)
        if (round === 2) assert.deepStrictEqual(await drain(client, 2), ["kept 1", "offline 1"], "what the first session left")
        await sleep(300)
        const acked = await push(endpoint, `acked ${round}`)
        const frame = await client.next((f) => f["messageType"] === "notification")
        assert.strictEqual(dataOf(frame), `acked ${round}`)
        ack(client, frame)
        // Round 2: the endpoint still holds the record it stored round 1's offline push on (within
        // router_cache_ttl); the first push after the client came back goes through storage, the
        // re-read after the store brings the new record, and what follows is direct.
        assert.strictEqual(await deliveredAs(deployment(), acked), round === 1 ? "direct" : "stored", `round ${round}: the first push`)
        const kept = await push(endpoint, `kept ${round}`)
        assert.strictEqual(dataOf(await client.next((f) => f["messageType"] === "notification")), `kept ${round}`)
        assert.strictEqual(await deliveredAs(deployment(), kept), "direct", `round ${round}: a resumed, connected client gets pushes directly`)
        await sleep(500)
        await client.close() // `kept` unacked: saved by the node
        await waitUntil(async () => (await nodeIdOf(deployment(), uaid)) === undefined, 10_000)
        assert.isUndefined(await nodeIdOf(deployment(), uaid), `round ${round}: the router record names no node once the session ended`)
        await push(endpoint, `offline ${round}`)
        await sleep(1_100)
      }
      const last = await helloAs(deployment(), first.uaid)
      assert.deepStrictEqual(await drain(last.client, 2), ["kept 2", "offline 2"])
      await last.client.close()
    }), 60_000)

    it("msg_limit: 21 stored for three sites → the client gets 20, then 1000 UaidReset and a new uaid; exactly 20 → all, no reset", failing(async () => {
      for (const stored of [MSG_LIMIT + 1, MSG_LIMIT]) {
        const first = await helloAs(deployment())
        // msg_limit guards many subscriptions together: one alone counts up to half of it.
        const sites = [await register(first.client), await register(first.client), await register(first.client)]
        await first.client.close()
        for (let i = 0; i < stored; i++) await push(sites[i % sites.length]!.endpoint, `m${i}`)
        await sleep(1_000)
        const { client, uaid } = await helloAs(deployment(), first.uaid)
        assert.strictEqual(uaid, first.uaid)
        const got = await drain(client, MSG_LIMIT)
        assert.deepStrictEqual(got, Array.from({ length: MSG_LIMIT }, (_, i) => `m${i}`), `${stored} stored`)
        if (stored > MSG_LIMIT) assert.deepStrictEqual(await client.closed, { code: 1000, reason: "UaidReset" })
        else assert.isTrue(await client.quiet(300), "nothing more, no close")
        await client.close()
        const next = await helloAs(deployment(), first.uaid)
        assert.strictEqual(next.uaid === first.uaid, stored === MSG_LIMIT, `${stored} stored: uaid kept only without a reset`)
        await next.client.close()
      }
    }), 60_000)
  })

scenario("returning clients: all-in-one on embedded storage", () => startAllInOne(FLAGS))
scenario("returning clients: separate nodes sharing dynalite", () => startSeparate(FLAGS))
