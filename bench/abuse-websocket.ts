/**
 * `bench:abuse`'s WebSocket commands, against the all-in-one `abuse.ts` started: for each command,
 * its costliest frames (`test/connection/costly-frames.ts`: many keys, deep nesting, long runs of one
 * character, unicode, many channel ids, broadcasts or acks, each as large as a message may be) are
 * sent one after the other for the case's seconds, each on a connection of its own and timed from
 * its sending to the answer of a `{}` that follows it (the server handles a client's frames in
 * order); then a client that reads its pushes and never acks gets pushes as fast as the node takes
 * them. Meanwhile a victim client gets a push through the public API every 50 ms.
 *
 * Printed per case: the frames (or pushes) sent, the worst time of one and which, and the victim's
 * POST→notification latency p50 / p99 / max. Cases are named `websocket <command>` and
 * `websocket never acks` (for --only).
 */
import { randomBytes } from "node:crypto"
import { setTimeout as sleep } from "node:timers/promises"
import type { Deployment } from "../test/e2e/servers.ts"
import { costlyFrames, timeFrame } from "../test/connection/costly-frames.ts"
import { fmt, hello, push, quantile, register } from "./harness.ts"

const PUSH_EVERY_MS = 50
/** The all-in-one's `max_message_size`, as started by `abuse.ts` (the default). */
const MESSAGE_BYTES = 65_536

interface Row {
  readonly name: string
  readonly sent: number
  readonly worstMs: number
  readonly worstOf: string
  /** `lost`: pushes not delivered within a second of the case's end. */
  readonly victim: { readonly pushes: number; readonly lost: number; readonly p50: number; readonly p99: number; readonly max: number }
}

/** A victim that gets a push every 50 ms while `during` runs, and its latencies. */
const withVictim = async (endpoint: string, victim: Awaited<ReturnType<typeof hello>>, during: () => Promise<void>) => {
  const sentAt = new Map<string, number>()
  const latencies: Array<number> = []
  const onMessage = (raw: unknown) => {
    const frame = JSON.parse(String(raw)) as Record<string, unknown>
    if (frame["messageType"] !== "notification") return
    victim.send({ messageType: "ack", updates: [{ channelID: frame["channelID"], version: frame["version"], code: 100 }] })
    const began = sentAt.get(frame["data"] as string)
    if (began === undefined) return
    sentAt.delete(frame["data"] as string)
    latencies.push(performance.now() - began)
  }
  victim.ws.on("message", onMessage)
  let running = true
  const pushes = (async () => {
    let count = 0
    while (running) {
      const body = randomBytes(32)
      sentAt.set(body.toString("base64url"), performance.now())
      void push(endpoint, body).catch(() => {})
      count++
      await sleep(PUSH_EVERY_MS)
    }
    return count
  })()
  await during()
  running = false
  const count = await pushes
  await sleep(1_000)
  victim.ws.off("message", onMessage)
  return { pushes: count, lost: count - latencies.length, p50: quantile(latencies, 0.5), p99: quantile(latencies, 0.99), max: Math.max(0, ...latencies) }
}

/** Run the WebSocket cases (those `only` names, or all when it is empty) and print their table. */
export const webSocketCommands = async (deployment: Deployment, seconds: number, only: ReadonlyArray<string>): Promise<void> => {
  const frames = costlyFrames(MESSAGE_BYTES)
  const commands = [...new Set(frames.map((f) => f.command))]
  const wanted = (name: string) => only.length === 0 || only.includes(name)
  const victim = await hello(deployment.wsUrl)
  const endpoint = await register(victim)
  const rows: Array<Row> = []
  for (const command of commands) {
    const name = `websocket ${command}`
    if (!wanted(name)) continue
    let sent = 0
    let worstMs = 0
    let worstOf = ""
    const ofCommand = frames.filter((f) => f.command === command)
    const victimFigures = await withVictim(endpoint, victim, async () => {
      const until = performance.now() + seconds * 1000
      while (performance.now() < until) {
        for (const frame of ofCommand) {
          const timed = await timeFrame(deployment.wsUrl, frame)
          sent++
          if (timed.ms > worstMs) [worstMs, worstOf] = [timed.ms, timed.close === undefined ? frame.name : `${frame.name} (closed ${timed.close.code})`]
        }
      }
    })
    rows.push({ name, sent, worstMs, worstOf, victim: victimFigures })
    console.log(`  ${name}: ${sent} frames, worst ${fmt(worstMs)} ms (${worstOf}); victim p99 ${fmt(victimFigures.p99)} ms`)
  }
  if (wanted("websocket never acks")) {
    // A client that reads its pushes and never acks; pushes to it one after the other, as fast as they are answered.
    const hoarder = await hello(deployment.wsUrl)
    const hoarded = await register(hoarder)
    let sent = 0
    let worstMs = 0
    const statuses = new Map<number, number>()
    const victimFigures = await withVictim(endpoint, victim, async () => {
      const until = performance.now() + seconds * 1000
      while (performance.now() < until) {
        const started = performance.now()
        const { status } = await push(hoarded, randomBytes(32))
        worstMs = Math.max(worstMs, performance.now() - started)
        statuses.set(status, (statuses.get(status) ?? 0) + 1)
        sent++
      }
    })
    await hoarder.close()
    const worstOf = `a push to it; answered ${[...statuses].map(([status, n]) => `${status} ×${n}`).join(", ")}; it got ${hoarder.received.filter((f) => f["messageType"] === "notification").length}`
    rows.push({ name: "websocket never acks", sent, worstMs, worstOf, victim: victimFigures })
    console.log(`  websocket never acks: ${sent} pushes, worst ${fmt(worstMs)} ms; victim p99 ${fmt(victimFigures.p99)} ms`)
  }
  await victim.close()
  if (rows.length === 0) return
  console.log(`\nWebSocket commands: the worst server time of one frame (frame sent → the answer of a \`{}\` after it, ms) and the victim's POST→notification latency (ms), ${seconds} s per case`)
  console.log("| case | frames | worst | worst of | victim pushes | lost | p50 | p99 | max |")
  console.log("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
  for (const r of rows) {
    console.log(
      `| ${r.name} | ${r.sent} | ${fmt(r.worstMs)} | ${r.worstOf} | ${r.victim.pushes} | ${r.victim.lost} | ${fmt(r.victim.p50)} | ${fmt(r.victim.p99)} | ${fmt(r.victim.max)} |`
    )
  }
}
