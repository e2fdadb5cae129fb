/**
 * DynamoDB Local as docker-compose.yml runs it (`-sharedDb -dbPath`): what a node wrote is there
 * after DynamoDB Local stops and starts again on the same directory, so `docker compose down` and
 * `up` keep every subscription and stored message.
 */
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { layerDynamo } from "../../src/storage/dynamo/layer.ts"
import { createActiveTables, Storage } from "../../src/storage/Storage.ts"
import { startDynamoDbLocal } from "./dynamodb-local.ts"

const uaid = "0123456789abcdef0123456789abcdef"
const channelId = "00000000-0000-4000-8000-000000000001"
const tables = { routerTable: "router", messageTablePrefix: "message", noTableRotation: false }

const onDisk = (path: string) =>
  Effect.acquireRelease(Effect.promise(() => startDynamoDbLocal({ path })), (running) => Effect.promise(running.stop))

const withStorage = <A, E>(endpoint: string, body: Effect.Effect<A, E, Storage>) =>
  body.pipe(Effect.provide(layerDynamo({ ...tables, endpoint, region: "local" })))

describe("DynamoDB Local on disk", () => {
  it.live("a user, a channel and a stored message outlive a restart", () =>
    Effect.gen(function*() {
      const path = mkdtempSync(join(tmpdir(), "autopush-dynamodb-local-"))
      const now = Date.now()
      const table = yield* Effect.scoped(
        Effect.gen(function*() {
          const first = yield* onDisk(path)
          return yield* withStorage(
            first.endpoint,
            Effect.gen(function*() {
              const s = yield* Storage
              yield* createActiveTables
              const current = yield* s.currentMessageTable
              assert.isTrue(yield* s.registerUser({ uaid, routerType: "webpush", routerData: {}, connectedAt: now, currentMonth: current }))
              assert.isTrue(yield* s.addChannel(uaid, current, channelId))
              yield* s.saveMessage(uaid, current, { channelId, version: "v1", ttl: 3600, timestamp: Math.floor(now / 1000) })
              return current
            })
          )
        })
      )
      yield* Effect.scoped(
        Effect.gen(function*() {
          const second = yield* onDisk(path)
          yield* withStorage(
            second.endpoint,
            Effect.gen(function*() {
              const s = yield* Storage
              const user = yield* s.getUser(uaid)
              assert.strictEqual(user?.connectedAt, now)
              assert.strictEqual(user?.currentMonth, table)
              assert.deepStrictEqual([...(yield* s.getChannels(uaid, table))], [channelId])
              const stored = yield* s.fetchTimestampMessages(uaid, table, undefined, 10)
              assert.deepStrictEqual(stored.messages.map((m) => m.version), ["v1"])
            })
          )
        })
      )
    }), 180_000)
})
