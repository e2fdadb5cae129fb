/**
 * A connection node polling a public megaphone source (no token configured, as Remote Settings'
 * `monitor_changes` is public): it starts, sends no Authorization header, and its clients are told
 * the source's versions in their hello.
 */
import { createServer, type Server } from "node:http"
import type { AddressInfo } from "node:net"
import { afterAll, assert, beforeAll, describe, it } from "vitest"
import { openClient } from "../connection/client.ts"
import { type Deployment, startAllInOne } from "./servers.ts"

describe("megaphone without a token", () => {
  let megaphone: Server
  let deployment: Deployment | undefined
  const authorization: Array<string | undefined> = []

  beforeAll(async () => {
    megaphone = createServer((req, res) => {
      authorization.push(req.headers.authorization)
      res.writeHead(200, { "content-type": "application/json" })
      res.end(JSON.stringify({ broadcasts: { "remote-settings/monitor_changes": "\"1700000000000\"" } }))
    })
    await new Promise<void>((resolve) => megaphone.listen(0, "127.0.0.1", resolve))
    const url = `http://127.0.0.1:${(megaphone.address() as AddressInfo).port}/v1/broadcasts`
    deployment = await startAllInOne(["--megaphone-api-url", url, "--megaphone-poll-interval", "1"])
  }, 60_000)
  afterAll(async () => {
    await deployment?.stop()
    megaphone?.close()
  })

  it("starts, polls without Authorization, and tells a client that is behind", async () => {
    const client = await openClient(deployment!.wsUrl)
    client.send({ messageType: "hello", use_webpush: true, broadcasts: { "remote-settings/monitor_changes": "v0" } })
    const hello = await client.next((f) => f["messageType"] === "hello")
    assert.deepStrictEqual(hello["broadcasts"], { "remote-settings/monitor_changes": "\"1700000000000\"" })
    assert.isAbove(authorization.length, 0)
    assert.deepStrictEqual([...new Set(authorization)], [undefined])
    await client.close()
  })
})
