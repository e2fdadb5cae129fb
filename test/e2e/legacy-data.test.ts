/**
 * A data directory an earlier version wrote (dynalite under data_dir/dynalite) starts as it is: the
 * all-in-one says once that it keeps running on it and how to move it to SQLite, makes no SQLite
 * database beside it, and a returning client gets what was stored for it.
 */
import { existsSync, mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect, Exit, Scope } from "effect"
import { afterAll, describe, expect, it } from "vitest"
import { lastConnectValue } from "../../src/domain/user.ts"
import { layerDynamo } from "../../src/storage/dynamo/layer.ts"
import { startDynalite } from "../../src/storage/dynalite/embedded.ts"
import { createActiveTables, Storage } from "../../src/storage/Storage.ts"
import { openClient } from "../connection/client.ts"
import { startAllInOne } from "./servers.ts"

const dir = mkdtempSync(join(tmpdir(), "autopush-legacy-"))
afterAll(() => rmSync(dir, { recursive: true, force: true }))

const uaid = "0123456789abcdef0123456789abcdef"
const channelId = "00000000-0000-4000-8000-000000000042"

/** What an earlier version left under `dataDir`: a user with a channel and a message stored for it. */
const writeEarlierData = async (dataDir: string) => {
  const scope = Effect.runSync(Scope.make())
  try {
    const endpoint = await Effect.runPromise(Scope.provide(startDynalite(join(dataDir, "dynalite")), scope))
    await Effect.runPromise(Effect.gen(function*() {
      const storage = yield* Storage
      yield* createActiveTables
      const table = yield* storage.currentMessageTable
      const now = Date.now()
      yield* storage.registerUser({ uaid, routerType: "webpush", routerData: {}, connectedAt: now - 60_000, lastConnect: lastConnectValue(now), currentMonth: table, recordVersion: 1 })
      yield* storage.addChannel(uaid, table, channelId)
      yield* storage.saveMessage(uaid, table, { channelId, version: "stored-before-the-upgrade", ttl: 3600, timestamp: Math.floor(now / 1000) })
    }).pipe(Effect.provide(layerDynamo({ routerTable: "router", messageTablePrefix: "message", noTableRotation: false, endpoint, region: "local" }))))
  } finally {
    await Effect.runPromise(Scope.close(scope, Exit.void))
  }
}

describe("dynalite data of an earlier version", () => {
  it("keeps running on it, said once with how to migrate; a returning client gets its stored message", async () => {
    const dataDir = join(dir, "data")
    await writeEarlierData(dataDir)
    const deployment = await startAllInOne(["--data-dir", dataDir])
    try {
      const output = deployment.output.join("\n")
      expect(output.match(/holds the data of an earlier version, and keeps running on it/g), output).toHaveLength(1)
      expect(output).toContain("`npm run maintenance -- export --out data.jsonl`; move the dynalite directory aside")
      expect(existsSync(join(dataDir, "autopush.sqlite"))).toBe(false)
      const client = await openClient(deployment.wsUrl)
      client.send({ messageType: "hello", uaid, use_webpush: true })
      const hello = await client.next((f) => f["messageType"] === "hello", 10_000)
      expect(hello["uaid"]).toBe(uaid)
      const notification = await client.next((f) => f["messageType"] === "notification", 10_000)
      expect([notification["channelID"], notification["version"]]).toEqual([channelId, "stored-before-the-upgrade"])
      await client.close()
    } finally {
      await deployment.stop()
    }
  }, 120_000)
})
