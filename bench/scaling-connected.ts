/**
 * Connected delivery for `bench:scaling`, with the clients and load generator of `bench:delivery`
 * (`delivery-clients.ts`, one child process): against ours, a share of the clients register, ours
 * restarts, and they say hello again with their uaid (resumed) while the rest join as new clients;
 * against bare, every client is new. A level is c POSTs at a time round-robin over the clients;
 * the server CPU is read from /proc over every server process just before and just after it. Then
 * (ours) a sample of the level's messages is looked up in the workers' traces: the share of each
 * group delivered directly (through the router port of the worker holding the client), not stored.
 */
import { join } from "node:path"
import { setTimeout as sleep } from "node:timers/promises"
import type { DirectShare, LevelResult } from "./delivery-clients.ts"
import type { Ours, Servers } from "./scaling-pipelines.ts"
import { ask, cpuOfMs, forkNode, next, type Proc } from "./scaling-procs.ts"
import type { Routes } from "./trace.ts"

/** Messages per group and level looked up in the traces, as in bench:delivery. */
const SHARE_SAMPLE = 200

const here = new URL(".", import.meta.url).pathname

/** One measured level. */
export interface ConnectedRun {
  readonly rate: number
  /** Server CPU µs per notification, every server process (storage included). */
  readonly cpuUs: number
  /** Of which the storage's. */
  readonly storageUs: number
  /** POST→client p99, ms: all messages, those to resumed clients, those to new ones. */
  readonly p99: number
  readonly p99Resumed: number
  readonly p99New: number
  /** The clients' and load generator's process: CPU µs per notification, and its share of one core. */
  readonly loadgenUs: number
  readonly loadgenBusy: number
  /** Notifications not accepted or not received. */
  readonly missing: number
  /** Ours: the share of a sample of the messages to resumed and to new clients delivered directly (0–1). */
  readonly directResumed: number
  readonly directNew: number
}

const directOf = (routes: Routes | undefined): number =>
  routes === undefined ? Number.NaN : routes.direct / Math.max(1, routes.direct + routes.stored + routes.unknown)

const subscribed = async (clients: Proc, predicate: (m: Record<string, unknown>) => boolean, expected: number) => {
  const answer = await next<{ ready?: number; registered?: number; failed: number }>(clients, predicate, 180_000)
  const n = answer.ready ?? answer.registered ?? 0
  if (answer.failed > 0 || n !== expected) {
    throw new Error(`${clients.name}: ${n} of ${expected} clients subscribed, ${answer.failed} failed; last output:\n${clients.output.slice(-15).join("\n")}`)
  }
}

/** Bare: `k` new clients. */
export const bareClients = async (servers: Servers & { readonly httpBase: string }, k: number, dir: string): Promise<Proc> => {
  const clients = forkNode("bare clients", join(here, "delivery-clients.ts"), ["bare", servers.wsUrl, String(k), servers.httpBase], dir)
  await subscribed(clients, (m) => "ready" in m, k)
  return clients
}

/** Ours: `resumed` of the `k` clients register, ours restarts, a second passes, they come back with their uaids; the rest are new. */
export const ourClients = async (ours: Ours, k: number, resumed: number, dir: string): Promise<Proc> => {
  const clients = forkNode("our clients", join(here, "delivery-clients.ts"), ["autopush", ours.wsUrl, String(k), ours.routerUrls, String(resumed)], dir)
  await subscribed(clients, (m) => "registered" in m || "ready" in m, resumed)
  await ours.restart()
  // As in bench:delivery: the resumed clients were away for more than a second.
  await sleep(1_100)
  const answer = subscribed(clients, (m) => "ready" in m, k)
  clients.child.send({ cmd: "resume" })
  await answer
  return clients
}

/** One level of `count` notifications, `c` at a time, on keep-alive connections opened just before. */
export const measureLevel = async (servers: Servers, clients: Proc, c: number, count: number): Promise<ConnectedRun> => {
  const timeoutMs = 60_000 + count * 20
  await ask(clients, { cmd: "warm", c }, (m) => "warmed" in m, 60_000)
  const pids = servers.pids()
  const [cpuBefore, storageBefore] = [cpuOfMs(pids), servers.storageCpuMs()]
  const { level } = await ask<{ level: LevelResult }>(clients, { cmd: "level", c, count, timeoutMs }, (m) => "level" in m, timeoutMs + 10_000)
  // Let the last acks land before reading the CPU.
  await sleep(100)
  const [cpuAfter, storageAfter] = [cpuOfMs(pids), servers.storageCpuMs()]
  // After the CPU reading: the lookups are not part of the level.
  const share = servers.name === "ours"
    ? (await ask<{ share: DirectShare }>(clients, { cmd: "share", count: SHARE_SAMPLE }, (m) => "share" in m, 60_000)).share
    : undefined
  return {
    rate: level.received / (level.wallMs / 1000),
    cpuUs: ((cpuAfter - cpuBefore) * 1000) / count,
    storageUs: ((storageAfter - storageBefore) * 1000) / count,
    p99: level.p99Client,
    p99Resumed: level.byGroup.resumed.p99Client,
    p99New: level.byGroup.fresh.p99Client,
    loadgenUs: level.clientCpuUs / count,
    loadgenBusy: level.clientCpuUs / 1000 / level.wallMs,
    missing: count - Math.min(level.accepted, level.received),
    directResumed: directOf(share?.resumed),
    directNew: directOf(share?.fresh)
  }
}
