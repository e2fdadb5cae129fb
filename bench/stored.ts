/**
 * `npm run bench:stored`: stored delivery on the real all-in-one process (embedded dynalite on
 * disk). A client registers and goes away; N messages are pushed to it through the public API
 * (stored); it connects again and acks each message as it comes, as Firefox does. Printed: the
 * store rate, and the drain rate from hello to the last ack with the server's CPU per message.
 *
 * Options (flag or environment): --messages/BENCH_MESSAGES (10000), --bytes/BENCH_BYTES (256).
 */
import { randomBytes } from "node:crypto"
import { openClient } from "../test/connection/client.ts"
import { agent, cpuMs, fmt, hello, option, push, register, start } from "./harness.ts"

const MESSAGES = Number(option("messages", "BENCH_MESSAGES", "10000"))
const BYTES = Number(option("bytes", "BENCH_BYTES", "256"))

const { deployment, pid } = await start(["--msg-limit", String(MESSAGES * 2)])
try {
  const first = await hello(deployment.wsUrl)
  const uaid = first.received.find((m) => m["messageType"] === "hello")?.["uaid"] as string
  const endpoint = await register(first)
  await first.close()

  const statuses = new Map<number, number>()
  let sent = 0
  const pushedAt = performance.now()
  await Promise.all(Array.from({ length: 32 }, async () => {
    while (sent < MESSAGES) {
      sent++
      const status = await push(endpoint, randomBytes(BYTES))
      statuses.set(status, (statuses.get(status) ?? 0) + 1)
    }
  }))
  const pushSeconds = (performance.now() - pushedAt) / 1000
  const stored = statuses.get(201) ?? 0

  const client = await openClient(deployment.wsUrl)
  const cpuBefore = cpuMs(pid)
  const began = performance.now()
  client.send({ messageType: "hello", uaid, use_webpush: true })
  let delivered = 0
  while (delivered < stored) {
    const n = await client.next((m) => m["messageType"] === "notification", 30_000)
    client.send({ messageType: "ack", updates: [{ channelID: n["channelID"], version: n["version"] }] })
    delivered++
  }
  const seconds = (performance.now() - began) / 1000
  const cpu = cpuMs(pid) - cpuBefore
  const quiet = await client.quiet(1_000, (m) => m["messageType"] === "notification")
  await client.close()

  console.log(`stored delivery, all-in-one on embedded dynalite, ${BYTES}-byte bodies`)
  console.log(`  pushed ${MESSAGES} to an offline client in ${fmt(pushSeconds)} s (${fmt(MESSAGES / pushSeconds, 0)}/s), answers ${JSON.stringify(Object.fromEntries(statuses))}`)
  console.log(`  drained and acked ${delivered} in ${fmt(seconds, 2)} s: ${fmt(delivered / seconds, 0)} msg/s (target ≥ 2000), server CPU ${fmt((cpu * 1000) / Math.max(1, delivered), 0)} µs per message; nothing more after: ${quiet}`)
} finally {
  agent.destroy()
  await deployment.stop()
}
