/**
 * Stored delivery for `bench:scaling`, as `bench:stored` has it but spread over several clients, so
 * that several processes drain at once: `clients` users subscribe and go away; `messages` messages
 * for each are pushed through the API (32 POSTs at a time, round-robin over the users: each is
 * stored); then every user connects again at once and acks each message as it comes, as Firefox
 * does. The clients run in this process; the server CPU is read from /proc over every server process.
 */
import { randomBytes, randomUUID } from "node:crypto"
import { setTimeout as sleep } from "node:timers/promises"
import { openClient, type TestClient } from "../test/connection/client.ts"
import { hello, push, quantile, register } from "./harness.ts"
import type { Servers } from "./scaling-pipelines.ts"
import { cpuOfMs } from "./scaling-procs.ts"
import { ROUTER_TABLE, storageClient, userItem } from "./stored-tables.ts"

/** A user with one channel, offline: its uaid and its push endpoint. */
export interface User {
  readonly uaid: string
  readonly endpoint: string
}

/** Ours: hello, register a channel, go away. */
export const ourUser = (wsUrl: string) => async (): Promise<User> => {
  const first = await hello(wsUrl)
  const uaid = first.received.find((m) => m["messageType"] === "hello")?.["uaid"] as string
  const endpoint = await register(first)
  await first.close()
  return { uaid, endpoint }
}

/** Bare: the user's router record written directly (it has no registration of its own). */
export const bareUser = (dynamoUrl: string, httpBase: string) => async (): Promise<User> => {
  const uaid = randomUUID().replaceAll("-", "")
  const storage = await storageClient(dynamoUrl)
  await storage.send("PutItem", { TableName: ROUTER_TABLE, Item: userItem(uaid, Date.now()) })
  storage.destroy()
  return { uaid, endpoint: `${httpBase}/push/${uaid}/${randomUUID()}` }
}

/** One phase's figures. */
export interface Phase {
  readonly rate: number
  /** Server CPU µs per message, every server process (storage included), and of which the storage's. */
  readonly cpuUs: number
  readonly storageUs: number
  /** Store: POST→201 p99; drain: hello→last message of a user, p99 over the users (ms). */
  readonly p99: number
}

export interface StoredRun {
  readonly store: Phase
  readonly drain: Phase
  /** What went wrong, if anything: statuses other than 201, messages delivered twice or not at all. */
  readonly problems: ReadonlyArray<string>
}

/** Server CPU from now: the function returned reads [µs per unit, of which the storage's]. */
const serverCpu = (servers: Servers): (units: number) => [number, number] => {
  const pids = servers.pids()
  const [total, storage] = [cpuOfMs(pids), servers.storageCpuMs()]
  return (units) => [((cpuOfMs(pids) - total) * 1000) / units, ((servers.storageCpuMs() - storage) * 1000) / units]
}

/** Pushes `perUser` messages to each user, 32 at a time: how many each had stored (201). */
const store = async (servers: Servers, users: ReadonlyArray<User>, perUser: number, bytes: number, problems: Array<string>) => {
  const total = users.length * perUser
  const stored = users.map(() => 0)
  const latencies: Array<number> = []
  const statuses: Record<number, number> = {}
  const cpu = serverCpu(servers)
  const began = performance.now()
  let sent = 0
  await Promise.all(Array.from({ length: 32 }, async () => {
    while (sent < total) {
      const u = sent++ % users.length
      const posted = performance.now()
      const { status } = await push((users[u] as User).endpoint, randomBytes(bytes))
      latencies.push(performance.now() - posted)
      statuses[status] = (statuses[status] ?? 0) + 1
      if (status === 201) stored[u] = (stored[u] ?? 0) + 1
    }
  }))
  const seconds = (performance.now() - began) / 1000
  const [cpuUs, storageUs] = cpu(total)
  if (statuses[201] !== total) problems.push(`push answers ${JSON.stringify(statuses)}`)
  return { stored, phase: { rate: total / seconds, cpuUs, storageUs, p99: quantile(latencies, 0.99) } }
}

/** One user's drain: hello with its uaid, ack each message as it comes; ms from `began` to the last. */
const drainOne = async (client: TestClient, user: User, expected: number, began: number): Promise<number> => {
  client.send({ messageType: "hello", uaid: user.uaid, use_webpush: true })
  for (let got = 0; got < expected; got++) {
    const n = await client.next((m) => m["messageType"] === "notification", 30_000)
    client.send({ messageType: "ack", updates: [{ channelID: n["channelID"], version: n["version"] }] })
  }
  return performance.now() - began
}

/** Every user connects again at once and drains what was stored for it. */
const drain = async (servers: Servers, users: ReadonlyArray<User>, stored: ReadonlyArray<number>, problems: Array<string>): Promise<Phase> => {
  // Connected first, so that the drain starts with every hello at once.
  const clients = await Promise.all(users.map(() => openClient(servers.wsUrl)))
  const cpu = serverCpu(servers)
  const began = performance.now()
  const done = await Promise.all(clients.map((client, u) => drainOne(client, users[u] as User, stored[u] as number, began)))
  const seconds = Math.max(...done) / 1000
  // The last acks' deletes.
  await sleep(100)
  const total = stored.reduce((a, b) => a + b, 0)
  const [cpuUs, storageUs] = cpu(Math.max(1, total))
  const quiet = await Promise.all(clients.map((client) => client.quiet(500, (m) => m["messageType"] === "notification")))
  if (!quiet.every(Boolean)) problems.push(`${quiet.filter((q) => !q).length} client(s) got more than was stored`)
  await Promise.all(clients.map((client) => client.close()))
  return { rate: total / seconds, cpuUs, storageUs, p99: quantile(done, 0.99) }
}

/** Subscribe `clients` users, store `perUser` messages for each, drain them. */
export const measureStored = async (
  servers: Servers,
  subscribe: () => Promise<User>,
  clients: number,
  perUser: number,
  bytes: number
): Promise<StoredRun> => {
  const users = await Promise.all(Array.from({ length: clients }, subscribe))
  const problems: Array<string> = []
  const { stored, phase } = await store(servers, users, perUser, bytes, problems)
  return { store: phase, drain: await drain(servers, users, stored, problems), problems }
}
