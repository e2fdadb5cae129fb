/**
 * Separate nodes on PostgreSQL (`--db-dsn`), as real processes: `autoconnect` and `autoendpoint`
 * sharing one server — a push routed from the endpoint node to the connection node, a push stored
 * for a client that is away and drained when it comes back; two of each node, every endpoint node
 * reaching clients on every connection node; the server stopped for 10 s under load and started
 * again (pushes answered 503 or 201 meanwhile, every 201 delivered exactly once, hellos meanwhile
 * closed and their clients resumed after, the nodes back by themselves); the maintenance tools on it; and start-up failures in one line naming db_dsn (a
 * bad URL, a wrong password, a server that is not there).
 *
 * The server: as `test/storage/postgres.test.ts` finds it (`postgresServer.ts`: the DSN CI sets,
 * or a throwaway cluster where PostgreSQL is installed); the outage test runs a cluster of its own.
 */
import { spawn } from "node:child_process"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import pg from "pg"
import { afterAll, describe, expect, it } from "vitest"
import { generateFernetKey } from "../../src/crypto/fernet.ts"
import { openClient, type TestClient } from "../connection/client.ts"
import { describePostgres, privatePostgres } from "../storage/postgresServer.ts"
import { type Deployment, deliveredAs, freePorts, startOnPostgres } from "./servers.ts"

const root = new URL("../../", import.meta.url).pathname

interface Client {
  readonly ws: TestClient
  readonly uaid: string
  /** How many times each version arrived. */
  readonly received: Map<string, number>
}

/** A client that acks everything, as Firefox does, counting what it receives. */
const connect = async (wsUrl: string, uaid?: string): Promise<Client> => {
  const ws = await openClient(wsUrl)
  const received = new Map<string, number>()
  ws.ws.on("message", (data) => {
    const frame = JSON.parse(data.toString()) as Record<string, unknown>
    if (frame["messageType"] !== "notification") return
    const version = frame["version"] as string
    received.set(version, (received.get(version) ?? 0) + 1)
    ws.send({ messageType: "ack", updates: [{ channelID: frame["channelID"], version, code: 100 }] })
  })
  ws.send({ messageType: "hello", use_webpush: true, ...(uaid === undefined ? {} : { uaid }) })
  const hello = await ws.next((f) => f["messageType"] === "hello")
  expect(hello["status"]).toBe(200)
  return { ws, uaid: hello["uaid"] as string, received }
}

/**
 * `connect` again after a second until a hello is answered, as Firefox does after a failed one:
 * right after the server is back, hellos are closed 1011 until the node's storage breaker lets its
 * next probe through (its back-off grew during the outage).
 */
const reconnect = async (url: string, uaid: string, timeoutMs = 45_000) => {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    try {
      return await connect(url, uaid)
    } catch (error) {
      if (Date.now() > deadline) throw error
      await new Promise((r) => setTimeout(r, 1_000))
    }
  }
}

const subscribe = async (deployment: Deployment) => {
  const client = await connect(deployment.wsUrl)
  client.ws.send({ messageType: "register", channelID: crypto.randomUUID() })
  const reply = await client.ws.next((f) => f["messageType"] === "register")
  return { ...client, endpoint: reply["pushEndpoint"] as string }
}

const messageIdOf = (res: Response): string => {
  const location = res.headers.get("location") as string
  return location.slice(location.lastIndexOf("/") + 1)
}

const until = async (done: () => boolean, timeoutMs: number) => {
  const deadline = Date.now() + timeoutMs
  while (!done() && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50))
}

describePostgres("separate nodes on PostgreSQL", (dsn) => {
  const deployments: Array<Deployment> = []
  afterAll(async () => {
    for (const d of deployments.reverse()) await d.stop()
  })

  describe("separate nodes on PostgreSQL", () => {
    it("a push routed between the nodes; one stored for a client away, drained when it comes back", async () => {
      const deployment = await startOnPostgres(dsn)
      deployments.push(deployment)
      expect(deployment.output.join("\n")).not.toMatch(/storage .*SQLite/)

      const online = await subscribe(deployment)
      const direct = await fetch(online.endpoint, { method: "POST", headers: { ttl: "600" } })
      expect(direct.status).toBe(201)
      await until(() => online.received.size === 1, 10_000)
      expect([...online.received]).toEqual([[messageIdOf(direct), 1]])
      expect(await deliveredAs(deployment, messageIdOf(direct))).toBe("direct")

      const away = await subscribe(deployment)
      await away.ws.close()
      const stored = await fetch(away.endpoint, { method: "POST", headers: { ttl: "600" } })
      expect(stored.status).toBe(201)
      const back = await connect(deployment.wsUrl, away.uaid)
      expect(back.uaid).toBe(away.uaid)
      await until(() => back.received.size === 1, 10_000)
      expect([...back.received]).toEqual([[messageIdOf(stored), 1]])
      await online.ws.close()
      await back.ws.close()
    }, 90_000)

    it("two connection nodes and two endpoint nodes on one server: a push through either endpoint node reaches a client on either connection node", async () => {
      const first = await startOnPostgres(dsn)
      deployments.push(first)
      const second = await startOnPostgres(dsn, { joining: first })
      deployments.push(second)
      const through = (endpoint: string, node: Deployment) => {
        const url = new URL(endpoint)
        url.port = new URL(node.endpointUrl).port
        return url.href
      }
      const onFirst = await subscribe(first)
      const onSecond = await subscribe(second)
      let expected = 0
      for (const [client, node] of [[onFirst, second], [onSecond, first], [onFirst, first], [onSecond, second]] as const) {
        const res = await fetch(through(client.endpoint, node), { method: "POST", headers: { ttl: "600" } })
        expect(res.status, await res.text()).toBe(201)
        expected++
        await until(() => onFirst.received.size + onSecond.received.size === expected, 10_000)
        expect(client.received.get(messageIdOf(res)), `push ${expected}`).toBe(1)
      }
      expect([onFirst.received.size, onSecond.received.size]).toEqual([2, 2])
      await onFirst.ws.close()
      await onSecond.ws.close()
    }, 90_000)

    it("each node's ready line names the database (host, port, database, never the password); while the server is down both nodes' health names PostgreSQL and the error, OK once it is back", async () => {
      const cluster = await privatePostgres()
      try {
        const deployment = await startOnPostgres(cluster.dsn)
        try {
          const url = new URL(deployment.storageDsn)
          const ready = deployment.output.flatMap((line) => {
            const msg = line.startsWith("{") ? (JSON.parse(line) as { Fields: { msg: string } }).Fields.msg : ""
            return msg.startsWith("ready: ") ? [msg] : []
          })
          expect(ready, deployment.output.join("\n")).toHaveLength(2)
          for (const line of ready) {
            expect(line).toContain(` · storage PostgreSQL at ${url.host}${url.pathname} · `)
            // The test server's password is its database's name: the user's part of the URL is what must not show.
            expect(line).not.toContain(`${url.username}:${url.password}`)
            expect(line).not.toContain("@")
          }
          const heartbeats = async () =>
            Promise.all([`${deployment.endpointUrl}/__heartbeat__`, `${deployment.routerUrl}/__heartbeat__`].map(async (route) => {
              const res = await fetch(route)
              return { status: res.status, body: await res.json() as Record<string, { cause?: string }> }
            }))
          const settled = async (status: number) => {
            const deadline = Date.now() + 20_000
            for (let seen = await heartbeats(); ; seen = await heartbeats()) {
              if (seen.every((h) => h.status === status) || Date.now() > deadline) return seen
              await new Promise((r) => setTimeout(r, 250))
            }
          }
          cluster.stop()
          const [endpoint, connection] = await settled(503)
          const cause = new RegExp(`^PostgreSQL at ${url.host.replaceAll(".", "\\.")}${url.pathname} is unavailable: \\S`)
          expect(endpoint!.status).toBe(503)
          expect(endpoint!.body["router_table"]?.cause).toMatch(cause)
          expect(endpoint!.body["message_table"]?.cause).toMatch(cause)
          expect(connection!.status).toBe(503)
          expect(connection!.body["storage"]?.cause).toMatch(cause)
          cluster.start()
          expect((await settled(200)).map((h) => h.status)).toEqual([200, 200])
        } finally {
          await deployment.stop()
        }
      } finally {
        cluster.remove()
      }
    }, 90_000)

    it("the server stopped for 10 s under load and started again: every push answered 201 or 503, every 201 delivered exactly once, hellos meanwhile closed and resumed after", async () => {
      const cluster = await privatePostgres()
      /** How each hello said while the server was down ended. */
      const hellosMeanwhile: Array<{ readonly code: number; readonly reason: string }> = []
      try {
        const deployment: Deployment = await startOnPostgres(cluster.dsn, {
          // The load stores over a hundred messages for each offline client, past the default
          // msg_limit (100), at which a user is dropped and its messages with it, and past the
          // default max_stored_per_subscription (100) and rate_limit_per_subscription (240 a
          // minute), beyond which pushes are refused 429: this test is about the outage, not those bounds.
          env: { AUTOCONNECT__MSG_LIMIT: "10000", AUTOEND__MAX_STORED_PER_SUBSCRIPTION: "0", AUTOEND__RATE_LIMIT_PER_SUBSCRIPTION: "0" },
          outage: async (downMs) => {
            cluster.stop()
            const until = Date.now() + downMs
            // Clients saying hello meanwhile, one after another: each socket closed cleanly, no uaid handed out.
            while (Date.now() < until - 1_000) {
              const ws = await openClient(deployment.wsUrl)
              ws.send({ messageType: "hello", use_webpush: true, uaid: offline[0]!.uaid })
              hellosMeanwhile.push(await ws.closed)
              expect(ws.received.filter((f) => f["messageType"] === "hello" && f["status"] === 200)).toEqual([])
              await new Promise((r) => setTimeout(r, 1_000))
            }
            await new Promise((r) => setTimeout(r, Math.max(0, until - Date.now())))
            cluster.start()
          }
        })
        deployments.push(deployment)
        const clients = await Promise.all(Array.from({ length: 6 }, () => subscribe(deployment)))
        const offline = await Promise.all(Array.from({ length: 3 }, () => subscribe(deployment)))
        for (const c of offline) await c.ws.close()
        const everyone = [...clients, ...offline]
        const accepted = new Map<string, Array<string>>()
        const statuses = new Map<number, number>()
        let stop = false
        // Four senders at once, each pushing as soon as it has its answer (and 10 ms more).
        const load = Promise.all(Array.from({ length: 4 }, async (_, sender) => {
          for (let i = sender; !stop; i += 4) {
            const client = everyone[i % everyone.length]!
            try {
              const res = await fetch(client.endpoint, { method: "POST", headers: { ttl: "600" }, signal: AbortSignal.timeout(10_000) })
              statuses.set(res.status, (statuses.get(res.status) ?? 0) + 1)
              if (res.status === 201) accepted.set(client.uaid, [...(accepted.get(client.uaid) ?? []), messageIdOf(res)])
              else await res.text()
            } catch {
              // No answer (refused, reset, or none within 10 s): counted as status 0, which fails below.
              statuses.set(0, (statuses.get(0) ?? 0) + 1)
            }
            await new Promise((r) => setTimeout(r, 10))
          }
        }))
        await new Promise((r) => setTimeout(r, 1_000))
        const before = statuses.get(201) ?? 0
        await deployment.storageOutage!(10_000)
        const during = statuses.get(503) ?? 0
        // The pool reconnects on its next operation: pushes are stored and routed again.
        await new Promise((r) => setTimeout(r, 3_000))
        stop = true
        await load
        const seen = Object.fromEntries(statuses)
        expect(hellosMeanwhile.length, "hellos while the server was down").toBeGreaterThanOrEqual(3)
        for (const closed of hellosMeanwhile) expect(closed, "a hello while the server was down").toEqual({ code: 1011, reason: "StorageError" })
        expect(before, JSON.stringify(seen)).toBeGreaterThan(0)
        expect(during, `no 503 while the server was down: ${JSON.stringify(seen)}`).toBeGreaterThan(0)
        expect((statuses.get(201) ?? 0) - before, `no recovery: ${JSON.stringify(seen)}`).toBeGreaterThan(0)
        expect(Object.keys(seen).map(Number).filter((s) => s !== 201 && s !== 503), JSON.stringify(seen)).toEqual([])

        // The offline clients (the one whose hellos failed among them) resume their uaids once it is back.
        const back = await Promise.all(offline.map((c) => reconnect(deployment.wsUrl, c.uaid)))
        expect(back.map((c) => c.uaid)).toEqual(offline.map((c) => c.uaid))
        const receivers = new Map([...clients, ...back].map((c) => [c.uaid, c]))
        const missing = () => [...accepted].flatMap(([uaid, ids]) => ids.filter((id) => !receivers.get(uaid)!.received.has(id)))
        await until(() => missing().length === 0, 20_000)
        expect(missing(), "accepted but never delivered").toEqual([])
        const twice = [...receivers.values()].flatMap((c) => [...c.received].filter(([, n]) => n > 1))
        expect(twice, "delivered more than once").toEqual([])
        // What a client got was accepted: nothing answered 503 arrived after all.
        const unasked = [...receivers].flatMap(([uaid, c]) => [...c.received.keys()].filter((id) => !(accepted.get(uaid) ?? []).includes(id)))
        expect(unasked, "delivered without a 201").toEqual([])
        for (const c of receivers.values()) await c.ws.close()
      } finally {
        cluster.remove()
      }
    }, 150_000)
  })

  describe("the maintenance tools on PostgreSQL (db_dsn in the environment)", () => {
    it("create-tables, list-tables, drop-tables; export refused, naming PostgreSQL's own tools", async () => {
      const schema = `tools_${Date.now().toString(36)}${process.pid.toString(36)}`
      const admin = new pg.Client({ connectionString: dsn })
      await admin.connect()
      await admin.query(`CREATE SCHEMA ${schema}`)
      try {
        const url = new URL(dsn)
        url.searchParams.set("options", `-c search_path=${schema}`)
        const tool = (args: ReadonlyArray<string>) =>
          new Promise<{ readonly code: number | null; readonly out: string }>((resolve) => {
            const child = spawn(process.execPath, [join(root, "src/bin/maintenance.ts"), ...args], {
              cwd: mkdtempSync(join(tmpdir(), "autopush-pg-tools-")),
              env: { ...process.env, AUTOPUSH__DB_DSN: url.href },
              stdio: ["ignore", "pipe", "pipe"]
            })
            let out = ""
            child.stdout.on("data", (c: Buffer) => (out += c.toString()))
            child.stderr.on("data", (c: Buffer) => (out += c.toString()))
            child.on("exit", (code) => resolve({ code, out }))
          })
        const created = await tool(["create-tables"])
        expect(created.code, created.out).toBe(0)
        expect(created.out).toContain("PostgreSQL at ")
        expect(created.out).not.toContain("autopush:autopush@")
        const { rows } = await admin.query("SELECT tablename FROM pg_tables WHERE schemaname = $1 ORDER BY tablename", [schema])
        const tables = rows.map((row) => String(row["tablename"]))
        expect(tables).toEqual(expect.arrayContaining(["router", "router_broadcasts", "router_receipts"]))
        const months = tables.filter((t) => /^message_\d{4}_\d{2}$/.test(t))
        expect(months.length).toBeGreaterThanOrEqual(3)
        const listed = await tool(["list-tables"])
        expect(listed.code, listed.out).toBe(0)
        for (const month of months) expect(listed.out).toContain(month)
        await admin.query(`CREATE TABLE ${schema}.message_2020_01 (LIKE ${schema}.${months[0]} INCLUDING ALL)`)
        const dropped = await tool(["drop-tables", "--older-than", "3", "--yes"])
        expect(dropped.code, dropped.out).toBe(0)
        expect((await admin.query("SELECT 1 FROM pg_tables WHERE schemaname = $1 AND tablename = 'message_2020_01'", [schema])).rows).toEqual([])
        const exported = await tool(["export", "--out", join(mkdtempSync(join(tmpdir(), "autopush-pg-tools-")), "x.jsonl")])
        expect(exported.code).not.toBe(0)
        expect(exported.out).toContain("pg_dump")
      } finally {
        await admin.query(`DROP SCHEMA ${schema} CASCADE`)
        await admin.end()
      }
    }, 90_000)
  })

  describe("start-up failures on PostgreSQL: one line naming db_dsn, exit 1", () => {
    const run = (args: ReadonlyArray<string>) =>
      new Promise<{ readonly code: number | null; readonly stderr: string }>((resolve) => {
        const child = spawn(process.execPath, [join(root, "src/bin/autoconnect.ts"), ...args], {
          cwd: mkdtempSync(join(tmpdir(), "autopush-pg-startup-")),
          stdio: ["ignore", "ignore", "pipe"]
        })
        let stderr = ""
        child.stderr.on("data", (c: Buffer) => (stderr += c.toString()))
        const timer = setTimeout(() => child.kill("SIGKILL"), 30_000)
        child.on("exit", (code) => {
          clearTimeout(timer)
          resolve({ code, stderr })
        })
      })
    const withDsn = async (value: string) => {
      const [port, router] = await freePorts(2)
      return run(["--port", String(port), "--router-port", String(router), "--crypto-key", generateFernetKey(), "--endpoint-url", "http://127.0.0.1:8082", "--db-dsn", value])
    }
    const oneLine = (result: { readonly code: number | null; readonly stderr: string }, expected: RegExp) => {
      expect(result.code, result.stderr).toBe(1)
      const lines = result.stderr.trim().split("\n")
      expect(lines, result.stderr).toHaveLength(1)
      expect(lines[0]).toMatch(expected)
      expect(result.stderr).not.toMatch(/^\s+at /m)
    }

    it("a URL that is not postgres://, several hosts, a wrong password, a server that is not there", async () => {
      const bad = await withDsn("http://autopush:secret-word@127.0.0.1/autopush")
      oneLine(bad, /^autoconnect: configuration error: db_dsn: .* is not a postgres:\/\/ URL/)
      expect(bad.stderr, "the password is never printed").not.toContain("secret-word")
      // libpq's list of hosts is refused: the address operators move at a failover is the one host.
      oneLine(await withDsn("postgres://autopush:secret-word@10.0.0.5:5432,10.0.0.8:5432/autopush"), /^autoconnect: configuration error: db_dsn: .* is not a postgres:\/\/ URL/)

      const wrong = new URL(dsn)
      wrong.password = "not-the-password"
      const refused = await withDsn(wrong.href)
      oneLine(refused, /^autoconnect: cannot start: PostgreSQL at .* cannot be used \(option db_dsn\): the server refused the user name or password/)
      expect(refused.stderr).not.toContain("not-the-password")

      const [nobody] = await freePorts(1)
      const nowhere = new URL(dsn)
      nowhere.port = String(nobody)
      oneLine(await withDsn(nowhere.href), /^autoconnect: cannot start: PostgreSQL at 127\.0\.0\.1:\d+\/\w+ cannot be used \(option db_dsn\): the server cannot be reached/)
    }, 90_000)
  })
})
