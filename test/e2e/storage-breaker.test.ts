/**
 * The storage breaker on a real store: separate nodes on PostgreSQL reached through a TCP proxy
 * that counts the connections the nodes open. The proxy goes down for 10 s (every connection it
 * has is reset, every new one accepted, counted and reset: a database that is gone) while pushes
 * to a client that is away (they need storage) and hellos keep coming: pushes are answered 503
 * with a Retry-After no longer than the breaker's back-off, hellos are closed, and the nodes open
 * a bounded number of connections to the database meanwhile — where, without the breaker
 * (`storage_breaker_threshold` 0), every push is one more connection attempt. Once the proxy is
 * up again, both nodes store and route again without a restart.
 */
import { createServer, connect as tcpConnect, type Server, type Socket } from "node:net"
import { afterAll, expect, it } from "vitest"
import { openClient } from "../connection/client.ts"
import { describePostgres } from "../storage/postgresServer.ts"
import { type Deployment, startOnPostgres } from "./servers.ts"

/** A TCP proxy to `target` that counts the connections it accepts, and can play a dead server. */
const countingProxy = async (target: { readonly host: string; readonly port: number }) => {
  const state = { down: false, accepted: 0 }
  const open = new Set<Socket>()
  const server: Server = createServer((client) => {
    state.accepted++
    if (state.down) return void client.resetAndDestroy()
    const upstream = tcpConnect(target.port, target.host)
    open.add(client)
    open.add(upstream)
    const close = () => {
      client.destroy()
      upstream.destroy()
      open.delete(client)
      open.delete(upstream)
    }
    client.on("error", close).on("close", close)
    upstream.on("error", close).on("close", close)
    client.pipe(upstream).pipe(client)
  })
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  const port = (server.address() as { readonly port: number }).port
  return {
    port,
    state,
    down: () => {
      state.down = true
      for (const socket of open) socket.resetAndDestroy()
      open.clear()
    },
    up: () => void (state.down = false),
    close: () => new Promise<void>((resolve) => server.close(() => resolve()))
  }
}

const subscribe = async (wsUrl: string) => {
  const ws = await openClient(wsUrl)
  ws.send({ messageType: "hello", use_webpush: true })
  const hello = await ws.next((f) => f["messageType"] === "hello")
  ws.send({ messageType: "register", channelID: crypto.randomUUID() })
  const reply = await ws.next((f) => f["messageType"] === "register")
  return { ws, uaid: hello["uaid"] as string, endpoint: reply["pushEndpoint"] as string }
}

const OUTAGE_MS = 10_000

interface OutageFigures {
  readonly connections: number
  readonly statuses: Record<string, number>
  readonly retryAfters: ReadonlyArray<number>
  /** Slowest answer to a push (ms) once the first 503 came. */
  readonly slowest503Ms: number
  readonly hellos: ReadonlyArray<{ readonly code: number; readonly reason: string }>
  /** ms from the proxy back up to the first push stored again. */
  readonly recoveredMs: number
}

/** Deployment on the proxy; the proxy down for `OUTAGE_MS` under pushes and hellos; figures of it. */
const outage = async (dsn: string, env: Readonly<Record<string, string>>, keep: Array<Deployment>): Promise<OutageFigures> => {
  const url = new URL(dsn)
  const proxy = await countingProxy({ host: url.hostname, port: Number(url.port || 5432) })
  try {
    url.hostname = "127.0.0.1"
    url.port = String(proxy.port)
    const deployment = await startOnPostgres(url.href, { env })
    keep.push(deployment)
    const client = await subscribe(deployment.wsUrl)
    await client.ws.close()
    const statuses: Record<string, number> = {}
    const retryAfters: Array<number> = []
    let first503: number | undefined
    let slowest503Ms = 0
    let stop = false
    const push = async () => {
      const started = Date.now()
      const res = await fetch(client.endpoint, { method: "POST", headers: { ttl: "600" }, signal: AbortSignal.timeout(15_000) })
      await res.text()
      statuses[res.status] = (statuses[res.status] ?? 0) + 1
      if (res.status === 503) {
        first503 ??= Date.now()
        retryAfters.push(Number(res.headers.get("retry-after")))
      }
      if (first503 !== undefined && started > first503) slowest503Ms = Math.max(slowest503Ms, Date.now() - started)
      return res.status
    }
    expect(await push()).toBe(201)
    const before = proxy.state.accepted
    proxy.down()
    const senders = Promise.all(Array.from({ length: 4 }, async () => {
      while (!stop) {
        await push().catch(() => void (statuses["0"] = (statuses["0"] ?? 0) + 1))
        await new Promise((r) => setTimeout(r, 10))
      }
    }))
    const hellos: Array<{ readonly code: number; readonly reason: string }> = []
    const until = Date.now() + OUTAGE_MS
    while (Date.now() < until - 1_000) {
      const ws = await openClient(deployment.wsUrl)
      ws.send({ messageType: "hello", use_webpush: true, uaid: client.uaid })
      hellos.push(await ws.closed)
      await new Promise((r) => setTimeout(r, 1_000))
    }
    await new Promise((r) => setTimeout(r, Math.max(0, until - Date.now())))
    stop = true
    await senders
    const connections = proxy.state.accepted - before
    proxy.up()
    const back = Date.now()
    // Back without a restart: a push to the client away is stored again (the breaker's next probe, at most its longest back-off away).
    let status = 0
    while (status !== 201 && Date.now() - back < 30_000) {
      status = await push().catch(() => 0)
      if (status !== 201) await new Promise((r) => setTimeout(r, 100))
    }
    return { connections, statuses, retryAfters, slowest503Ms, hellos, recoveredMs: status === 201 ? Date.now() - back : Number.NaN }
  } finally {
    await proxy.close()
  }
}

const both = (name: string, value: string) => ({ [`AUTOCONNECT__${name}`]: value, [`AUTOEND__${name}`]: value })

describePostgres("the storage breaker on PostgreSQL (separate nodes)", (dsn) => {
  const deployments: Array<Deployment> = []
  afterAll(async () => {
    for (const d of deployments.reverse()) await d.stop()
  })

  it("a dead database: pushes shed 503 with the probe's Retry-After, hellos closed, connections bounded; back without a restart", async () => {
    const env = { ...both("STORAGE_BREAKER_MAX_BACKOFF", "4"), AUTOEND__RATE_LIMIT_PER_SUBSCRIPTION: "0", AUTOEND__MAX_STORED_PER_SUBSCRIPTION: "0" }
    const on = await outage(dsn, env, deployments)
    const off = await outage(dsn, { ...env, ...both("STORAGE_BREAKER_THRESHOLD", "0") }, deployments)
    console.log(
      `storage breaker, ${OUTAGE_MS / 1000} s outage: ${on.connections} connections to the database with the breaker, ${off.connections} without; ` +
        `pushes ${JSON.stringify(on.statuses)} vs ${JSON.stringify(off.statuses)}; slowest 503 once shedding ${on.slowest503Ms} ms vs ${off.slowest503Ms} ms; ` +
        `back ${on.recoveredMs} ms after the database (without: ${off.recoveredMs} ms)`
    )
    // Every push of the outage answered, and each 503 says to retry within the longest back-off.
    expect(Object.keys(on.statuses).filter((s) => s !== "201" && s !== "503"), JSON.stringify(on.statuses)).toEqual([])
    expect(on.statuses["503"] ?? 0).toBeGreaterThan(0)
    // The failures that opened the breaker (5), those in flight then (a push per sender: 4) and the
    // failed probes (back-offs of at least 0.5, 1, 2, 2, … s: at most 6 in 10 s) carry the usual
    // 120 s; the refused ones, the seconds to the next probe.
    const usual = on.retryAfters.filter((seconds) => seconds === 120)
    const probe = on.retryAfters.filter((seconds) => seconds !== 120)
    expect(usual.length, "503s that reached the database").toBeLessThanOrEqual(5 + 4 + 6)
    expect(probe.length).toBeGreaterThan(0)
    for (const seconds of probe) expect(seconds, "Retry-After within the longest back-off").toSatisfy((s: number) => s >= 1 && s <= 4)
    expect(on.hellos.length).toBeGreaterThanOrEqual(3)
    for (const closed of on.hellos) expect(closed).toEqual({ code: 1011, reason: "StorageError" })
    // Bounded: per process, the failures that open the breaker and what was in flight, then one probe per back-off.
    expect(on.connections, `connections to the database during the outage`).toBeLessThanOrEqual(60)
    expect(off.connections, "without the breaker, every operation is a connection attempt").toBeGreaterThan(on.connections * 3)
    expect(on.recoveredMs, "stored again after the database came back").not.toBeNaN()
  }, 240_000)
})

