/**
 * The month turns while clients come and go, on real processes and real storage: the all-in-one
 * `autopush` (embedded storage), and separate `autoconnect` + `autoendpoint` nodes sharing a storage
 * server (`npm run storage`) or PostgreSQL (`db_dsn`: the server the PostgreSQL tests use,
 * `test/storage/postgresServer.ts`; its own clock is not moved: nothing of ours reads it). Every process of a deployment runs on one faked wall clock
 * (libfaketime, `fakeClock.ts`), as the machines of a cluster share one clock through NTP; the
 * monotonic clock, which timers run on, stays real.
 *
 * Message tables are monthly (`message_YYYY_MM`): new users go to the current month's table, and a
 * returning user still on last month's table is moved to the current one. Timeline (UTC, faked):
 *
 * - 2027-01-26 12:00: the processes start. A, B and D say hello and register; pushes reach them.
 * - The clock is moved to 2027-01-31 23:59:40 (20 s before the month turns). A stays connected; B
 *   and D leave; pushes to B and D are stored (201). The endpoint now holds B's and D's router
 *   records, offline and naming January's table, in its router cache (reused for up to
 *   `router_cache_ttl`, 60 s).
 * - Real time passes until the clock reads 2027-02-01 00:00:01 (every process reads it too). With
 *   no maintenance command run:
 *   - B comes back and a push is sent to it right after its hello reply: B gets what was stored and
 *     that push, each once;
 *   - D comes back, takes what was stored, its record moves to February's table, and only then a
 *     push is sent to it (the endpoint's cached record still names January's table): D gets it once;
 *   - a new client C registers (status 200) and a push reaches it;
 *   - A, connected across midnight, gets a push directly;
 *   - B comes back once more: nothing it acked comes again;
 *   - `/__heartbeat__` of the endpoint answers 200, message table "OK".
 * - Every push answered 201 reached its client exactly once (counted by `version`).
 *
 * Each step is one test, so a run says which of them hold; a step whose prerequisite failed says so.
 * A failing step's error carries the processes' clock and their last output lines.
 */
import { Effect } from "effect"
import { afterAll, beforeAll, describe, it } from "vitest"
import type { UserRecord } from "../../src/domain/user.ts"
import { Storage } from "../../src/storage/Storage.ts"
import { openClient, type TestClient } from "../connection/client.ts"
import { type Deployment, deliveredAs, startAllInOne, startOnPostgres, startSeparate, type StartOptions, storageOf } from "../e2e/servers.ts"
import { testPostgres } from "../storage/postgresServer.ts"
import { ack } from "../e2e/userAgent.ts"
import { clockOf, type FakeClock, makeFakeClock } from "./fakeClock.ts"

/** When the processes start (faked): the 26th of the month, noon UTC. */
const STARTED = Date.UTC(2027, 0, 26, 12, 0, 0)
/** The month turns: 2027-02-01 00:00:00 UTC. */
const MIDNIGHT = Date.UTC(2027, 1, 1, 0, 0, 0)
/** Where the clock is moved to while the processes run. */
const BEFORE_MIDNIGHT = MIDNIGHT - 20_000
const LAST_MONTH_TABLE = "message_2027_01"
const NEW_MONTH_TABLE = "message_2027_02"

/** A week: no message expires while the test runs, so what comes again after an ack is a redelivery. */
const TTL = "604800"
/** How far a process's clock (its `Date` header, to the second) may be from the fake clock. */
const CLOCK_SLACK_MS = 3_000
/** How long a pushed or stored message has to reach its connected client. */
const DELIVERY_MS = 5_000
/** How long nothing more may come for a delivery to count as "exactly once". */
const QUIET_MS = 1_500

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))
const iso = (ms: number) => new Date(ms).toISOString()

/** An output line worth reading first: a log line at warning level or worse (syslog severity 0-4), the storage server's, or an exit. */
const isTrouble = (line: string): boolean => /"Severity":[0-4][,}]/.test(line) || line.startsWith("[storage]") || / exited: /.test(line)

const isNotification = (frame: Record<string, unknown>) => frame["messageType"] === "notification"

/** A user agent across its sessions: every push answered 201 for it, and every session it had. */
interface Agent {
  readonly name: string
  uaid: string | undefined
  endpoint: string | undefined
  session: TestClient | undefined
  readonly sessions: Array<TestClient>
  /** `version` of every push answered 201 for this agent. */
  readonly pushed: Array<string>
}

const agent = (name: string): Agent => ({ name, uaid: undefined, endpoint: undefined, session: undefined, sessions: [], pushed: [] })

/** Every notification `version` the agent received, over all its sessions. */
const receivedVersions = (a: Agent): Array<string> =>
  a.sessions.flatMap((s) => s.received.filter(isNotification).map((f) => f["version"] as string))

const countOf = (a: Agent, version: string): number => receivedVersions(a).filter((v) => v === version).length

/** Whether `version` came to the agent within `ms` (real time). */
const arrives = async (a: Agent, version: string, ms = DELIVERY_MS): Promise<boolean> => {
  const deadline = Date.now() + ms
  while (Date.now() < deadline) {
    if (countOf(a, version) > 0) return true
    await sleep(25)
  }
  return countOf(a, version) > 0
}

/** Problems found by a step: all of them are reported together, with the processes' last output. */
class Problems {
  readonly list: Array<string> = []
  check(ok: boolean, message: string): void {
    if (!ok) this.list.push(message)
  }
  add(message: string): void {
    this.list.push(message)
  }
}

/** The router record of `uaid` in the deployment's storage, read by the test. */
const recordOf = (deployment: Deployment, uaid: string): Promise<UserRecord | undefined> =>
  Effect.runPromise(
    Storage.use((storage) => storage.getUser(uaid)).pipe(
      Effect.provide(storageOf(deployment, 2_000))
    )
  )

/** Until `predicate` holds of the agent's router record, within `ms`; the last record read (or why none was). */
const recordUntil = async (
  deployment: Deployment,
  uaid: string,
  predicate: (user: UserRecord | undefined) => boolean,
  ms: number
): Promise<{ readonly ok: boolean; readonly last: string }> => {
  const deadline = Date.now() + ms
  let last = "not read"
  for (;;) {
    try {
      const user = await recordOf(deployment, uaid)
      last = JSON.stringify(user)
      if (predicate(user)) return { ok: true, last }
    } catch (error) {
      last = `reading it failed: ${String(error)}`
    }
    if (Date.now() >= deadline) return { ok: false, last }
    await sleep(100)
  }
}

const scenario = (name: string, start: (options: StartOptions) => Promise<Deployment>) =>
  describe(name, () => {
    let clock: FakeClock | undefined
    let started: Deployment | undefined
    const deployment = (): Deployment => {
      if (started === undefined) throw new Error("the deployment did not start")
      return started
    }
    const fakeClock = (): FakeClock => {
      if (clock === undefined) throw new Error("the fake clock was not made")
      return clock
    }
    const A = agent("A")
    const B = agent("B")
    const C = agent("C")
    const D = agent("D")
    const agents = [A, B, C, D]
    /** What was pushed to B and D while they were away before midnight (answered 201: stored). */
    const storedForB: Array<string> = []
    const storedForD: Array<string> = []

    beforeAll(async () => {
      clock = makeFakeClock(STARTED)
      started = await start({ env: clock.env })
    }, 60_000)

    afterAll(async () => {
      await Promise.all(agents.flatMap((a) => a.sessions.map((s) => s.close())))
      await started?.stop()
      clock?.dispose()
    })

    /**
     * A step: its body reports problems as it goes (and may throw); the step fails with all of them,
     * the processes' clock and their last output lines.
     */
    const step = (title: string, body: (problems: Problems) => Promise<void>, timeoutMs = 60_000) =>
      it(title, async () => {
        const problems = new Problems()
        try {
          await body(problems)
        } catch (error) {
          problems.add(`step stopped: ${error instanceof Error ? error.message : String(error)}`)
        }
        if (problems.list.length === 0) return
        const output = started?.output ?? []
        throw new Error([
          ...problems.list.map((p) => `- ${p}`),
          `(the processes' clock reads ${clock === undefined ? "?" : iso(clock.now())})`,
          "--- the processes' last 15 warnings, errors and exits ---",
          ...output.filter(isTrouble).slice(-15),
          "--- the processes' last 30 output lines ---",
          ...output.slice(-30)
        ].join("\n"))
      }, timeoutMs)

    const need = <A>(value: A | undefined, what: string): A => {
      if (value === undefined) throw new Error(`${what} is missing (an earlier step failed)`)
      return value
    }

    /** Checks that every process of the deployment reads the fake clock (their HTTP `Date` headers). */
    const checkClocks = async (problems: Problems, when: string) => {
      const d = deployment()
      const urls: Array<[string, string]> = [
        ["endpoint node", `${d.endpointUrl}/__lbheartbeat__`],
        ["connection node", `${d.routerUrl}/__lbheartbeat__`],
        // A storage server (separate nodes) has a clock of its own; the all-in-one's database is in its process.
        ...(d.storageEndpoint !== undefined ? [["storage", d.storageEndpoint()] as [string, string]] : [])
      ]
      for (const [what, url] of urls) {
        const seen = await clockOf(url)
        const expected = fakeClock().now()
        problems.check(
          Math.abs(seen - expected) <= CLOCK_SLACK_MS,
          `${when}: the ${what}'s clock reads ${iso(seen)}, the fake clock ${iso(expected)}`
        )
      }
    }

    /** Hello (resuming the agent's uaid, if it has one); a new session, which acks every notification it gets. */
    const hello = async (a: Agent, problems: Problems): Promise<TestClient> => {
      const client = await openClient(deployment().wsUrl)
      client.ws.on("message", (data) => {
        const frame = JSON.parse(data.toString()) as Record<string, unknown>
        if (isNotification(frame)) ack(client, frame)
      })
      a.sessions.push(client)
      a.session = client
      client.send({ messageType: "hello", use_webpush: true, ...(a.uaid === undefined ? {} : { uaid: a.uaid }) })
      const reply = await client.next((f) => f["messageType"] === "hello")
      problems.check(reply["status"] === 200, `${a.name}'s hello: status ${String(reply["status"])}: ${JSON.stringify(reply)}`)
      const uaid = reply["uaid"] as string
      if (a.uaid !== undefined) problems.check(uaid === a.uaid, `${a.name}'s hello with uaid ${a.uaid} was answered with uaid ${uaid}`)
      else a.uaid = uaid
      return client
    }

    /** Register a channel of the agent's current session: the register reply must be status 200 with an endpoint. */
    const register = async (a: Agent, problems: Problems): Promise<void> => {
      const client = need(a.session, `${a.name}'s session`)
      client.send({ messageType: "register", channelID: crypto.randomUUID() })
      const reply = await client.next((f) => f["messageType"] === "register")
      const endpoint = reply["pushEndpoint"]
      problems.check(
        reply["status"] === 200 && typeof endpoint === "string",
        `${a.name}'s register at ${iso(fakeClock().now())} was answered ${JSON.stringify(reply)} (expected status 200 and a pushEndpoint)`
      )
      if (reply["status"] === 200 && typeof endpoint === "string") a.endpoint = endpoint
    }

    /** Leave: close the session and wait until the router record names no node (the session ended). */
    const leave = async (a: Agent, problems: Problems): Promise<void> => {
      await need(a.session, `${a.name}'s session`).close()
      a.session = undefined
      const ended = await recordUntil(deployment(), need(a.uaid, `${a.name}'s uaid`), (u) => u !== undefined && u.nodeId === undefined, 5_000)
      problems.check(ended.ok, `${a.name} left, but its router record still names a node after 5 s: ${ended.last}`)
    }

    /** A push to the agent (TTL a week, no body); its `version` when answered 201. */
    const push = async (a: Agent, problems: Problems, what: string): Promise<string | undefined> => {
      const res = await fetch(need(a.endpoint, `${a.name}'s push endpoint`), { method: "POST", headers: { TTL } })
      const body = await res.text()
      if (res.status !== 201) {
        problems.add(`${what}: the push to ${a.name} at ${iso(fakeClock().now())} was answered ${res.status} ${body}`)
        return undefined
      }
      const version = (res.headers.get("location") ?? "").split("/").pop() ?? ""
      a.pushed.push(version)
      return version
    }

    /**
     * The pushes `versions` (undefined: not answered 201, already reported) come to the agent within
     * DELIVERY_MS, and each only once (nothing more of them within QUIET_MS after).
     */
    const deliveredOnce = async (a: Agent, problems: Problems, versions: ReadonlyArray<string | undefined>, what: string): Promise<void> => {
      const expected = versions.filter((v) => v !== undefined)
      const deadline = Date.now() + DELIVERY_MS
      for (const version of expected) {
        if (!(await arrives(a, version, Math.max(0, deadline - Date.now())))) {
          problems.add(`${what}: the push answered 201 (version ${version}) did not come to ${a.name} within ${DELIVERY_MS} ms`)
        }
      }
      await sleep(QUIET_MS)
      for (const version of expected) {
        const n = countOf(a, version)
        problems.check(n <= 1, `${what}: the push (version ${version}) came to ${a.name} ${n} times`)
      }
    }

    /** Steps after midnight start once the processes' clock has passed it (real time passing since the move). */
    const afterMidnight = () => fakeClock().waitUntil(MIDNIGHT + 1_000, 30_000)

    step("2027-01-26: every process reads the faked time; A, B and D register and get pushes", async (problems) => {
      await checkClocks(problems, "on the 26th")
      for (const a of [A, B, D]) {
        await hello(a, problems)
        await register(a, problems)
        await deliveredOnce(a, problems, [await push(a, problems, "on the 26th")], "on the 26th, connected")
      }
    })

    step("20 s before midnight: every process reads the moved clock; B and D leave, pushes to them are stored (201)", async (problems) => {
      fakeClock().setTo(BEFORE_MIDNIGHT)
      await checkClocks(problems, "20 s before midnight")
      need(A.session, "A's session")
      for (const a of [B, D]) {
        await leave(a, problems)
        const record = await recordOf(deployment(), need(a.uaid, `${a.name}'s uaid`))
        problems.check(record?.currentMonth === LAST_MONTH_TABLE, `${a.name}'s router record before midnight: ${JSON.stringify(record)} (expected ${LAST_MONTH_TABLE})`)
      }
      // The first push to an offline client reads its router record (naming January's table) and the
      // endpoint keeps it in its router cache.
      for (const version of [await push(B, problems, "before midnight, B offline"), await push(B, problems, "before midnight, B offline")]) {
        if (version !== undefined) storedForB.push(version)
      }
      const forD = await push(D, problems, "before midnight, D offline")
      if (forD !== undefined) storedForD.push(forD)
      await deliveredOnce(A, problems, [await push(A, problems, "before midnight, A connected")], "before midnight, A connected")
      problems.check(fakeClock().now() < MIDNIGHT - 2_000, `this step ran until ${iso(fakeClock().now())}: its pushes were meant to come before midnight`)
    })

    step("midnight passes: every process reads 2027-02-01", async (problems) => {
      await afterMidnight()
      await checkClocks(problems, "after midnight")
    })

    step("after midnight: B comes back; what was stored and a push sent right after its hello reply come once each", async (problems) => {
      await afterMidnight()
      await hello(B, problems)
      // Right after the hello reply: the endpoint still has B's record from before midnight (offline,
      // January's table) in its router cache.
      const right = await push(B, problems, "right after B's hello reply after midnight")
      await deliveredOnce(B, problems, storedForB, "stored before midnight for B")
      await deliveredOnce(B, problems, [right], "sent right after B's hello reply after midnight")
      const moved = await recordUntil(deployment(), need(B.uaid, "B's uaid"), (u) => u?.currentMonth === NEW_MONTH_TABLE, 3_000)
      problems.check(moved.ok, `B's router record does not name ${NEW_MONTH_TABLE} 3 s after it came back: ${moved.last}`)
    })

    step("after midnight: D comes back and moves to the new month; a push sent then (the endpoint's cached record names last month) comes once", async (problems) => {
      await afterMidnight()
      await hello(D, problems)
      await deliveredOnce(D, problems, storedForD, "stored before midnight for D")
      const moved = await recordUntil(deployment(), need(D.uaid, "D's uaid"), (u) => u?.currentMonth === NEW_MONTH_TABLE, 3_000)
      problems.check(moved.ok, `D's router record does not name ${NEW_MONTH_TABLE} 3 s after it came back: ${moved.last}`)
      problems.check(
        fakeClock().now() < BEFORE_MIDNIGHT + 60_000,
        `the push below comes at ${iso(fakeClock().now())}, beyond the endpoint's router cache of D's record from before midnight`
      )
      await deliveredOnce(D, problems, [await push(D, problems, `D moved to ${NEW_MONTH_TABLE}`)], `sent once D's record named ${NEW_MONTH_TABLE}`)
    })

    step("after midnight: a new client C registers (status 200) and a push reaches it", async (problems) => {
      await afterMidnight()
      await hello(C, problems)
      await register(C, problems)
      if (C.endpoint !== undefined) await deliveredOnce(C, problems, [await push(C, problems, "to C after midnight")], "to C after midnight")
    })

    step("after midnight: A, connected across midnight, gets a push", async (problems) => {
      await afterMidnight()
      const session = need(A.session, "A's session")
      problems.check(session.ws.readyState === session.ws.OPEN, `A's connection from the 26th is not open after midnight (state ${session.ws.readyState})`)
      const version = await push(A, problems, "to A after midnight")
      await deliveredOnce(A, problems, [version], "to A after midnight")
      if (version !== undefined && countOf(A, version) > 0) {
        const how = await deliveredAs(deployment(), version)
        problems.check(how === "direct", `the push to A after midnight was delivered ${how ?? "(no delivery in the connection node's trace)"}, not directly`)
      }
    })

    step("after midnight: B comes back once more; nothing comes again", async (problems) => {
      await afterMidnight()
      await leave(B, problems)
      const client = await hello(B, problems)
      await sleep(2_000)
      const again = client.received.filter(isNotification)
      problems.check(again.length === 0, `B got ${again.length} notification(s) again after acking them: ${JSON.stringify(again)}`)
    })

    step("after midnight: /__heartbeat__ of the endpoint answers 200, message table OK", async (problems) => {
      await afterMidnight()
      const res = await fetch(`${deployment().endpointUrl}/__heartbeat__`)
      const text = await res.text()
      let status: unknown
      try {
        status = (JSON.parse(text) as { message_table?: { status?: unknown } }).message_table?.status
      } catch {
        status = undefined
      }
      problems.check(res.status === 200 && status === "OK", `GET /__heartbeat__ at ${iso(fakeClock().now())}: ${res.status} ${text}`)
    })

    step("every push answered 201 reached its client exactly once", async (problems) => {
      await sleep(QUIET_MS)
      for (const a of agents) {
        const received = receivedVersions(a)
        for (const version of a.pushed) {
          const n = received.filter((v) => v === version).length
          problems.check(n === 1, `${a.name}: push ${version} (answered 201) was received ${n} times`)
        }
        const unknown = received.filter((v) => !a.pushed.includes(v))
        problems.check(unknown.length === 0, `${a.name} received notifications never answered 201 to the test: ${unknown.join(", ")}`)
      }
    })
  })

scenario("month turn: all-in-one (embedded storage)", (options) => startAllInOne([], options))
scenario("month turn: separate autoconnect + autoendpoint on `npm run storage`", (options) => startSeparate([], [], options))
scenario("month turn: separate autoconnect + autoendpoint on PostgreSQL", (options) => {
  const server = testPostgres()
  return "missing" in server ? Promise.reject(new Error(server.missing)) : startOnPostgres(server.dsn, options)
})
