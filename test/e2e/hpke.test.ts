/**
 * A push encrypted with HPKE (the HPKE Web Push draft: no `Content-Encoding`, `Content-Type:
 * application/webpush-message`) over real processes, larger than `max_data_bytes` as the draft's
 * overhead makes it: a connected client gets it at once, an offline one from storage when it comes
 * back, each time the very bytes the sender sent, with `content_type` and no `encoding` in the
 * frame's headers; the client opens it. On the all-in-one (in process, embedded storage) and on
 * separate nodes (the router port, dynalite).
 */
import { assert, describe, it } from "vitest"
import { randomBytes } from "node:crypto"
import { Effect } from "effect"
import { Storage } from "../../src/storage/Storage.ts"
import { hpkeRecipient, hpkeSeal } from "../crypto/hpke.ts"
import { type Deployment, deliveredAs, deploymentFor, startAllInOne, startSeparate, storageOf } from "./servers.ts"
import { ack, helloAs, register, withServerOutput } from "./userAgent.ts"

const INFO = Buffer.from("WebPush: info")
const isNotification = (f: Record<string, unknown>) => f["messageType"] === "notification"

/** A message over 4096 bytes, sealed to a fresh recipient: the recipient, the plaintext and the message. */
const largeMessage = () => {
  const recipient = hpkeRecipient()
  const plaintext = randomBytes(4500)
  return { recipient, plaintext, message: hpkeSeal(recipient.publicKey, INFO, plaintext) }
}

const send = async (endpoint: string, message: Buffer) => {
  const res = await fetch(endpoint, { method: "POST", headers: { TTL: "600", "Content-Type": "application/webpush-message" }, body: message })
  return { status: res.status, text: await res.text(), warning: res.headers.get("autopush-warning") }
}

/** The frame carries the message byte for byte, marked as HPKE, and it opens. */
const assertCarried = (frame: Record<string, unknown>, sent: ReturnType<typeof largeMessage>) => {
  assert.deepStrictEqual(frame["headers"], { content_type: "application/webpush-message" })
  const carried = Buffer.from(frame["data"] as string, "base64url")
  assert.isTrue(carried.equals(sent.message), "the bytes sent")
  assert.isTrue(sent.recipient.open(carried, INFO).equals(sent.plaintext))
}

/** Until the router record names no node: the closed session has ended, so a push is stored. */
const sessionEnded = async (deployment: Deployment, uaid: string) => {
  const nodeId = () =>
    Effect.runPromise(Storage.use((storage) => storage.getUser(uaid)).pipe(Effect.provide(storageOf(deployment)))).then((user) => user?.nodeId)
  for (let tries = 0; (await nodeId()) !== undefined; tries++) {
    if (tries === 100) throw new Error("the closed session still holds the router record")
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
}

const scenario = (name: string, start: () => Promise<Deployment>) =>
  describe(name, () => {
    const deployment = deploymentFor(start)

    it("a connected client gets a 4.5 KB HPKE message at once, byte for byte", withServerOutput(deployment)(async () => {
      const { client } = await helloAs(deployment())
      const { endpoint } = await register(client)
      const sent = largeMessage()
      assert.isAbove(sent.message.length, 4096)
      const reply = await send(endpoint, sent.message)
      assert.strictEqual(reply.status, 201, reply.text)
      assert.isNull(reply.warning)
      const frame = await client.next(isNotification)
      assertCarried(frame, sent)
      assert.strictEqual(await deliveredAs(deployment(), frame["version"] as string), "direct")
      ack(client, frame)
      await client.close()
    }), 20_000)

    it("an offline client gets it from storage when it comes back, byte for byte, once", withServerOutput(deployment)(async () => {
      const first = await helloAs(deployment())
      const { endpoint } = await register(first.client)
      await first.client.close()
      await sessionEnded(deployment(), first.uaid)
      const sent = largeMessage()
      assert.strictEqual((await send(endpoint, sent.message)).status, 201)
      const again = await helloAs(deployment(), first.uaid)
      const frame = await again.client.next(isNotification)
      assertCarried(frame, sent)
      assert.strictEqual(await deliveredAs(deployment(), frame["version"] as string), "stored")
      ack(again.client, frame)
      await again.client.close()
      const later = await helloAs(deployment(), first.uaid)
      assert.isTrue(await later.client.quiet(300, isNotification))
      await later.client.close()
    }), 20_000)
  })

scenario("HPKE end to end: all-in-one", () => startAllInOne())
scenario("HPKE end to end: separate nodes", () => startSeparate())
