/**
 * A client's minimum urgency (RFC 8030 §5.3) over real processes: on the all-in-one the endpoint
 * hands a message to the connection node in process, on separate nodes over the router port — a
 * message less urgent than the client's minimum must be held in both, and come once it is lowered.
 */
import { assert, describe, it } from "vitest"
import type { TestClient } from "../connection/client.ts"
import { type Deployment, deploymentFor, startAllInOne, startSeparate } from "./servers.ts"
import { helloAs, register, withServerOutput } from "./userAgent.ts"

const push = async (endpoint: string, text: string, urgency: string) => {
  const res = await fetch(endpoint, { method: "POST", headers: { TTL: "600", "Content-Encoding": "aes128gcm", Urgency: urgency }, body: text })
  await res.arrayBuffer()
  return res.status
}

/** The bodies of the notifications that come within `quietMs` of each other, each acked. */
const received = async (client: TestClient, quietMs = 1_000): Promise<Array<string>> => {
  const got: Array<string> = []
  for (;;) {
    const frame = await client.next((f) => f["messageType"] === "notification", quietMs).catch(() => undefined)
    if (frame === undefined) return got
    got.push(Buffer.from(frame["data"] as string, "base64url").toString())
    client.send({ messageType: "ack", updates: [{ channelID: frame["channelID"], version: frame["version"] }] })
  }
}

const scenario = (name: string, start: () => Promise<Deployment>) =>
  describe(name, () => {
    const deployment = deploymentFor(start)
    it("a connected client with minimum normal gets a high push at once; a low one is held until it lowers its minimum", withServerOutput(deployment)(async () => {
      const { client } = await helloAs(deployment())
      const { endpoint } = await register(client)
      client.send({ messageType: "urgency", min: "normal" })
      assert.strictEqual((await client.next((f) => f["messageType"] === "urgency"))["status"], 200)
      assert.strictEqual(await push(endpoint, "low", "low"), 201)
      assert.strictEqual(await push(endpoint, "high", "high"), 201)
      assert.deepStrictEqual(await received(client), ["high"])
      client.send({ messageType: "urgency", min: "very-low" })
      assert.deepStrictEqual(await received(client), ["low"])
      await client.close()
    }), 20_000)
  })

scenario("all-in-one", () => startAllInOne())
scenario("separate nodes", () => startSeparate())
