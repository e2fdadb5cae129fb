/** The embedded default: dynalite on LevelDB in this process, data surviving restarts and `kill -9`. */
import { spawn } from "node:child_process"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { afterAll } from "vitest"
import { layerEmbedded } from "../../src/storage/embedded.ts"
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
})
