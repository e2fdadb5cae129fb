/**
 * UnifiedPush distributors that speak this protocol (Sunup on Android, KUnifiedPush on KDE) against
 * the all-in-one process: they send less than Firefox does — a hello with no `use_webpush` and no
 * `channelIDs` (on a reconnect only the uaid), a register with the application's VAPID key, acks
 * without a `code` — and some never ack at all. Each is pinned here: a push sent with the `web-push`
 * library (VAPID, aes128gcm) reaches such a client, an ack without a code counts as taken, and what
 * a client never acked comes again on its next connection. With `require_vapid`, a register without a
 * key still gets an endpoint, and only signed pushes to it are accepted.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import webpush from "web-push"
import { openClient, type TestClient } from "../connection/client.ts"
import { type Deployment, deploymentFor, startAllInOne } from "./servers.ts"

const vapid = webpush.generateVAPIDKeys()
const vapidDetails = { subject: "mailto:ops@example.com", publicKey: vapid.publicKey, privateKey: vapid.privateKey }
/** The subscriber's keys (the push is encrypted to them; this test does not decrypt). */
const keys = (() => {
  const other = webpush.generateVAPIDKeys()
  return { p256dh: other.publicKey, auth: Buffer.alloc(16, 7).toString("base64url") }
})()

/** A distributor's hello: nothing but the uaid when it has one. */
const helloAs = async (deployment: Deployment, uaid?: string) => {
  const client = await openClient(deployment.wsUrl)
  client.send(uaid === undefined ? { messageType: "hello" } : { messageType: "hello", uaid })
  const reply = await client.next((f) => f["messageType"] === "hello")
  assert.strictEqual(reply["status"], 200)
  return { client, uaid: reply["uaid"] as string }
}

/** Register a channel, with the application's VAPID public key (unpadded base64url, as apps give it) or without. */
const registerChannel = async (client: TestClient, withKey: boolean) => {
  const channelID = crypto.randomUUID()
  client.send(withKey ? { messageType: "register", channelID, key: vapid.publicKey } : { messageType: "register", channelID })
  const reply = await client.next((f) => f["messageType"] === "register")
  return { status: reply["status"], endpoint: reply["pushEndpoint"] as string, channelID }
}

/** A push as an application server sends it with the `web-push` library; its status. */
const send = async (endpoint: string, payload: string, signed: boolean) => {
  const details = webpush.generateRequestDetails({ endpoint, keys }, payload, { TTL: 600, ...(signed ? { vapidDetails } : {}) })
  const headers = Object.fromEntries(Object.entries(details.headers).map(([k, v]) => [k, String(v)]))
  const res = await fetch(details.endpoint, { method: details.method, headers, body: details.body })
  return { status: res.status, body: await res.text() }
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

const notification = (client: TestClient, ms = 5_000) => client.next((f) => f["messageType"] === "notification", ms)
const noNotification = async (client: TestClient, ms = 1_000) =>
  assert.isUndefined(await notification(client, ms).catch(() => undefined), "nothing more is sent")

const live = (deployment: () => Deployment, title: string, body: () => Promise<void>) =>
  it.live(title, () =>
    Effect.tryPromise({
      try: body,
      catch: (e) => new Error(`${String(e)}\n--- server output (last 40 lines) ---\n${deployment().output.slice(-40).join("\n")}`)
    }), 30_000)

describe("UnifiedPush distributors (Sunup, KUnifiedPush)", () => {
  const deployment = deploymentFor(() => startAllInOne())

  live(deployment, "a minimal hello, a register with the app's VAPID key, a signed push, an ack without a code: taken, never sent again", async () => {
    const first = await helloAs(deployment())
    const channel = await registerChannel(first.client, true)
    assert.strictEqual(channel.status, 200)
    assert.match(channel.endpoint, new RegExp(`^${deployment().endpointUrl}/wpush/v2/`))
    const sent = await send(channel.endpoint, "hello distributor", true)
    assert.strictEqual(sent.status, 201, sent.body)
    const got = await notification(first.client)
    assert.strictEqual(got["channelID"], channel.channelID)
    assert.isString(got["data"])
    first.client.send({ messageType: "ack", updates: [{ channelID: got["channelID"], version: got["version"] }] })
    await new Promise((resolve) => setTimeout(resolve, 300))
    await first.client.close()

    // Back with nothing but its uaid: the same uaid, and the acked message is not sent again.
    const again = await helloAs(deployment(), first.uaid)
    assert.strictEqual(again.uaid, first.uaid)
    await noNotification(again.client)
    // Still subscribed: a new push reaches it.
    assert.strictEqual((await send(channel.endpoint, "second", true)).status, 201)
    assert.strictEqual((await notification(again.client))["channelID"], channel.channelID)
    await again.client.close()
  })

  live(deployment, "a client that never acks gets its messages again on every connection, until it acks them", async () => {
    const first = await helloAs(deployment())
    const channel = await registerChannel(first.client, true)
    const versions: Array<string> = []
    for (const text of ["one", "two", "three"]) {
      assert.strictEqual((await send(channel.endpoint, text, true)).status, 201)
      versions.push((await notification(first.client))["version"] as string)
    }
    await first.client.close()
    // What it did not ack is saved as its session ends; a client comes back some time later.
    await sleep(1_000)
    for (const round of [1, 2]) {
      const back = await helloAs(deployment(), first.uaid)
      const again: Array<string> = []
      for (let i = 0; i < 3; i++) again.push((await notification(back.client))["version"] as string)
      assert.sameMembers(again, versions, `round ${round}: every unacked message again`)
      if (round === 2) for (const version of again) back.client.send({ messageType: "ack", updates: [{ channelID: channel.channelID, version }] })
      await sleep(300)
      await back.client.close()
      await sleep(1_000)
    }
    const last = await helloAs(deployment(), first.uaid)
    await noNotification(last.client)
    await last.client.close()
  })
})

describe("UnifiedPush with require_vapid", () => {
  const deployment = deploymentFor(() => startAllInOne(["--require-vapid"]))

  live(deployment, "a register without a key is refused with 403 (VAPID_REQUIRED), the socket kept; with the app's key it gets an endpoint that takes its signed pushes only", async () => {
    const { client } = await helloAs(deployment())
    const keyless = await registerChannel(client, false)
    assert.strictEqual(keyless.status, 403)
    assert.strictEqual(keyless.endpoint, "VAPID key required")
    const channel = await registerChannel(client, true)
    assert.strictEqual(channel.status, 200, "the same socket goes on")
    assert.match(channel.endpoint, /\/wpush\/v2\//)
    const unsigned = await send(channel.endpoint, "unsigned", false)
    assert.strictEqual(unsigned.status, 401)
    assert.strictEqual(JSON.parse(unsigned.body)["errno"], 109)
    await noNotification(client, 500)
    assert.strictEqual((await send(channel.endpoint, "signed", true)).status, 201)
    assert.strictEqual((await notification(client))["channelID"], channel.channelID)
    await client.close()
  })
})
