/** The embedded default: dynalite on LevelDB in this process, data surviving restarts and `kill -9`. */
import { spawn } from "node:child_process"
import { existsSync, lstatSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, symlinkSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { afterAll } from "vitest"
import { scopedDynamoClient } from "../../src/storage/dynamo/client.ts"
import { embeddedEndpointFile, layerEmbedded, runningEmbeddedEndpoint, startDynalite } from "../../src/storage/dynalite/embedded.ts"
import { Storage } from "../../src/storage/Storage.ts"

const root = mkdtempSync(join(tmpdir(), "autopush-embedded-"))
afterAll(() => rmSync(root, { recursive: true, force: true }))

const options = (dataDir: string) => ({ dataDir, routerTable: "router", messageTablePrefix: "message", noTableRotation: false })
const uaid = "deadbeef00000000deadbeef00000001"
const chid = "00000000-0000-4000-8000-000000000001"
const child = join(import.meta.dirname, "fixtures", "embedded-child.ts")

/** Run the child; resolve with its stdout once `until` appears in it (then SIGKILL it) or it exits. */
const runChild = (args: ReadonlyArray<string>, until?: string) =>
  new Promise<string>((resolve, reject) => {
    const proc = spawn(process.execPath, [child, ...args], { stdio: ["ignore", "pipe", "pipe"] })
    let out = ""
    let err = ""
    proc.stdout.on("data", (chunk: Buffer) => {
      out += chunk.toString()
      if (until !== undefined && out.includes(until)) proc.kill("SIGKILL")
    })
    proc.stderr.on("data", (chunk: Buffer) => (err += chunk.toString()))
    proc.on("error", reject)
    proc.on("exit", (code, signal) =>
      (until !== undefined ? signal === "SIGKILL" : code === 0)
        ? resolve(out)
        : reject(new Error(`child exited ${code ?? signal}: ${err}`)))
  })

describe("embedded dynalite", () => {
  it.live("creates the data directory and the active tables, and keeps data across a restart", () =>
    Effect.gen(function*() {
      const dataDir = join(root, "restart", "nested")
      const write = Effect.gen(function*() {
        const storage = yield* Storage
        assert.isTrue((yield* storage.checkTables).every((t) => t.ok))
        const table = yield* storage.currentMessageTable
        yield* storage.registerUser({ uaid, routerType: "webpush", routerData: {}, connectedAt: 1, currentMonth: table })
        yield* storage.addChannel(uaid, table, chid)
      })
      yield* write.pipe(Effect.provide(layerEmbedded(options(dataDir))))
      const user = yield* Storage.use((s) => s.getUser(uaid)).pipe(Effect.provide(layerEmbedded(options(dataDir))))
      assert.strictEqual(user?.connectedAt, 1)
    }))

  it.live("embedded.json names the running server, mode 0600; a link planted at its path is replaced, never written through", () =>
    Effect.gen(function*() {
      const dir = join(root, "announce")
      const dataDir = join(dir, "data")
      mkdirSync(dir, { recursive: true })
      const target = join(root, "not-yours")
      writeFileSync(target, "keep me")
      symlinkSync(target, embeddedEndpointFile(dataDir))
      yield* Effect.scoped(Effect.gen(function*() {
        yield* Storage
        const file = embeddedEndpointFile(dataDir)
        assert.isFalse(lstatSync(file).isSymbolicLink())
        assert.strictEqual(statSync(file).mode & 0o777, 0o600)
        const { pid, endpoint } = JSON.parse(readFileSync(file, "utf8")) as { pid: number; endpoint: string }
        assert.strictEqual(pid, process.pid)
        assert.strictEqual(runningEmbeddedEndpoint(dataDir), endpoint)
      }).pipe(Effect.provide(layerEmbedded(options(dataDir)))))
      assert.strictEqual(readFileSync(target, "utf8"), "keep me")
      assert.isFalse(existsSync(embeddedEndpointFile(dataDir)), "removed when the server stops")
      assert.deepStrictEqual(readdirSync(dir).filter((name) => name.endsWith(".tmp")), [])
    }))

  it.live("data written by a process that is then SIGKILLed is read back by the next one", () =>
    Effect.gen(function*() {
      const dataDir = join(root, "kill9")
      yield* Effect.promise(() => runChild([dataDir, "write", uaid], "written"))
      const out = yield* Effect.promise(() => runChild([dataDir, "read", uaid]))
      const { user, channels } = JSON.parse(out) as { user: { uaid: string; connectedAt: number }; channels: Array<string> }
      assert.strictEqual(user.uaid, uaid)
      assert.strictEqual(user.connectedAt, 1234)
      assert.deepStrictEqual(channels, [chid])
    }), 60_000)

  it.live("an expression parsed once is still checked against each request's item, and a bad one refused every time", () =>
    Effect.gen(function*() {
      const endpoint = yield* startDynalite(join(root, "expressions"))
      const client = yield* scopedDynamoClient({ endpoint, region: "local" })
      const abortSignal = new AbortController().signal
      const send = <A>(promise: Promise<A>) => Effect.promise(() => promise.then((value) => ({ ok: true as const, value }), (error: Error) => ({ ok: false as const, name: error.name })))
      yield* Effect.promise(() => client.send("CreateTable", {
        TableName: "memo",
        KeySchema: [{ AttributeName: "k", KeyType: "HASH" }],
        AttributeDefinitions: [{ AttributeName: "k", AttributeType: "S" }],
        BillingMode: "PAY_PER_REQUEST"
      }, { abortSignal }))
      const put = (k: string) =>
        send(client.send("PutItem", {
          TableName: "memo",
          Item: { k: { S: k } },
          ConditionExpression: "attribute_not_exists(#k)",
          ExpressionAttributeNames: { "#k": "k" }
        }, { abortSignal }))
      assert.isTrue((yield* put("a")).ok)
      assert.isTrue((yield* put("b")).ok)
      const again = yield* put("a")
      assert.isFalse(again.ok)
      assert.strictEqual(again.ok ? "" : again.name, "ConditionalCheckFailedException")
      const unused = () =>
        send(client.send("GetItem", { TableName: "memo", Key: { k: { S: "a" } }, ProjectionExpression: "#k", ExpressionAttributeNames: { "#k": "k", "#x": "x" } }, { abortSignal }))
      for (const answer of [yield* unused(), yield* unused()]) {
        assert.strictEqual(answer.ok ? "" : answer.name, "ValidationException")
      }
      const projected = yield* send(client.send("GetItem", { TableName: "memo", Key: { k: { S: "b" } }, ProjectionExpression: "#k", ExpressionAttributeNames: { "#k": "k" } }, { abortSignal }))
      assert.deepStrictEqual(projected.ok ? projected.value.Item : undefined, { k: { S: "b" } })
    }).pipe(Effect.scoped), 60_000)
})
