/**
 * `npm run bench:clients`: what a sender's volume and a client's pace cost the clients, from outside,
 * on separate nodes (an endpoint node with its router cache, a connection node, a storage server):
 *
 * - burst: a client with two subscriptions that acks each notification at once; 1,000 pushes to one
 *   subscription, 32 in flight. Printed: the answers (201, 429 by errno, 410), how many of the 201s
 *   reached the client (and how many twice), whether the client was closed, and what a push to its
 *   other subscription got. At `client_channel_capacity` 128 (the default) and 16 (a queue that a
 *   burst overflows into storage, as on a loaded node);
 * - late acker: a client returns to 5 stored messages and holds its acks (as a client that acks in
 *   batches every 30 s does); one more push while it holds them: the time until it arrives (up to
 *   35 s), 5 rounds.
 *
 * The per-subscription rate limit, where the servers have one, is lifted: the figures are about
 * the connection's queue and what is stored. AUTOPUSH_SERVER_ROOT=<checkout> runs another checkout's
 * servers (an earlier version, for "before" figures).
 */
import { readFileSync } from "node:fs"
import { join } from "node:path"
import type { TestClient } from "../test/connection/client.ts"
import { startSeparate } from "../test/e2e/servers.ts"
import { ack, helloAs, register } from "../test/e2e/userAgent.ts"

const root = process.env["AUTOPUSH_SERVER_ROOT"] ?? new URL("../", import.meta.url).pathname
const hasSubscriptionLimit = readFileSync(join(root, "src/config/options.ts"), "utf8").includes("rate_limit_per_subscription")
const env = hasSubscriptionLimit ? { AUTOEND__RATE_LIMIT_PER_SUBSCRIPTION: "0" } : {}

const push = async (endpoint: string, body: string) => {
  const res = await fetch(endpoint, { method: "POST", headers: { TTL: "3600", "Content-Encoding": "aes128gcm" }, body })
  const text = await res.text()
  const location = res.headers.get("location") ?? ""
  const errno = res.status === 201 ? undefined : (JSON.parse(text) as { readonly errno?: number }).errno
  return { status: res.status, errno, id: location.slice(location.indexOf("/m/") + 3) }
}

/** Notification versions a client was sent (how many times), acked at once when `acking`. */
const receiving = (client: TestClient, acking: boolean) => {
  const seen = new Map<string, number>()
  const take = (f: Record<string, unknown>) => {
    if (f["messageType"] !== "notification") return
    seen.set(f["version"] as string, (seen.get(f["version"] as string) ?? 0) + 1)
    if (acking) ack(client, f)
  }
  for (const f of client.received) take(f)
  client.ws.on("message", (data) => take(JSON.parse(data.toString()) as Record<string, unknown>))
  return seen
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))

const burst = async (capacity: number) => {
  const d = await startSeparate(["--client-channel-capacity", String(capacity)], [], { env })
  try {
    const { client } = await helloAs(d)
    const loud = await register(client)
    const other = await register(client)
    const seen = receiving(client, true)
    const answers = new Map<string, number>()
    const accepted: Array<string> = []
    let next = 0
    await Promise.all(Array.from({ length: 32 }, async () => {
      while (next < 1_000) {
        const r = await push(loud.endpoint, `burst-${next++}`)
        const key = r.errno === undefined ? String(r.status) : `${r.status}/${r.errno}`
        answers.set(key, (answers.get(key) ?? 0) + 1)
        if (r.status === 201) accepted.push(r.id)
      }
    }))
    for (const start = Date.now(); Date.now() - start < 15_000 && !accepted.every((id) => seen.has(id)); ) await sleep(50)
    const closed = client.ws.readyState !== client.ws.OPEN
    const last = closed ? undefined : await push(other.endpoint, "other site")
    if (last?.status === 201) for (const start = Date.now(); Date.now() - start < 5_000 && !seen.has(last.id); ) await sleep(20)
    console.log(
      `burst, capacity ${String(capacity).padStart(3)}: answers ${JSON.stringify(Object.fromEntries([...answers].sort()))}; ` +
        `201s delivered ${accepted.filter((id) => seen.has(id)).length} of ${accepted.length}, twice ${[...seen.values()].filter((n) => n > 1).length}; ` +
        `client ${closed ? "closed" : "connected"}; other subscription: ${last === undefined ? "—" : `${last.status}${seen.has(last.id) ? ", delivered" : ", not delivered"}`}`
    )
    await client.close()
  } finally {
    await d.stop()
  }
}

const lateAcker = async () => {
  const d = await startSeparate([], [], { env })
  try {
    const times: Array<number> = []
    for (let round = 0; round < 5; round++) {
      const first = await helloAs(d)
      const sub = await register(first.client)
      await first.client.close()
      await sleep(300)
      for (let i = 0; i < 5; i++) await push(sub.endpoint, `away-${i}`)
      const { client } = await helloAs(d, first.uaid)
      for (let i = 0; i < 5; i++) await client.next((f) => f["messageType"] === "notification", 5_000)
      const sent = Date.now()
      const late = await push(sub.endpoint, "while holding")
      const arrived = await client.next((f) => f["messageType"] === "notification" && f["version"] === late.id, 35_000).then(() => Date.now(), () => undefined)
      times.push(arrived === undefined ? Number.POSITIVE_INFINITY : arrived - sent)
      await client.close()
    }
    const sorted = [...times].sort((a, b) => a - b)
    const show = (ms: number) => (Number.isFinite(ms) ? `${ms} ms` : "> 35 s")
    console.log(`late acker (holds 5 stored unacked): a new push arrived after ${sorted.map(show).join(", ")} (median ${show(sorted[2]!)})`)
  } finally {
    await d.stop()
  }
}

console.log(`servers: ${root}`)
await burst(128)
await burst(16)
await lateAcker()
