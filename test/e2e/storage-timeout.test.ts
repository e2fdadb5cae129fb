/**
 * A storage server that accepts connections and never answers (its process stopped): every storage
 * call has a deadline (`storage_timeout`), so nothing parks. A push that needs storage is answered
 * 503 with Retry-After, a hello that cannot resume is closed, the nodes keep answering — and once
 * storage answers again, everything works as before.
 */
import { assert, describe, it } from "vitest"
import { openClient } from "../connection/client.ts"
import { deploymentFor, startSeparate } from "./servers.ts"

describe("storage that never answers (separate processes, storage_timeout 1 s)", () => {
  const deployment = deploymentFor(() => startSeparate(["--hello-timeout", "2"], ["--storage-timeout", "1"]))

  const subscribe = async () => {
    const client = await openClient(deployment().wsUrl)
    client.send({ messageType: "hello", use_webpush: true })
    const uaid = (await client.next((f) => f["messageType"] === "hello"))["uaid"] as string
    client.send({ messageType: "register", channelID: crypto.randomUUID() })
    const endpoint = (await client.next((f) => f["messageType"] === "register"))["pushEndpoint"] as string
    return { client, uaid, endpoint }
  }
  const push = (endpoint: string) => fetch(endpoint, { method: "POST", headers: { TTL: "60", "Content-Encoding": "aes128gcm" }, body: "x" })

  it("pushes are answered 503 + Retry-After, a hello is closed, the nodes stay up; all is well once storage answers", async () => {
    const offline = await subscribe()
    await offline.client.close()
    const frozen = deployment().storageFreeze!()
    try {
      let started = Date.now()
      const refused = await push(offline.endpoint)
      const body = (await refused.json()) as { readonly code: number; readonly errno: number }
      assert.strictEqual(refused.status, 503)
      assert.strictEqual(refused.headers.get("retry-after"), "120")
      assert.deepInclude(body, { code: 503, errno: 201 })
      assert.isBelow(Date.now() - started, 5_000, "answered within a few storage deadlines")

      started = Date.now()
      const client = await openClient(deployment().wsUrl)
      client.send({ messageType: "hello", use_webpush: true, uaid: offline.uaid })
      const closed = await client.closed
      assert.strictEqual(closed.code, 1011)
      assert.include(["StorageError", "HandshakeTimeout"], closed.reason)
      assert.isBelow(Date.now() - started, 4_000, "closed about when hello_timeout says")

      for (const url of [`${deployment().endpointUrl}/__lbheartbeat__`, `${deployment().routerUrl}/__lbheartbeat__`]) {
        assert.strictEqual((await fetch(url)).status, 200, url)
      }
    } finally {
      frozen.resume()
    }
    const back = await openClient(deployment().wsUrl)
    back.send({ messageType: "hello", use_webpush: true, uaid: offline.uaid })
    assert.strictEqual((await back.next((f) => f["messageType"] === "hello"))["uaid"], offline.uaid)
    assert.strictEqual((await push(offline.endpoint)).status, 201)
    assert.strictEqual(Buffer.from((await back.next((f) => f["messageType"] === "notification"))["data"] as string, "base64url").toString(), "x")
    await back.close()
  }, 60_000)
})
