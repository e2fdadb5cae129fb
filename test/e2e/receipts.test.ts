/**
 * Push receipts (RFC 8030 §5.1, §6) against running nodes — the all-in-one and separate nodes on a
 * shared dynalite — with a WebSocket client as the user agent: a receipt subscription, pushes with
 * `Push-Receipt` (202), and every outcome collected as the RFC says (HTTP/2 server push) and as plain
 * HTTP/1.1 allows (a JSON long poll, server-sent events), plus the push message resource's status.
 */
import * as http2 from "node:http2"
import { assert, describe, it } from "vitest"
import { type Deployment, deploymentFor, startAllInOne, startSeparate } from "./servers.ts"
import { ack, helloAs, register, withServerOutput } from "./userAgent.ts"

const FLAGS = ["--receipt-subscription-idle", "5"]

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

interface Receipt {
  readonly message: string
  readonly state: string
  readonly status?: number
  readonly outcome?: string
  readonly code?: number
  readonly acceptedAt?: number
  readonly storedAt?: number
  readonly deliveredAt?: number
  readonly outcomeAt?: number
}

const subscribeReceipts = async (deployment: Deployment): Promise<string> => {
  const res = await fetch(`${deployment.endpointUrl}/receipts`, { method: "POST" })
  await res.arrayBuffer()
  assert.strictEqual(res.status, 201)
  const location = res.headers.get("location") as string
  assert.match(location, new RegExp(`^${deployment.endpointUrl}/receipts/[A-Za-z0-9_-]{22}$`))
  return location
}

/** A push with a receipt: 202 and its push message resource. */
const push = async (endpoint: string, receipts: string | undefined, headers: Record<string, string> = {}): Promise<string> => {
  const res = await fetch(endpoint, {
    method: "POST",
    headers: { TTL: "3600", ...(receipts === undefined ? {} : { "Push-Receipt": receipts, Prefer: "respond-async" }), ...headers }
  })
  const text = await res.text()
  assert.strictEqual(res.status, receipts === undefined ? 201 : 202, text)
  assert.match(res.headers.get("link") ?? "", /<[^>]+\/receipts>; rel="urn:ietf:params:push:receipt"/)
  return res.headers.get("location") as string
}

/** `GET` of the subscription as JSON, waiting up to `wait` s for a receipt. */
const poll = async (receipts: string, wait = 10): Promise<ReadonlyArray<Receipt>> => {
  const res = await fetch(receipts, { headers: { accept: "application/json", prefer: `wait=${wait}` } })
  const text = await res.text()
  assert.strictEqual(res.status, 200, text)
  return (JSON.parse(text) as { readonly receipts: ReadonlyArray<Receipt> }).receipts
}

const statusOf = async (message: string): Promise<Receipt> => {
  const res = await fetch(message)
  const text = await res.text()
  assert.strictEqual(res.status, 200, text)
  return JSON.parse(text) as Receipt
}

/** Server-sent events of the subscription until `count` receipts came. */
const events = async (receipts: string, count: number): Promise<ReadonlyArray<Receipt>> => {
  const controller = new AbortController()
  const res = await fetch(receipts, { headers: { accept: "text/event-stream" }, signal: controller.signal })
  assert.strictEqual(res.status, 200)
  assert.strictEqual(res.headers.get("content-type"), "text/event-stream")
  const got: Array<Receipt> = []
  const decoder = new TextDecoder()
  let buffer = ""
  for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
    buffer += decoder.decode(chunk, { stream: true })
    let end: number
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end)
      buffer = buffer.slice(end + 2)
      const data = /^data: (.*)$/m.exec(event)?.[1]
      if (/^event: receipt$/m.test(event) && data !== undefined) got.push(JSON.parse(data) as Receipt)
    }
    if (got.length >= count) break
  }
  controller.abort()
  return got
}

/** The RFC's way: `GET` over HTTP/2 (h2c), receipts as server pushes; `count` of them. */
const serverPushes = (receipts: string, count: number): Promise<ReadonlyArray<{ readonly path: string; readonly status: number; readonly body: Receipt }>> =>
  new Promise((resolve, reject) => {
    const url = new URL(receipts)
    const session = http2.connect(url.origin)
    const got: Array<{ path: string; status: number; body: Receipt }> = []
    session.on("error", reject)
    session.on("stream", (pushed, requestHeaders) => {
      let status = 0
      let body = ""
      pushed.on("push", (headers) => void (status = Number(headers[":status"])))
      pushed.setEncoding("utf8")
      pushed.on("data", (chunk: string) => void (body += chunk))
      pushed.on("end", () => {
        got.push({ path: String(requestHeaders[":path"]), status, body: JSON.parse(body) as Receipt })
        if (got.length >= count) {
          session.destroy()
          resolve(got)
        }
      })
    })
    const request = session.request({ ":method": "GET", ":path": url.pathname })
    request.on("error", () => {})
    request.on("response", (headers) => {
      if (headers[":status"] !== 200 && headers[":status"] !== 204) reject(new Error(`GET answered ${String(headers[":status"])}`))
    })
    setTimeout(() => {
      session.destroy()
      reject(new Error(`${got.length} of ${count} server pushes`))
    }, 15_000)
  })

const scenario = (name: string, start: () => Promise<Deployment>, split: boolean) =>
  describe(name, () => {
    const deployment = deploymentFor(start)
    const failing = withServerOutput(deployment)

    it("connected client: 202, delivered, acked → the receipt (410) over a JSON long poll, then gone", failing(async () => {
      const { client } = await helloAs(deployment())
      const { endpoint } = await register(client)
      const receipts = await subscribeReceipts(deployment())
      const message = await push(endpoint, receipts)
      assert.match(message, new RegExp(`^${deployment().endpointUrl}/m/`))
      const frame = await client.next((f) => f["messageType"] === "notification")
      assert.isUndefined(frame["receipt"], "the user agent never sees the receipt subscription")
      await sleep(300)
      assert.strictEqual((await statusOf(message)).state, "delivered")
      const waiting = poll(receipts) // held until the receipt comes
      await sleep(500)
      ack(client, frame)
      const [receipt, ...more] = await waiting
      assert.strictEqual(more.length, 0)
      assert.strictEqual(receipt?.message, message)
      assert.strictEqual(receipt?.outcome, "acknowledged")
      assert.strictEqual(receipt?.status, 410)
      assert.strictEqual(receipt?.code, 100)
      assert.isAtLeast(receipt?.outcomeAt ?? 0, receipt?.deliveredAt ?? Infinity)
      assert.deepStrictEqual(await poll(receipts, 0), [], "a collected receipt is handed out once")
      await client.close()
    }))

    /** A client that registered and left, and a receipt subscription. */
    const awayWithReceipts = async () => {
      const first = await helloAs(deployment())
      const { endpoint } = await register(first.client)
      await first.client.close()
      return { uaid: first.uaid, endpoint, receipts: await subscribeReceipts(deployment()) }
    }

    it("offline client that connects later: stored, then delivered and acked → the receipt as a server-sent event", failing(async () => {
      const first = await awayWithReceipts()
      const { endpoint, receipts } = first
      const message = await push(endpoint, receipts)
      assert.strictEqual((await statusOf(message)).state, "stored")
      const stream = events(receipts, 1)
      const { client } = await helloAs(deployment(), first.uaid)
      ack(client, await client.next((f) => f["messageType"] === "notification"))
      const [receipt] = await stream
      assert.strictEqual(receipt?.message, message)
      assert.strictEqual(receipt?.outcome, "acknowledged")
      assert.isDefined(receipt?.storedAt)
      await client.close()
    }))

    it("HTTP/2: receipts arrive as server pushes of the push message resources (RFC 8030 §6.2)", failing(async () => {
      const { client } = await helloAs(deployment())
      const { endpoint } = await register(client)
      const receipts = await subscribeReceipts(deployment())
      const pushes = serverPushes(receipts, 2)
      const messages = [await push(endpoint, receipts), await push(endpoint, receipts)]
      for (let i = 0; i < 2; i++) ack(client, await client.next((f) => f["messageType"] === "notification"))
      const got = await pushes
      assert.deepStrictEqual(got.map((p) => p.path).sort(), messages.map((m) => new URL(m).pathname).sort())
      assert.deepStrictEqual(got.map((p) => p.status), [410, 410])
      assert.deepStrictEqual(got.map((p) => p.body.outcome), ["acknowledged", "acknowledged"])
      await client.close()
    }))

    it("expired undelivered: TTL 0 to an offline client at once, a short TTL once it ran out", failing(async () => {
      const { endpoint, receipts } = await awayWithReceipts()
      const dropped = await push(endpoint, receipts, { TTL: "0" })
      const [now, ...others] = await poll(receipts, 0)
      assert.strictEqual(others.length, 0)
      assert.deepStrictEqual([now?.message, now?.outcome, now?.status], [dropped, "expired", 200])
      const short = await push(endpoint, receipts, { TTL: "1" })
      assert.strictEqual((await statusOf(short)).state, "stored")
      await sleep(2_100)
      const [later, ...more] = await poll(receipts, 0)
      assert.strictEqual(more.length, 0)
      assert.deepStrictEqual([later?.message, later?.outcome], [short, "expired"])
    }))

    it("deleted by the sender, and the user agent unsubscribed", failing(async () => {
      const { client } = await helloAs(deployment())
      const { endpoint, channelID } = await register(client)
      // The client holds less urgent messages back: they stay stored until it unsubscribes.
      client.send({ messageType: "urgency", min: "high" })
      await client.next((f) => f["messageType"] === "urgency")
      const receipts = await subscribeReceipts(deployment())
      const cancelled = await push(endpoint, receipts, { Urgency: "low" })
      const held = await push(endpoint, receipts, { Urgency: "low" })
      const res = await fetch(cancelled, { method: "DELETE" })
      assert.strictEqual(res.status, 204)
      client.send({ messageType: "unregister", channelID })
      await client.next((f) => f["messageType"] === "unregister")
      const got = await poll(receipts, 0)
      assert.deepStrictEqual(
        got.map((r) => [r.message, r.outcome]).sort(),
        [[cancelled, "deleted"], [held, "unsubscribed"]].sort()
      )
      await client.close()
    }))

    it("nacked or refused by the user agent: rejected, with its code", failing(async () => {
      const { client } = await helloAs(deployment())
      const { endpoint } = await register(client)
      const receipts = await subscribeReceipts(deployment())
      const message = await push(endpoint, receipts)
      ack(client, await client.next((f) => f["messageType"] === "notification"), 101)
      const [receipt] = await poll(receipts)
      assert.deepStrictEqual([receipt?.message, receipt?.outcome, receipt?.code, receipt?.status], [message, "rejected", 101, 200])
      await client.close()
    }))

    it("survives a restart of every node between the push and the ack", failing(async () => {
      const first = await helloAs(deployment())
      const { endpoint } = await register(first.client)
      const receipts = await subscribeReceipts(deployment())
      const message = await push(endpoint, receipts)
      await first.client.next((f) => f["messageType"] === "notification") // delivered, not acked
      await deployment().restart()
      const { client } = await helloAs(deployment(), first.uaid)
      ack(client, await client.next((f) => f["messageType"] === "notification"))
      const [receipt] = await poll(receipts)
      assert.deepStrictEqual([receipt?.message, receipt?.outcome], [message, "acknowledged"])
      await client.close()
    }))

    it("refused: a receipt URL of another origin, a made-up one, an expired subscription; unknown ones are 404", failing(async () => {
      const { client } = await helloAs(deployment())
      const { endpoint } = await register(client)
      const receipts = await subscribeReceipts(deployment())
      const id = receipts.split("/").pop() as string
      const foreign = `https://push.example.com/receipts/${id}`
      const madeUp = `${deployment().endpointUrl}/receipts/${"A".repeat(22)}`
      for (const url of [foreign, madeUp, `${deployment().endpointUrl}/receipts/nope`]) {
        const res = await fetch(endpoint, { method: "POST", headers: { TTL: "60", "Push-Receipt": url } })
        const body = (await res.json()) as { readonly errno: number }
        assert.deepStrictEqual([res.status, body.errno], [400, 117], url)
      }
      const unknown = await fetch(madeUp, { headers: { accept: "application/json" } })
      assert.deepStrictEqual([unknown.status, ((await unknown.json()) as { readonly errno: number }).errno], [404, 118])
      // Idle for longer than receipt_subscription_idle (5 s here): gone.
      await sleep(6_100)
      const expired = await fetch(receipts, { headers: { accept: "application/json" } })
      assert.strictEqual(expired.status, 404)
      await expired.arrayBuffer()
      const refused = await fetch(endpoint, { method: "POST", headers: { TTL: "60", "Push-Receipt": receipts } })
      assert.deepStrictEqual([refused.status, ((await refused.json()) as { readonly errno: number }).errno], [400, 117])
      const gone = await fetch(`${deployment().endpointUrl}/m/not-a-message`)
      assert.strictEqual(gone.status, 404)
      await gone.arrayBuffer()
      await client.close()
    }))

    it("pushes without Push-Receipt are unchanged: 201, and their status comes from the trace while it has them", failing(async () => {
      const { client } = await helloAs(deployment())
      const { endpoint } = await register(client)
      const message = await push(endpoint, undefined)
      ack(client, await client.next((f) => f["messageType"] === "notification"))
      const refused = await push(endpoint, undefined)
      ack(client, await client.next((f) => f["messageType"] === "notification"), 101)
      await sleep(300)
      // The all-in-one's trace has both halves; a separate endpoint node saw it accepted and handed on.
      assert.strictEqual((await statusOf(message)).state, split ? "accepted" : "acknowledged")
      const failed = await statusOf(refused)
      assert.deepStrictEqual([failed.state, failed.code], split ? ["accepted", undefined] : ["rejected", 101])
      await client.close()
    }))
  })

scenario("receipts: all-in-one (embedded dynalite)", () => startAllInOne(FLAGS), false)
scenario("receipts: separate nodes (shared dynalite)", () => startSeparate(FLAGS, FLAGS), true)
