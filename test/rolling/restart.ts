/**
 * A rolling restart under load, for the rolling-restart lane and `bench:rolling`: N clients
 * (`clients.ts`, in ⌈N / 15,000⌉ child processes) connect to a fleet (`fleet.ts`), pushes flow
 * through the endpoint node to random clients at a steady rate, and each connection node in turn
 * is sent SIGTERM (just after a burst of pushes), waited for, started again and waited for until the balancer has it back in
 * service and every client has a working session again. Then the pushes stop, and the run waits
 * until every push answered 201 has arrived (or a minute has passed).
 *
 * With one node and no balancer this is the same storm against one node: all its clients
 * reconnecting to it once it is back.
 */
import { type ChildProcess, fork } from "node:child_process"
import { Agent, request } from "node:http"
import { ask } from "../../bench/storm-node.ts"
import type { Report } from "./clients.ts"
import { type Fleet, startFleet } from "./fleet.ts"

/** Clients one client process holds at most (a process here may open 20,000 files). */
const CLIENTS_PER_PROCESS = 15_000

export interface RollingOptions {
  readonly dsn: string
  readonly clients: number
  readonly nodes: number
  readonly workers: number
  readonly balancers: number
  readonly pushesPerSecond: number
  /**
   * Pushes sent at once just before each SIGTERM, to random clients: some reach the stopping node's
   * clients as it closes them, whose acks are then in flight.
   */
  readonly burstAtSigterm: number
  /** A client waits up to this long (uniformly at random) before it connects again. */
  readonly reconnectDelayMs: number
  /** More flags for the connection nodes. */
  readonly connectionFlags?: ReadonlyArray<string> | undefined
  /** Progress lines (the bench prints them). */
  readonly log?: (line: string) => void
}

export interface NodeRestart {
  readonly node: string
  /** SIGTERM to every process of the node gone, ms. */
  readonly stopMs: number
  /** SIGTERM to every client working again, ms. */
  readonly recoveredMs: number
  /** Each node's open WebSockets once every client was working again. */
  readonly connections: ReadonlyArray<number>
}

export interface RollingResult {
  readonly clients: number
  readonly pushesSent: number
  /** Status → how many pushes were answered with it (0: no answer). */
  readonly pushStatus: Readonly<Record<string, number>>
  /** The data of each push answered 201. */
  readonly accepted: ReadonlyArray<string>
  /** Data received → how many times (every delivery, every client). */
  readonly deliveries: ReadonlyMap<string, number>
  readonly restarts: ReadonlyArray<NodeRestart>
  /** The clients' reports at the end, merged. */
  readonly report: Report
  /** Storage operations of the connection nodes from the first SIGTERM to the end of the last recovery, by operation. */
  readonly storageOperations: Readonly<Record<string, number>>
  /** Each node's open WebSockets before the first SIGTERM. */
  readonly connectionsBefore: ReadonlyArray<number>
  readonly output: ReadonlyArray<string>
}

const merge = (reports: ReadonlyArray<Report>): Report => {
  const counts = (f: (r: Report) => Readonly<Record<string, number>>) => {
    const merged: Record<string, number> = {}
    for (const r of reports) for (const [key, n] of Object.entries(f(r))) merged[key] = (merged[key] ?? 0) + n
    return merged
  }
  const sum = (f: (r: Report) => number) => reports.reduce((a, r) => a + f(r), 0)
  return {
    clients: sum((r) => r.clients),
    working: sum((r) => r.working),
    reconnects: reports.flatMap((r) => r.reconnects),
    closeCodes: counts((r) => r.closeCodes),
    failedAttempts: sum((r) => r.failedAttempts),
    failures: counts((r) => r.failures),
    uaidChanged: sum((r) => r.uaidChanged),
    received: reports.flatMap((r) => r.received)
  }
}

const pushAgent = new Agent({ keepAlive: true, maxSockets: 64 })

/** A push of `data` (TTL 600): its status, 0 when it got no answer. */
const push = (endpoint: string, data: string): Promise<number> =>
  new Promise((resolve) => {
    const body = Buffer.from(data)
    const req = request(endpoint, { method: "POST", agent: pushAgent, headers: { TTL: "600", "Content-Encoding": "aes128gcm", "Content-Length": body.length } }, (res) => {
      res.resume()
      res.on("end", () => resolve(res.statusCode ?? 0))
    })
    req.on("error", () => resolve(0))
    req.end(body)
  })

const until = async (ok: () => Promise<boolean>, timeoutMs: number): Promise<boolean> => {
  for (const deadline = Date.now() + timeoutMs; Date.now() < deadline; await new Promise((r) => setTimeout(r, 250))) {
    if (await ok()) return true
  }
  return false
}

const difference = (after: Record<string, number>, before: Record<string, number>): Record<string, number> =>
  Object.fromEntries(Object.entries(after).map(([operation, n]) => [operation, n - (before[operation] ?? 0)]).filter(([, n]) => n !== 0))

export const rollingRestart = async (options: RollingOptions): Promise<RollingResult> => {
  const log = options.log ?? (() => {})
  const fleet: Fleet = await startFleet(options)
  const processes = Math.ceil(options.clients / CLIENTS_PER_PROCESS)
  const children: Array<ChildProcess> = Array.from({ length: processes }, () =>
    fork(new URL("./clients.ts", import.meta.url).pathname, [], { stdio: ["ignore", "inherit", "inherit", "ipc"] }))
  const reports = async () => merge(await Promise.all(children.map((child) => ask<Report>(child, { cmd: "report" }, "report"))))
  const allWorking = async () => (await reports()).working === options.clients
  const connections = () => Promise.all(fleet.nodes.map((node) => node.connections()))
  try {
    const began = performance.now()
    const endpoints = (await Promise.all(children.map((child, k) => {
      const first = Math.floor((options.clients * k) / processes)
      const count = Math.floor((options.clients * (k + 1)) / processes) - first
      return ask<Array<string>>(child, { cmd: "open", wsUrl: fleet.wsUrl, first, count, inflight: Math.ceil(200 / processes), delayMs: options.reconnectDelayMs }, "opened")
    }))).flat()
    log(`${endpoints.length} clients connected and registered in ${((performance.now() - began) / 1000).toFixed(1)} s`)

    // Pushes at a steady rate to random clients, each with data of its own.
    const pushStatus: Record<string, number> = {}
    const accepted: Array<string> = []
    const inFlight = new Set<Promise<void>>()
    let sent = 0
    const send = () => {
      const data = `push-${sent++}`
      const answered = push(endpoints[Math.floor(Math.random() * endpoints.length)] as string, data).then((status) => {
        pushStatus[status] = (pushStatus[status] ?? 0) + 1
        if (status === 201) accepted.push(data)
        inFlight.delete(answered)
      })
      inFlight.add(answered)
    }
    const pusher = setInterval(send, 1000 / options.pushesPerSecond)

    await new Promise((r) => setTimeout(r, 2_000))
    const connectionsBefore = await connections()
    const operationsBefore = fleet.storageOperations()
    const restarts: Array<NodeRestart> = []
    for (const node of fleet.nodes) {
      for (let n = 0; n < options.burstAtSigterm; n++) send()
      // The burst's first pushes on their way to the nodes.
      await new Promise((r) => setTimeout(r, 5))
      const sigterm = performance.now()
      await node.terminate()
      const stopMs = performance.now() - sigterm
      await node.up()
      await fleet.inService(node)
      // A bound for a loaded machine: two minutes, and 10 ms more a client.
      const recoveryMs = 120_000 + 10 * options.clients
      if (!(await until(allWorking, recoveryMs))) {
        throw new Error(`${options.clients - (await reports()).working} clients were not working again within ${recoveryMs / 1000} s of ${node.name}'s restart`)
      }
      const recoveredMs = performance.now() - sigterm
      const restart = { node: node.name, stopMs, recoveredMs, connections: await connections() }
      log(`${node.name}: stopped in ${(stopMs / 1000).toFixed(1)} s, every client working again ${(recoveredMs / 1000).toFixed(1)} s after SIGTERM; connections now ${restart.connections.join(" / ")}`)
      restarts.push(restart)
    }
    const storageOperations = difference(fleet.storageOperations(), operationsBefore)

    await new Promise((r) => setTimeout(r, 2_000))
    clearInterval(pusher)
    await Promise.all(inFlight)
    const delivered = async () => {
      const got = new Set((await reports()).received)
      return accepted.every((data) => got.has(data))
    }
    await until(delivered, 60_000)
    // Late duplicates, if any, have a moment to arrive.
    await new Promise((r) => setTimeout(r, 1_000))
    const report = await reports()
    const deliveries = new Map<string, number>()
    for (const data of report.received) deliveries.set(data, (deliveries.get(data) ?? 0) + 1)
    return { clients: options.clients, pushesSent: sent, pushStatus, accepted, deliveries, restarts, report, storageOperations, connectionsBefore, output: fleet.output }
  } finally {
    for (const child of children) child.kill()
    await fleet.stop()
  }
}

/** A run's figures: pushes, deliveries, storage operations per reconnect, time from a close to a working session. */
export const figures = (result: RollingResult) => {
  const times = [...result.report.reconnects].sort((a, b) => a - b)
  const at = (q: number) => times[Math.min(times.length - 1, Math.floor(q * times.length))] ?? Number.NaN
  const operations = Object.values(result.storageOperations).reduce((a, b) => a + b, 0)
  const acceptedSet = new Set(result.accepted)
  return {
    pushesSent: result.pushesSent,
    accepted: result.accepted.length,
    delivered: result.accepted.filter((data) => result.deliveries.has(data)).length,
    duplicates: [...result.deliveries.values()].filter((n) => n > 1).length,
    unexpected: [...result.deliveries.keys()].filter((data) => !acceptedSet.has(data)).length,
    reconnects: times.length,
    operationsPerReconnect: times.length === 0 ? Number.NaN : operations / times.length,
    p50Ms: at(0.5),
    p99Ms: at(0.99),
    maxMs: times.at(-1) ?? Number.NaN
  }
}
