/** `endpoint-diagnostic` as a child process: endpoints made with EndpointCrypto for users seeded in dynalite. */
import { createECDH } from "node:crypto"
import { writeFileSync } from "node:fs"
import { join } from "node:path"
import { Cause, Effect, Exit, Redacted, Result } from "effect"
import { exportJWK, generateKeyPair, SignJWT } from "jose"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { EndpointCrypto } from "../../src/crypto/endpoint.ts"
import { generateFernetKey } from "../../src/crypto/fernet.ts"
import { lastConnectValue } from "../../src/domain/user.ts"
import { Storage } from "../../src/storage/Storage.ts"
import { monthTableName } from "../../src/storage/tables.ts"
import { diagnosticHelp, endpointDiagnostic } from "../../src/tools/diagnostic.ts"
import { runTool, scratch, startServer, storageFlags, tablesFor, withStorage } from "./harness.ts"

const KEY = generateFernetKey()
const OLD_KEY = generateFernetKey()
const ENDPOINT_URL = "https://push.example.com"
const tables = tablesFor()
const uaid = "d1a9e5c0b7f34c2e8a6b5d4c3b2a1f00"
const chid = "5b4e3d2c-1a09-4f8e-9d7c-6b5a4e3d2c1b"
const otherChid = "0f1e2d3c-4b5a-4968-8776-a5b4c3d2e1f0"
const connectedAt = Date.now() - 3_600_000
const lastConnect = lastConnectValue(connectedAt, 2)
const nodeId = "http://10.0.0.7:8081"
const vapid = createECDH("prime256v1")
vapid.generateKeys()
const vapidKey = vapid.getPublicKey()
const otherVapid = createECDH("prime256v1")
otherVapid.generateKeys()

let server: Awaited<ReturnType<typeof startServer>>
let table: string

const makeEndpoint = (keys: ReadonlyArray<string>, user: string, channel: string, rawKey?: Uint8Array): Promise<string> =>
  Effect.runPromise(Result.getOrThrow(EndpointCrypto.make({ keys: Redacted.make(keys), endpointUrl: ENDPOINT_URL })).makeEndpoint(user, channel, rawKey))

beforeAll(async () => {
  server = await startServer()
  table = monthTableName(tables.messageTablePrefix, Date.now())
  const now = Math.floor(Date.now() / 1000)
  await withStorage(server.endpoint, tables, Effect.gen(function*() {
    const storage = yield* Storage
    yield* storage.createTables([table])
    yield* storage.registerUser({ uaid, routerType: "webpush", routerData: {}, connectedAt, nodeId, lastConnect, currentMonth: table, recordVersion: 1 })
    yield* storage.addChannels(uaid, table, [chid, otherChid])
    yield* storage.saveMessages(uaid, table, [
      { channelId: chid, version: "m-topic", ttl: 3600, timestamp: now, topic: "weather" },
      { channelId: chid, version: "m-ts-1", ttl: 3600, timestamp: now, sortkeyTimestamp: Date.now() },
      { channelId: otherChid, version: "m-ts-2", ttl: 3600, timestamp: now, sortkeyTimestamp: Date.now() + 1 },
      // Expired: not counted.
      { channelId: chid, version: "m-old", ttl: 60, timestamp: now - 7200, sortkeyTimestamp: Date.now() - 7_200_000 }
    ])
  }))
})
afterAll(() => server?.close())

const diagnose = (args: ReadonlyArray<string>, keys: ReadonlyArray<string> = [KEY]) =>
  runTool("endpoint-diagnostic", [...args, ...storageFlags(server.endpoint, tables), "--crypto-key", `[${keys.join(",")}]`])

const json = (stdout: string) => JSON.parse(stdout) as {
  uaid: string
  chid: string
  endpoint: { pathVersion: string | null; tokenVersion: string; cryptoKey: number; cryptoKeys: number; vapidKeyHash: string | null; vapidKeyMatches?: boolean }
  router: { routerType: string; nodeId: string | null; connectedAt: number; connectedAtIso: string; lastConnect: number; currentMonth: string; currentMonthActive: boolean } | null
  channelRegistered: boolean | null
  messages: { total: number; topic: number; timestamp: number; channel: number } | null
  sender?: { vapidKey: string | null; warnings: Array<string> }
  problems: Array<string>
}

describe("endpoint-diagnostic", () => {
  it("prints uaid, chid, router record, channel and stored messages of a v1 endpoint", async () => {
    const url = await makeEndpoint([KEY], uaid, chid)
    expect(url).toMatch(/^https:\/\/push\.example\.com\/wpush\/v1\//)
    const run = await diagnose([url])
    expect(run.code, run.stderr).toBe(0)
    const out = run.stdout
    expect(out).toMatch(new RegExp(`^uaid: +${uaid}$`, "m"))
    expect(out).toMatch(new RegExp(`^chid: +${chid}$`, "m"))
    expect(out).toMatch(/^endpoint: +v1, not bound to a VAPID key$/m)
    expect(out).toMatch(/^crypto key: +#1 of 1$/m)
    expect(out).toMatch(/^ {2}router_type: +webpush$/m)
    expect(out).toMatch(new RegExp(`^  node_id: +${nodeId}$`, "m"))
    expect(out).toMatch(new RegExp(`^  connected_at: +${new Date(connectedAt).toISOString()} \\(${connectedAt}; \\d+ min ago\\)$`, "m"))
    expect(out).toMatch(new RegExp(`^  last_connect: +${lastConnect} \\(\\d{4}-\\d\\d, hour \\d\\d UTC, spread 2\\)$`, "m"))
    expect(out).toMatch(/^ {2}record_version: +1$/m)
    expect(out).toMatch(new RegExp(`^  current_month: +${table} \\(active\\)$`, "m"))
    expect(out).toMatch(new RegExp(`^channel: +registered in ${table}$`, "m"))
    expect(out).toMatch(/^stored messages: +3 unexpired \(1 topic, 2 timestamp\); 2 for this channel$/m)
    expect(out).toMatch(/^verdict: +ok/m)
  })

  it("--json: a v2 endpoint, its key hash, and whether a VAPID key matches", async () => {
    const url = await makeEndpoint([KEY], uaid, chid, vapidKey)
    const run = await diagnose(["--json", url, "--vapid-key", vapidKey.toString("base64url")])
    expect(run.code, run.stderr).toBe(0)
    const d = json(run.stdout)
    expect(d.uaid).toBe(uaid)
    expect(d.chid).toBe(chid)
    expect(d.endpoint).toMatchObject({ pathVersion: "v2", tokenVersion: "v2", cryptoKey: 1, cryptoKeys: 1, vapidKeyMatches: true })
    expect(d.endpoint.vapidKeyHash).toMatch(/^[0-9a-f]{64}$/)
    expect(d.router).toMatchObject({ routerType: "webpush", nodeId, connectedAt, lastConnect, currentMonth: table, currentMonthActive: true })
    expect(d.router?.connectedAtIso).toBe(new Date(connectedAt).toISOString())
    expect(d.channelRegistered).toBe(true)
    expect(d.messages).toEqual({ total: 3, topic: 1, timestamp: 2, channel: 2 })
    expect(d.problems).toEqual([])

    const human = await diagnose([url])
    expect(human.stdout).toContain(`bound to a VAPID key (sha256 ${d.endpoint.vapidKeyHash?.slice(0, 16)}…)`)

    const mismatch = await diagnose(["--json", url, "--vapid-key", otherVapid.getPublicKey().toString("base64url")])
    expect(mismatch.code).toBe(1)
    expect(json(mismatch.stdout).endpoint.vapidKeyMatches).toBe(false)
    expect(json(mismatch.stdout).problems.join()).toContain("bound to another VAPID key")
  })

  it("--authorization: a sender's VAPID header checked for the endpoint, with the warnings its pushes would get", async () => {
    const { privateKey, publicKey } = await generateKeyPair("ES256", { extractable: true })
    const jwk = await exportJWK(publicKey)
    const senderKey = Buffer.concat([Buffer.from([4]), Buffer.from(jwk.x!, "base64url"), Buffer.from(jwk.y!, "base64url")])
    const sign = (claims: Record<string, unknown>) => new SignJWT(claims).setProtectedHeader({ alg: "ES256", typ: "JWT" }).sign(privateKey)
    const exp = Math.floor(Date.now() / 1000) + 3600
    const url = await makeEndpoint([KEY], uaid, chid, senderKey)
    const header = async (sub: string) => `vapid t=${await sign({ aud: ENDPOINT_URL, exp, sub })}, k=${senderKey.toString("base64url")}`

    const local = await diagnose(["--json", url, "--authorization", await header("mailto:me@localhost")])
    expect(local.code, local.stderr).toBe(0)
    expect(json(local.stdout)).toMatchObject({ sender: { vapidKey: senderKey.toString("base64url"), warnings: ["vapid-sub-local"] }, problems: [] })
    const human = await diagnose([url, "--authorization", await header("mailto:me@localhost")])
    expect(human.stdout).toMatch(/^sender: +VAPID key .{16}…: 1 warning\(s\) \(Autopush-Warning\)$/m)
    expect(human.stdout).toMatch(/^ {2}- vapid-sub-local: VAPID sub is a contact at localhost/m)

    const fine = await diagnose(["--json", url, "--authorization", await header("mailto:ops@example.com")])
    expect(json(fine.stdout).sender).toEqual({ vapidKey: senderKey.toString("base64url"), warnings: [] })

    // Signed for another origin: what the endpoint node refuses is a problem, not a warning.
    const elsewhere = `vapid t=${await sign({ aud: "https://other.example", exp, sub: "mailto:ops@example.com" })}, k=${senderKey.toString("base64url")}`
    const refused = await diagnose(["--json", url, "--authorization", elsewhere])
    expect(refused.code).toBe(1)
    expect(json(refused.stdout).problems).toEqual([expect.stringContaining("--authorization: Invalid VAPID audience (for https://push.example.com; the endpoint node answers 401, errno 109)")])

    // The endpoint is bound to another key than the header's.
    const other = await makeEndpoint([KEY], uaid, chid, vapidKey)
    const mismatch = await diagnose(["--json", other, "--authorization", await header("mailto:ops@example.com")])
    expect(mismatch.code).toBe(1)
    expect(json(mismatch.stdout).problems.join()).toContain("bound to another VAPID key")
  })

  it("accepts the path alone, the bare token, /wpush/TOKEN, and says when the path's version is wrong", async () => {
    const v2 = await makeEndpoint([KEY], uaid, chid, vapidKey)
    const token = v2.split("/").at(-1)!
    for (const form of [new URL(v2).pathname, token, `http://localhost:8082/wpush/v2/${token}?x=1`, `http://proxy/push-service/v2/${token}`]) {
      const run = await diagnose(["--json", form])
      expect(run.code, `${form}: ${run.stderr}`).toBe(0)
      expect(json(run.stdout).endpoint.tokenVersion).toBe("v2")
    }
    const noVersion = await diagnose(["--json", `${ENDPOINT_URL}/wpush/${token}`])
    expect(noVersion.code).toBe(1)
    const d = json(noVersion.stdout)
    expect(d.endpoint.pathVersion).toBe("v1")
    expect(d.problems).toEqual([expect.stringContaining("the URL says v1 but the token is v2")])
  })

  it("tells which of rotated keys made the endpoint", async () => {
    const url = await makeEndpoint([OLD_KEY], uaid, chid)
    const run = await diagnose([url], [KEY, OLD_KEY])
    expect(run.code, run.stderr).toBe(0)
    expect(run.stdout).toMatch(/^crypto key: +#2 of 2 \(an older key: new endpoints use #1\)$/m)
  })

  it("a token that no key opens: exit 1, says so", async () => {
    const url = await makeEndpoint([OLD_KEY], uaid, chid)
    const run = await diagnose([url], [KEY])
    expect(run.code).toBe(1)
    expect(run.stderr).toContain("the token does not decrypt with the configured crypto key (bad signature)")
    const two = await diagnose([url], [KEY, generateFernetKey()])
    expect(two.stderr).toContain("any of the 2 configured crypto keys")
    const garbage = await diagnose([`${ENDPOINT_URL}/wpush/v1/abcdef`])
    expect(garbage.code).toBe(1)
    expect(garbage.stderr).toContain("not an endpoint token (malformed)")
  })

  it("a user that is gone, or a channel that is not registered: exit 1 with the reason", async () => {
    const gone = await diagnose(["--json", await makeEndpoint([KEY], "0123456789abcdef0123456789abcdef", chid)])
    expect(gone.code).toBe(1)
    const d = json(gone.stdout)
    expect(d.router).toBeNull()
    expect(d.problems).toEqual([expect.stringContaining("no router record for this uaid")])
    const human = await diagnose([await makeEndpoint([KEY], "0123456789abcdef0123456789abcdef", chid)])
    expect(human.stdout).toMatch(/^router record: +none$/m)
    expect(human.stdout).toMatch(/^verdict: +NOT deliverable$/m)

    const unregistered = await diagnose(["--json", await makeEndpoint([KEY], uaid, "99999999-9999-4999-8999-999999999999")])
    expect(unregistered.code).toBe(1)
    const u = json(unregistered.stdout)
    expect(u.channelRegistered).toBe(false)
    expect(u.messages?.channel).toBe(0)
    expect(u.problems).toEqual([expect.stringContaining("the channel is not registered")])
  })

  it("on the embedded data of a stopped all-in-one, uses the keys it generated in data_dir/secrets.json", async () => {
    const dataDir = join(scratch("embedded"), "data")
    const embedded = await startServer(join(dataDir, "dynalite"))
    const plain = { routerTable: "router", messageTablePrefix: "message", noTableRotation: false }
    const month = monthTableName("message", Date.now())
    await withStorage(embedded.endpoint, plain, Effect.gen(function*() {
      const storage = yield* Storage
      yield* storage.createTables([month])
      yield* storage.registerUser({ uaid, routerType: "webpush", routerData: {}, connectedAt, currentMonth: month })
      yield* storage.addChannel(uaid, month, chid)
    }))
    await embedded.close()
    writeFileSync(join(dataDir, "secrets.json"), JSON.stringify({ crypto_key: [OLD_KEY], auth_keys: ["a"] }))
    const run = await runTool("endpoint-diagnostic", ["--json", await makeEndpoint([OLD_KEY], uaid, chid), "--data-dir", dataDir])
    expect(run.code, run.stderr).toBe(0)
    const d = json(run.stdout)
    expect(d.router?.currentMonth).toBe(month)
    expect(d.messages).toEqual({ total: 0, topic: 0, timestamp: 0, channel: 0 })
    expect(d.problems).toEqual([])
  })

  it("--help exits 0; a missing or bad URL exits 2; no crypto key exits 2", async () => {
    const [help, none, bad, noKey] = await Promise.all([
      runTool("endpoint-diagnostic", ["--help"]),
      runTool("endpoint-diagnostic", []),
      runTool("endpoint-diagnostic", ["https://push.example.com/a/b/c/d"]),
      runTool("endpoint-diagnostic", ["abc", "--storage-endpoint", server.endpoint])
    ])
    expect(help.code).toBe(0)
    expect(help.stdout.trimEnd()).toBe(diagnosticHelp())
    expect(help.stdout).toContain("Usage: endpoint-diagnostic [options] URL")
    expect(help.stdout).toContain("--crypto-key LIST")
    expect(none.code).toBe(2)
    expect(none.stderr).toContain("endpoint-diagnostic: an endpoint URL is required (see endpoint-diagnostic --help)")
    expect(bad.code).toBe(2)
    expect(bad.stderr).toContain('not an endpoint URL: "https://push.example.com/a/b/c/d"')
    expect(noKey.code).toBe(2)
    expect(noKey.stderr).toContain("crypto_key is required")
  })

  it("bad arguments are usage errors found before settings or storage are read", async () => {
    const cases: ReadonlyArray<readonly [ReadonlyArray<string>, string]> = [
      [["https://push.example.com/"], "not an endpoint URL"],
      [["https://push.example.com/wpush/v1/a/b"], "not an endpoint URL"],
      [["https://push.example.com/wpush/v3/abc"], "API version v3 is not v1 or v2"],
      [["ftp://push.example.com/wpush/v1/abc"], "not an http(s) URL"],
      [["https://push.example.com/wpush/v1/not*a*token"], "not an endpoint token"],
      [["https://"], "not a URL"],
      [["/wpush/v1/%E0%A4%A"], "not a URL path"],
      [["a", "b"], "one URL at a time"],
      [["abc", "--vapid-key", "nope"], "--vapid-key: not a P-256 public key"],
      [["abc", "--frobnicate"], "unknown flag --frobnicate"]
    ]
    for (const [args, message] of cases) {
      const exit = await Effect.runPromiseExit(endpointDiagnostic(args))
      expect(Exit.isFailure(exit), args.join(" ")).toBe(true)
      const error = Exit.isFailure(exit) ? (Cause.squash(exit.cause) as { _tag: string; message: string }) : undefined
      expect(error?._tag, args.join(" ")).toBe("UsageError")
      expect(error?.message, args.join(" ")).toContain(message)
    }
  })
})
