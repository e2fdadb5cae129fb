/**
 * What the DynamoDB layer writes, read back with the raw SDK: autopush's table and item layout
 * with one row per channel, and autopush's channel sets (one item per user) still read, so tables
 * written by autopush stay usable.
 */
import { DescribeTableCommand, DescribeTimeToLiveCommand, DynamoDBClient, GetItemCommand, PutItemCommand } from "@aws-sdk/client-dynamodb"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { TestClock } from "effect/testing"
import { layerDynamo } from "../../src/storage/dynamo/layer.ts"
import { createActiveTables, Storage } from "../../src/storage/Storage.ts"

export const schemaSuite = (name: string, endpoint: () => string, options: { readonly ttl: boolean }) =>
  describe(`DynamoDB layout: ${name}`, () => {
    it.effect("tables, index, TTL and items are autopush's", () => {
      const prefix = `s${Date.now().toString(36)}`
      const storageOptions = { routerTable: `${prefix}_router`, messageTablePrefix: `${prefix}_message`, noTableRotation: false }
      const client = new DynamoDBClient({
        endpoint: endpoint(),
        region: "local",
        credentials: { accessKeyId: "autopush", secretAccessKey: "autopush" }
      })
      const send = <A>(f: () => Promise<A>) => Effect.promise(f)
      const uaid = "deadbeef00000000deadbeef00000000"
      const chid = "00000000-0000-4000-8000-000000000001"
      const now = Date.UTC(2034, 4, 15, 12)
      return Effect.gen(function*() {
        yield* TestClock.setTime(now)
        yield* createActiveTables
        const s = yield* Storage
        const table = yield* s.currentMessageTable
        assert.strictEqual(table, `${prefix}_message_2034_05`)

        const router = (yield* send(() => client.send(new DescribeTableCommand({ TableName: storageOptions.routerTable })))).Table
        assert.deepStrictEqual(router?.KeySchema, [{ AttributeName: "uaid", KeyType: "HASH" }])
        assert.strictEqual(router?.BillingModeSummary?.BillingMode, "PAY_PER_REQUEST")
        const index = router?.GlobalSecondaryIndexes?.[0]
        assert.strictEqual(index?.IndexName, "AccessIndex")
        assert.deepStrictEqual(index?.KeySchema, [{ AttributeName: "last_connect", KeyType: "HASH" }])
        assert.strictEqual(index?.Projection?.ProjectionType, "KEYS_ONLY")

        const messages = (yield* send(() => client.send(new DescribeTableCommand({ TableName: table })))).Table
        assert.deepStrictEqual(messages?.KeySchema, [
          { AttributeName: "uaid", KeyType: "HASH" },
          { AttributeName: "chidmessageid", KeyType: "RANGE" }
        ])
        if (options.ttl) {
          const ttl = yield* send(() => client.send(new DescribeTimeToLiveCommand({ TableName: table })))
          assert.strictEqual(ttl.TimeToLiveDescription?.AttributeName, "expiry")
          assert.strictEqual(ttl.TimeToLiveDescription?.TimeToLiveStatus, "ENABLED")
        }

        yield* s.registerUser({
          uaid,
          routerType: "webpush",
          routerData: {},
          connectedAt: now,
          nodeId: "http://node:8081",
          lastConnect: 2034051200_07,
          currentMonth: table,
          recordVersion: 1
        })
        yield* s.addChannel(uaid, table, chid)
        yield* s.saveMessage(uaid, table, {
          channelId: chid,
          version: "gAAAA-version",
          ttl: 60,
          timestamp: now / 1000,
          sortkeyTimestamp: now,
          data: "AAEC",
          headers: { encoding: "aes128gcm" }
        })
        yield* s.saveMessage(uaid, table, { channelId: chid, version: "v2", ttl: 60, timestamp: now / 1000, topic: "news" })

        const get = (TableName: string, Key: Record<string, { S: string }>) =>
          send(() => client.send(new GetItemCommand({ TableName, Key, ConsistentRead: true }))).pipe(
            Effect.map((r) => r.Item)
          )
        assert.deepStrictEqual(yield* get(storageOptions.routerTable, { uaid: { S: uaid } }), {
          uaid: { S: uaid },
          connected_at: { N: String(now) },
          router_type: { S: "webpush" },
          router_data: { M: {} },
          node_id: { S: "http://node:8081" },
          last_connect: { N: "203405120007" },
          current_month: { S: table },
          record_version: { N: "1" }
        })
        assert.deepStrictEqual(yield* get(table, { uaid: { S: uaid }, chidmessageid: { S: " " } }), {
          uaid: { S: uaid },
          chidmessageid: { S: " " },
          channel_count: { N: "1" }
        })
        assert.deepStrictEqual(yield* get(table, { uaid: { S: uaid }, chidmessageid: { S: `00:${chid}` } }), {
          uaid: { S: uaid },
          chidmessageid: { S: `00:${chid}` }
        })
        assert.deepStrictEqual(yield* get(table, { uaid: { S: uaid }, chidmessageid: { S: `02:${now}:${chid}` } }), {
          uaid: { S: uaid },
          chidmessageid: { S: `02:${now}:${chid}` },
          updateid: { S: "gAAAA-version" },
          ttl: { N: "60" },
          timestamp: { N: String(now / 1000) },
          expiry: { N: String(now / 1000 + 60) },
          data: { S: "AAEC" },
          headers: { M: { encoding: { S: "aes128gcm" } } }
        })
        // A cancel leaves a tombstone: key, version and `expiry` (the TTL attribute) kept, data and headers gone.
        assert.isTrue(yield* s.cancelMessage(uaid, table, { kind: "timestamp", channelId: chid, sortkeyTimestamp: now }, "gAAAA-version"))
        assert.deepStrictEqual(yield* get(table, { uaid: { S: uaid }, chidmessageid: { S: `02:${now}:${chid}` } }), {
          uaid: { S: uaid },
          chidmessageid: { S: `02:${now}:${chid}` },
          updateid: { S: "gAAAA-version" },
          ttl: { N: "60" },
          timestamp: { N: String(now / 1000) },
          expiry: { N: String(now / 1000 + 60) },
          cancelled: { N: "1" }
        })
        assert.deepStrictEqual(yield* get(table, { uaid: { S: uaid }, chidmessageid: { S: `01:${chid}:news` } }), {
          uaid: { S: uaid },
          chidmessageid: { S: `01:${chid}:news` },
          updateid: { S: "v2" },
          ttl: { N: "60" },
          timestamp: { N: String(now / 1000) },
          expiry: { N: String(now / 1000 + 60) },
          topic: { S: "news" }
        })
      }).pipe(
        Effect.provide(layerDynamo({ ...storageOptions, endpoint: endpoint(), region: "local" })),
        Effect.ensuring(Effect.sync(() => client.destroy()))
      )
    })

    it.effect("a channel set written as autopush's `chids` string set is read, checked and removed from", () => {
      const prefix = `l${Date.now().toString(36)}`
      const storageOptions = { routerTable: `${prefix}_router`, messageTablePrefix: `${prefix}_message`, noTableRotation: true }
      const client = new DynamoDBClient({
        endpoint: endpoint(),
        region: "local",
        credentials: { accessKeyId: "autopush", secretAccessKey: "autopush" }
      })
      const uaid = "deadbeef00000000deadbeef00000001"
      const [old1, old2, fresh] = ["00000000-0000-4000-8000-00000000000a", "00000000-0000-4000-8000-00000000000b", "00000000-0000-4000-8000-00000000000c"]
      return Effect.gen(function*() {
        yield* createActiveTables
        const s = yield* Storage
        const table = yield* s.currentMessageTable
        yield* Effect.promise(() =>
          client.send(new PutItemCommand({
            TableName: table,
            Item: { uaid: { S: uaid }, chidmessageid: { S: " " }, chids: { SS: [old1, old2] } }
          }))
        )
        assert.isTrue(yield* s.addChannel(uaid, table, fresh, 10))
        assert.deepStrictEqual([...(yield* s.getChannels(uaid, table))].sort(), [old1, old2, fresh])
        assert.deepStrictEqual(
          [yield* s.hasChannel(uaid, table, old1), yield* s.hasChannel(uaid, table, fresh), yield* s.hasChannel(uaid, table, "00000000-0000-4000-8000-00000000000d")],
          [true, true, false]
        )
        assert.isTrue(yield* s.removeChannel(uaid, table, old1))
        assert.isTrue(yield* s.removeChannel(uaid, table, fresh))
        assert.isFalse(yield* s.removeChannel(uaid, table, fresh))
        assert.deepStrictEqual([...(yield* s.getChannels(uaid, table))], [old2])

        // A topic row written without the ms it was accepted at: its seconds decide which is newer.
        yield* Effect.promise(() =>
          client.send(new PutItemCommand({
            TableName: table,
            Item: {
              uaid: { S: uaid },
              chidmessageid: { S: `01:${old2}:news` },
              updateid: { S: "legacy" },
              ttl: { N: "600" },
              timestamp: { N: "1700000000" },
              expiry: { N: String(Math.floor(Date.now() / 1000) + 600) }
            }
          }))
        )
        const topic = { channelId: old2, topic: "news", ttl: 600, timestamp: 1_699_999_999 }
        assert.strictEqual(yield* s.saveMessage(uaid, table, { ...topic, version: "older", sortkeyTimestamp: 1_699_999_999_500 }), "superseded")
        assert.strictEqual(yield* s.saveMessage(uaid, table, { ...topic, version: "newer", sortkeyTimestamp: 1_700_000_001_000 }), "stored")
      }).pipe(
        Effect.provide(layerDynamo({ ...storageOptions, endpoint: endpoint(), region: "local" })),
        Effect.ensuring(Effect.sync(() => client.destroy()))
      )
    })
  })
