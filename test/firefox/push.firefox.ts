/**
 * End to end with the real client: Debian's Firefox ESR (headless, driven over WebDriver BiDi by
 * puppeteer-core) subscribes from a page on 127.0.0.1, the `web-push` library sends to the endpoint
 * it got, and the service worker reports what it received to the test's web server. Runs against
 * the all-in-one process on embedded storage, and the core scenarios against separate connection
 * and endpoint processes sharing a dynalite server, and sharing PostgreSQL (`db_dsn`, a schema of
 * their own on the server `test/storage/postgresServer.ts` finds: the DSN CI sets, or a throwaway
 * cluster where PostgreSQL is installed; under CI=true a missing DSN fails).
 *
 * One Firefox (one profile, so one uaid) per deployment; every test subscribes on a scope of its own.
 * Scenarios about messages sent while Firefox is closed close it and start it again on the same
 * profile. "Never arrives" is bounded by a sentinel message sent after the one that must not come.
 *
 * On failure a test prints the push frames Firefox sent and received during it (from Firefox's push
 * debug log, with its connection events), what the service worker reported, and the servers' output
 * (at debug level: the connection node's "session event" lines).
 *
 * Run: `npm run test:e2e` (needs `firefox-esr` on the PATH, or FIREFOX_BIN). FIREFOX_E2E_LOG=<file>
 * appends everything Firefox and the servers printed to that file.
 */
import { afterAll, assert, beforeAll, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { appendFileSync, mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import type { Page } from "puppeteer-core"
import webpush from "web-push"
import { type Deployment, startAllInOne, startOnPostgres, startSeparate } from "../e2e/servers.ts"
import { describePostgres } from "../storage/postgresServer.ts"
import { type Firefox, type Frame, launchFirefox, pushFrames, transcript } from "./firefox.ts"
import { type Report, type Site, startSite } from "./site.ts"

interface SubscriptionJSON {
  readonly endpoint: string
  readonly keys: { readonly p256dh: string; readonly auth: string }
}

const vapid = webpush.generateVAPIDKeys()
const vapidDetails = { subject: "mailto:ops@example.com", publicKey: vapid.publicKey, privateKey: vapid.privateKey }

interface SendOptions {
  readonly TTL: number
  readonly topic?: string
  readonly contentEncoding?: "aes128gcm" | "aesgcm"
  readonly vapidDetails?: typeof vapidDetails
}

interface Sent {
  readonly status: number
  readonly headers: Record<string, string>
  readonly body: string
  /** The message id of the Location header: the `version` the client gets. */
  readonly version: string
}

/** `web-push` builds the request (encryption, VAPID, TTL, Topic); we send it over plain HTTP. */
const send = async (subscription: SubscriptionJSON, payload: string | null, options: SendOptions): Promise<Sent> => {
  const details = webpush.generateRequestDetails(subscription, payload, options)
  const headers = Object.fromEntries(Object.entries(details.headers).map(([k, v]) => [k, String(v)]))
  const res = await fetch(details.endpoint, { method: details.method, headers, ...(details.body === null ? {} : { body: details.body }) })
  const all = Object.fromEntries(res.headers)
  return { status: res.status, headers: all, body: await res.text(), version: all["location"]?.split("/m/")[1] ?? "" }
}

/** Sends and insists on 201 Created with a Location. */
const push = async (subscription: SubscriptionJSON, payload: string | null, options: SendOptions): Promise<Sent> => {
  const sent = await send(subscription, payload, options)
  assert.strictEqual(sent.status, 201, `push refused: ${sent.status} ${sent.body}`)
  assert.isNotEmpty(sent.version, "no Location with a message id")
  return sent
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

/** After the sentinel arrived, how long a message that must never arrive still gets to show up. */
const graceMs = 1_000

const until = async <A>(what: string, probe: () => A | undefined, timeoutMs: number): Promise<A> => {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    const found = probe()
    if (found !== undefined) return found
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`)
    await sleep(50)
  }
}

const isIn = (type: string) => (f: Frame) => f.dir === "in" && f.frame["messageType"] === type
const isOut = (type: string) => (f: Frame) => f.dir === "out" && f.frame["messageType"] === type
const updates = (f: Frame) => (f.frame["updates"] ?? []) as Array<{ channelID: string; version: string; code: number }>

const suite = (name: string, start: () => Promise<Deployment>, options: { readonly full: boolean }) =>
  describe(name, () => {
    let deployment: Deployment
    let site: Site
    let profileDir: string
    let firefox: Firefox | undefined
    /** Every line Firefox printed, across restarts. */
    const log: Array<string> = []
    let scopes = 0

    const pushUrl = () => deployment.wsUrl
    const startFirefox = async () => {
      firefox = await launchFirefox({ profileDir, pushUrl: pushUrl(), log })
      return firefox
    }
    /** The running Firefox; a new one on the same profile if there is none or it died. */
    const running = async () =>
      firefox !== undefined && firefox.process.exitCode === null && firefox.process.signalCode === null ? firefox : startFirefox()
    const closeFirefox = async () => {
      const current = firefox
      firefox = undefined
      await current?.close()
    }
    const frames = (sinceLine = 0) => pushFrames(log.slice(sinceLine))

    beforeAll(async () => {
      deployment = await start()
      site = await startSite()
      profileDir = mkdtempSync(join(tmpdir(), "autopush-firefox-"))
      await startFirefox()
    }, 90_000)
    afterAll(async () => {
      await closeFirefox()
      // FIREFOX_E2E_LOG=<file>: keep everything Firefox and the servers printed, for a closer look.
      const keep = process.env["FIREFOX_E2E_LOG"]
      if (keep !== undefined && keep !== "") {
        appendFileSync(keep, [`===== ${name}: Firefox =====`, ...log, `===== ${name}: servers =====`, ...(deployment?.output ?? []), ""].join("\n"))
      }
      await site?.close()
      await deployment?.stop()
      if (profileDir !== undefined) rmSync(profileDir, { recursive: true, force: true })
    }, 60_000)

    interface Test {
      /** A scope (service worker + subscription) of this test's own. */
      readonly scope: string
      /** Log line where this test started: frames from here on are this test's. */
      readonly mark: number
    }

    /**
     * One scenario: its own deadline (a few seconds under vitest's, so the report below is printed
     * on a timeout too) and, on failure, the session as Firefox saw it and what the servers printed.
     */
    const scenario = (title: string, timeoutMs: number, body: (t: Test) => Promise<void>) =>
      it.live(
        title,
        () => {
          const t: Test = { scope: `s${++scopes}-${Date.now().toString(36)}`, mark: log.length }
          const serverMark = deployment.output.length
          const reportMark = site.reports.length
          let timer: NodeJS.Timeout | undefined
          return Effect.tryPromise({
            try: () =>
              Promise.race([
                running().then(() => body(t)),
                new Promise<never>((_, reject) => {
                  timer = setTimeout(() => reject(new Error(`scenario timed out after ${timeoutMs} ms`)), timeoutMs)
                })
              ]).finally(() => clearTimeout(timer)),
            catch: (e) => {
              const firefoxLines = log.slice(t.mark)
              const notable = firefoxLines.filter((l) => /^(console\.(warn|error)|JavaScript error)/.test(l) && !/RSLoader|nimbus|Remote Settings|services-settings|JSWindowActorChild cannot send/i.test(l))
              return new Error(
                [
                  e instanceof Error ? (e.stack ?? e.message) : String(e),
                  `--- push frames Firefox sent (FF ->) and received (<- SV) during this test ---`,
                  transcript(firefoxLines) || "(none)",
                  `--- service worker reports during this test ---`,
                  site.reports.slice(reportMark).map((r) => JSON.stringify(r)).join("\n") || "(none)",
                  `--- Firefox warnings and errors during this test (last 30) ---`,
                  notable.slice(-30).join("\n") || "(none)",
                  `--- server output during this test (last 60 lines) ---`,
                  deployment.output.slice(serverMark).slice(-60).join("\n") || "(none)"
                ].join("\n")
              )
            }
          })
        },
        timeoutMs + 15_000
      )

    const open = async (scope: string): Promise<Page> => {
      const page = await (await running()).browser.newPage()
      await page.goto(site.pageUrl(scope))
      return page
    }

    /** Subscribes `scope` from its page; the page stays open until `page.close()`. */
    const subscribe = async (scope: string, key?: string) => {
      const page = await open(scope)
      const subscription = (await page.evaluate(
        key === undefined ? `pushTest.subscribe()` : `pushTest.subscribe(${JSON.stringify(key)})`
      )) as SubscriptionJSON
      const register = frames().find((f) => isIn("register")(f) && f.frame["pushEndpoint"] === subscription.endpoint)
      assert.isDefined(register, "no register reply with this endpoint in Firefox's log")
      const channelID = register!.frame["channelID"] as string
      const request = frames().find((f) => isOut("register")(f) && f.frame["channelID"] === channelID)
      return { page, subscription, channelID, request: request?.frame }
    }

    /** The uaid of the last hello reply Firefox got. */
    const currentUaid = () => frames().filter(isIn("hello")).at(-1)?.frame["uaid"] as string | undefined

    /** Waits until Firefox has acked `version` with code 100 (frames since `mark`). */
    const acked = (mark: number, version: string) =>
      until(`Firefox's ack of ${version}`, () =>
        frames(mark).find((f) => isOut("ack")(f) && updates(f).some((u) => u.version === version && u.code === 100)), 5_000)

    /** How often the server sent `version` to Firefox since `mark`. */
    const deliveries = (mark: number, version: string) =>
      frames(mark).filter((f) => isIn("notification")(f) && f.frame["version"] === version).length

    const pushes = (reports: ReadonlyArray<Report>) => reports.filter((r) => r.type === "push")

    /** Firefox closed: wait for the restart's hello exchange on the same profile. */
    const restartFirefox = async (expectedUaid: string) => {
      const mark = log.length
      await startFirefox()
      const hello = await until("Firefox's hello after the restart", () => frames(mark).find(isIn("hello")), 15_000)
      const sentHello = frames(mark).find(isOut("hello"))
      assert.strictEqual(sentHello?.frame["uaid"], expectedUaid, "Firefox restarted without its uaid")
      assert.strictEqual(hello.frame["uaid"], expectedUaid, "the server handed Firefox a different uaid")
    }

    const checkSubscriptionKept = async (scope: string, endpoint: string) => {
      const page = await open(scope)
      const current = (await page.evaluate(`pushTest.current()`)) as SubscriptionJSON | null
      await page.close()
      assert.strictEqual(current?.endpoint, endpoint, "Firefox lost the subscription")
    }

    for (const withKey of [false, true]) {
      scenario(
        `subscribe ${withKey ? "with a VAPID applicationServerKey (v2 endpoint)" : "without applicationServerKey (v1 endpoint)"}: aes128gcm and aesgcm payloads from web-push arrive exactly, and Firefox acks them`,
        25_000,
        async (t) => {
          const { page, subscription, channelID, request } = await subscribe(t.scope, withKey ? vapid.publicKey : undefined)
          assert.match(subscription.endpoint, withKey ? /\/wpush\/v2\// : /\/wpush\/v1\//)
          assert.strictEqual(
            request?.["key"] === undefined ? undefined : Buffer.from(String(request["key"]), "base64url").toString("base64url"),
            withKey ? vapid.publicKey : undefined,
            "the register frame's key"
          )
          const texts: Array<string> = []
          for (const contentEncoding of ["aes128gcm", "aesgcm"] as const) {
            const text = `${contentEncoding} to ${withKey ? "v2" : "v1"}: héllo 🦊 ${crypto.randomUUID()}`
            texts.push(text)
            const sent = await push(subscription, text, { TTL: 60, contentEncoding, ...(withKey ? { vapidDetails } : {}) })
            assert.strictEqual(sent.headers["ttl"], "60")
            const reports = await site.waitFor(t.scope, (r) => pushes(r).length === texts.length)
            assert.strictEqual(pushes(reports).at(-1)?.data, text)
            const ack = await acked(t.mark, sent.version)
            assert.deepInclude(updates(ack), { channelID, version: sent.version, code: 100 })
            assert.strictEqual(deliveries(t.mark, sent.version), 1)
          }
          assert.deepStrictEqual(pushes(site.reportsOf(t.scope)).map((r) => r.data), texts)
          await page.close()
        }
      )
    }

    scenario("a push without payload arrives as a push event with null data, and is acked", 20_000, async (t) => {
      const { page, subscription } = await subscribe(t.scope)
      const sent = await push(subscription, null, { TTL: 60 })
      const reports = await site.waitFor(t.scope, (r) => pushes(r).length === 1)
      assert.isNull(pushes(reports)[0]!.data)
      await acked(t.mark, sent.version)
      const frame = frames(t.mark).find((f) => isIn("notification")(f) && f.frame["version"] === sent.version)
      assert.notProperty(frame?.frame ?? {}, "data")
      await page.close()
    })

    scenario("messages sent while Firefox is closed arrive once each after it restarts with the same profile", 45_000, async (t) => {
      const { page, subscription } = await subscribe(t.scope)
      await page.close()
      const uaid = currentUaid()!
      await closeFirefox()
      const texts = ["while closed #1", "while closed #2", "while closed #3"]
      const sent: Array<Sent> = []
      for (const text of texts) sent.push(await push(subscription, text, { TTL: 600 }))
      await restartFirefox(uaid)
      await site.waitFor(t.scope, (r) => pushes(r).length >= texts.length)
      await sleep(graceMs)
      assert.sameMembers(pushes(site.reportsOf(t.scope)).map((r) => r.data), texts)
      for (const s of sent) {
        await acked(t.mark, s.version)
        assert.strictEqual(deliveries(t.mark, s.version), 1, `message ${s.version} was sent to Firefox more than once`)
      }
      await checkSubscriptionKept(t.scope, subscription.endpoint)
    })

    if (options.full) {
      scenario("two messages with the same Topic sent while Firefox is closed: only the newer arrives", 45_000, async (t) => {
        const { page, subscription } = await subscribe(t.scope)
        await page.close()
        const uaid = currentUaid()!
        await closeFirefox()
        const older = await push(subscription, "weather: rain", { TTL: 600, topic: "weather" })
        const newer = await push(subscription, "weather: sun", { TTL: 600, topic: "weather" })
        const sentinel = await push(subscription, "sentinel", { TTL: 600 })
        await restartFirefox(uaid)
        await site.waitFor(t.scope, (r) => pushes(r).length >= 2)
        await sleep(graceMs)
        assert.sameMembers(pushes(site.reportsOf(t.scope)).map((r) => r.data), ["weather: sun", "sentinel"])
        await acked(t.mark, newer.version)
        await acked(t.mark, sentinel.version)
        assert.strictEqual(deliveries(t.mark, older.version), 0, "the replaced message was sent to Firefox")
      })

      scenario("a TTL 0 message sent while Firefox is closed never arrives", 45_000, async (t) => {
        const { page, subscription } = await subscribe(t.scope)
        await page.close()
        const uaid = currentUaid()!
        await closeFirefox()
        const dropped = await push(subscription, "ttl zero", { TTL: 0 })
        assert.strictEqual(dropped.headers["ttl"], "0")
        const sentinel = await push(subscription, "sentinel", { TTL: 600 })
        await restartFirefox(uaid)
        await site.waitFor(t.scope, (r) => pushes(r).length >= 1)
        await sleep(graceMs)
        assert.deepStrictEqual(pushes(site.reportsOf(t.scope)).map((r) => r.data), ["sentinel"])
        await acked(t.mark, sentinel.version)
        assert.strictEqual(deliveries(t.mark, dropped.version), 0, "the TTL 0 message was sent to Firefox")
      })

      scenario("a message cancelled with DELETE on its Location before Firefox connects never arrives", 45_000, async (t) => {
        const { page, subscription } = await subscribe(t.scope)
        await page.close()
        const uaid = currentUaid()!
        await closeFirefox()
        const cancelled = await push(subscription, "cancelled", { TTL: 600 })
        const deleted = await fetch(cancelled.headers["location"]!, { method: "DELETE" })
        assert.strictEqual(deleted.status, 204)
        const sentinel = await push(subscription, "sentinel", { TTL: 600 })
        await restartFirefox(uaid)
        await site.waitFor(t.scope, (r) => pushes(r).length >= 1)
        await sleep(graceMs)
        assert.deepStrictEqual(pushes(site.reportsOf(t.scope)).map((r) => r.data), ["sentinel"])
        await acked(t.mark, sentinel.version)
        assert.strictEqual(deliveries(t.mark, cancelled.version), 0, "the cancelled message was sent to Firefox")
      })
    }

    scenario("the server restarts while Firefox runs: Firefox reconnects with the same uaid, keeps its subscription, and a message sent after the restart arrives", 45_000, async (t) => {
      const { page, subscription } = await subscribe(t.scope)
      const uaid = currentUaid()!
      const mark = log.length
      await deployment.restart()
      const hello = await until("Firefox's hello after the server restart", () => frames(mark).find(isIn("hello")), 20_000)
      assert.strictEqual(frames(mark).find(isOut("hello"))?.frame["uaid"], uaid, "Firefox reconnected without its uaid")
      assert.strictEqual(hello.frame["uaid"], uaid, "the server handed Firefox a different uaid")
      const sent = await push(subscription, "after the server restart", { TTL: 60 })
      const reports = await site.waitFor(t.scope, (r) => pushes(r).length === 1)
      assert.strictEqual(pushes(reports)[0]!.data, "after the server restart")
      await acked(mark, sent.version)
      assert.deepStrictEqual(await page.evaluate(`pushTest.current().then((s) => s && s.endpoint)`), subscription.endpoint)
      assert.isEmpty(site.reportsOf(t.scope).filter((r) => r.type === "pushsubscriptionchange"), "Firefox dropped its subscriptions")
      await page.close()
    })

    if (options.full) {
      scenario("unsubscribe resolves true, and the endpoint then answers 410", 20_000, async (t) => {
        const { page, subscription, channelID } = await subscribe(t.scope)
        assert.strictEqual(await page.evaluate(`pushTest.unsubscribe()`), true)
        const request = frames(t.mark).find((f) => isOut("unregister")(f) && f.frame["channelID"] === channelID)
        assert.isDefined(request, "Firefox sent no unregister")
        const reply = frames(t.mark).find((f) => isIn("unregister")(f) && f.frame["channelID"] === channelID)
        assert.strictEqual(reply?.frame["status"], 200)
        const gone = await send(subscription, "to nowhere", { TTL: 60 })
        assert.strictEqual(gone.status, 410, gone.body)
        assert.strictEqual(await page.evaluate(`pushTest.current()`), null)
        await page.close()
      })

      scenario("Firefox follows remote-settings/monitor_changes: it gets the version the server has, and a new one set through the admin API at its next keepalive", 60_000, async () => {
        // Firefox subscribes about 20 s after it starts; the server has had BROADCAST_V1 since before.
        const told = (version: string) => (f: Frame) =>
          f.dir === "in" && (f.frame["messageType"] === "hello" || f.frame["messageType"] === "broadcast") &&
          (f.frame["broadcasts"] as Record<string, unknown> | undefined)?.[BROADCAST_ID] === version
        await until(`Firefox told of ${BROADCAST_ID} ${BROADCAST_V1}`, () => frames().find(told(BROADCAST_V1)), 40_000)
        const mark = log.length
        const version = `"${Date.now()}"`
        assert.strictEqual(await setBroadcast(deployment, version), 200)
        const change = await until("the broadcast frame", () => frames(mark).find((f) => isIn("broadcast")(f) && told(version)(f)), 15_000)
        assert.deepStrictEqual(change.frame["broadcasts"], { [BROADCAST_ID]: version })
        // The server's own account: the delivery is counted as a change.
        const metrics = await (await fetch(`${deployment.routerUrl}/metrics`)).text()
        assert.match(metrics, /ua_broadcast_delivered_total\{[^}]*reason="change"[^}]*\} [1-9]/)
      })
    }
  })

/**
 * The all-in-one runs with the broadcast admin API on, reads broadcasts and pings Firefox often, and
 * has a version of Remote Settings' broadcast before Firefox starts (Firefox follows only what exists).
 */
const BROADCAST_TOKEN = "e2e-broadcast-admin"
const BROADCAST_ID = "remote-settings/monitor_changes"
const BROADCAST_V1 = "\"1600000000000\""
const setBroadcast = async (deployment: Deployment, version: string): Promise<number> => {
  const res = await fetch(`${deployment.endpointUrl}/v1/broadcasts/${BROADCAST_ID}`, {
    method: "PUT",
    headers: { authorization: `Bearer ${BROADCAST_TOKEN}`, "content-type": "application/json" },
    body: JSON.stringify({ version })
  })
  await res.arrayBuffer()
  return res.status
}
const withBroadcasts = async () => {
  const deployment = await startAllInOne(["--broadcast-admin-tokens", BROADCAST_TOKEN, "--megaphone-poll-interval", "0.5", "--auto-ping-interval", "5"])
  if ((await setBroadcast(deployment, BROADCAST_V1)) !== 200) throw new Error("the broadcast admin API refused the first version")
  await new Promise((r) => setTimeout(r, 1_000)) // read by the connection node
  return deployment
}

suite("Firefox: all-in-one process on embedded storage", withBroadcasts, { full: true })
suite("Firefox: separate connection and endpoint processes on dynalite", startSeparate, { full: false })

describePostgres("Firefox: separate connection and endpoint processes on PostgreSQL", (dsn) => {
  suite("Firefox: separate connection and endpoint processes on PostgreSQL", () => startOnPostgres(dsn), { full: false })
})
