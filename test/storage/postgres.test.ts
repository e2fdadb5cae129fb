/**
 * The PostgreSQL store against a real server: the storage contract (every layer of it a pool of
 * its own on one database), then what is its own — two pools racing for the channel limit, the
 * sweep of expired rows, byte-ordered sort keys, a server stopped and started again (operations
 * fail within storage_timeout while it is down; the pool reconnects by itself), a server that
 * stops answering (each operation fails at storage_timeout with reason Timeout), and the
 * start-up check (a wrong password, a server that is not there).
 *
 * The server: `AUTOPUSH_TEST_POSTGRES_DSN` (CI sets it), else a throwaway cluster started through
 * `.ci/postgres.sh` where PostgreSQL's binaries are installed (`postgresServer.ts`). Under CI=true
 * without the variable, and where there is no PostgreSQL at all, the file fails, saying what it
 * needs: the lane never disappears silently.
 */
import { type AddressInfo, connect, createServer, type Socket } from "node:net"
import { assert, describe, it } from "@effect/vitest"
import { Context, Effect, Layer } from "effect"
import { TestClock } from "effect/testing"
import { layerPostgres, postgresDriver } from "../../src/storage/postgres/layer.ts"
import { scopedPostgres, sqlState } from "../../src/storage/postgres/pool.ts"
import { TOMBSTONE_SECONDS } from "../../src/storage/model.ts"
import { makeSqlMaintenance } from "../../src/storage/sql/maintenance.ts"
import { createActiveTables, Storage } from "../../src/storage/Storage.ts"
import { storageContract } from "./contract.ts"
import { describePostgres, privatePostgres } from "./postgresServer.ts"


/** A TCP proxy to `target`'s host and port that can stop forwarding (a server that accepts and never answers) and start again. */
const freezableProxy = async (target: URL) => {
  let frozen = false
  const held: Array<() => void> = []
  const sockets = new Set<Socket>()
  const proxy = createServer((client) => {
    const upstream = connect(Number(target.port), target.hostname)
    for (const socket of [client, upstream]) {
      sockets.add(socket)
      socket.on("error", () => socket.destroy())
      socket.on("close", () => sockets.delete(socket))
    }
    const forward = (from: Socket, to: Socket) =>
      from.on("data", (chunk: Buffer) => (frozen ? held.push(() => to.write(chunk)) : to.write(chunk)))
    forward(client, upstream)
    forward(upstream, client)
  })
  await new Promise<void>((resolve) => proxy.listen(0, "127.0.0.1", resolve))
  return {
    port: (proxy.address() as AddressInfo).port,
    freeze: () => void (frozen = true),
    thaw: () => {
      frozen = false
      for (const send of held.splice(0)) send()
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const socket of sockets) socket.destroy()
        proxy.close(() => resolve())
      })
  }
}

describePostgres("PostgreSQL store", (dsn) => {
  storageContract("postgres", (options) => layerPostgres({ ...options, dsn }))

  const uaid = (n: number) => n.toString(16).padStart(32, "0")
  const chid = (n: number) => `00000000-0000-4000-8000-${n.toString(16).padStart(12, "0")}`
  const T0 = Date.UTC(2034, 4, 15, 12)
  let tables = 0
  const fresh = (extra: { readonly dsn?: string; readonly timeoutMs?: number; readonly poolSize?: number } = {}) => {
    const name = `p${Date.now().toString(36)}${process.pid.toString(36)}${(tables++).toString(36)}`
    return { dsn, routerTable: `${name}_router`, messageTablePrefix: `${name}_message`, noTableRotation: true, ...extra }
  }
  const openStore = (options: ReturnType<typeof fresh>) => Effect.map(Layer.build(layerPostgres(options)), (context) => Context.get(context, Storage))

  describe("PostgreSQL store", () => {
    it.effect("two pools adding channels at once: the per-user limit holds", () =>
      Effect.gen(function*() {
        yield* TestClock.setTime(T0)
        const options = fresh()
        const a = yield* openStore(options)
        const b = yield* openStore(options)
        yield* createActiveTables.pipe(Effect.provideService(Storage, a))
        const table = options.messageTablePrefix
        const added = yield* Effect.forEach(
          Array.from({ length: 40 }, (_, i) => i),
          (i) => (i % 2 === 0 ? a : b).addChannel(uaid(1), table, chid(i), 10),
          { concurrency: "unbounded" }
        )
        assert.strictEqual(added.filter(Boolean).length, 10)
        assert.strictEqual((yield* a.getChannels(uaid(1), table)).size, 10)
      }).pipe(Effect.scoped))

    it.effect("the sweep deletes message rows once expired, tombstones 10 minutes after their cancel or ack, receipt rows a day past their expiry; reads never showed them", () =>
      Effect.gen(function*() {
        yield* TestClock.setTime(T0)
        const options = fresh()
        const s = yield* openStore(options)
        yield* createActiveTables.pipe(Effect.provideService(Storage, s))
        const table = options.messageTablePrefix
        const t0 = T0 / 1000
        yield* s.addChannel(uaid(1), table, chid(1))
        yield* s.saveMessages(uaid(1), table, [
          { channelId: chid(1), version: "short", ttl: 60, timestamp: t0, sortkeyTimestamp: T0 },
          { channelId: chid(1), version: "long", ttl: 3 * 86_400, timestamp: t0, sortkeyTimestamp: T0 + 1 },
          { channelId: chid(1), version: "cancelled", ttl: 3 * 86_400, timestamp: t0, sortkeyTimestamp: T0 + 2 },
            { channelId: chid(1), version: "acked", ttl: 3 * 86_400, timestamp: t0, sortkeyTimestamp: T0 + 3 }
        ])
        // A tombstone outlives its cancel or ack by TOMBSTONE_SECONDS, whatever the message's expiry.
        assert.isTrue(yield* s.cancelMessage(uaid(1), table, { kind: "timestamp", channelId: chid(1), sortkeyTimestamp: T0 + 2 }, "cancelled"))
        yield* s.ackMessages(uaid(1), table, [{ key: { kind: "timestamp", channelId: chid(1), sortkeyTimestamp: T0 + 3 }, version: "acked" }])
        yield* s.createReceiptSubscription("rs", t0 + 60)
        const connection = yield* scopedPostgres(dsn, { poolSize: 1, timeoutMs: 5_000 })
        const { sweepExpired } = makeSqlMaintenance(postgresDriver(connection), options)
        const rows = connection.run("count", async (query) => Number((await query(`SELECT COUNT(*) AS n FROM "${table}"`)).rows[0]?.["n"]))
        assert.strictEqual(yield* sweepExpired(T0 + 59_000), 0, "nothing expired yet")
        assert.strictEqual(yield* rows, 5)
        assert.strictEqual(yield* sweepExpired(T0 + 60_000), 1, "the short message, at its expiry")
        assert.strictEqual(yield* sweepExpired(T0 + (TOMBSTONE_SECONDS - 1) * 1000), 0, "the tombstones, still needed by a retried save")
          assert.deepStrictEqual(yield* s.saveMessages(uaid(1), table, [{ channelId: chid(1), version: "acked", ttl: 3 * 86_400, timestamp: t0, sortkeyTimestamp: T0 + 3 }]), [], "a retried save finds the tombstone")
        assert.strictEqual(yield* sweepExpired(T0 + TOMBSTONE_SECONDS * 1000), 2, "the two tombstones, their marker over")
        assert.strictEqual(yield* sweepExpired(T0 + 60_000 + 86_399_000), 0, "the receipt subscription, within its day")
        assert.strictEqual(yield* sweepExpired(T0 + 60_000 + 86_400_000), 1, "the receipt subscription, a day past its expiry")
        assert.strictEqual(yield* rows, 2, "the channel row (no expiry) and the long message stay")
        yield* TestClock.setTime(T0 + 60_000 + 86_400_000)
        assert.deepStrictEqual((yield* s.fetchTimestampMessages(uaid(1), table, undefined, 10)).messages.map((m) => m.version), ["long"])
        assert.deepStrictEqual([...(yield* s.getChannels(uaid(1), table))], [chid(1)])
      }).pipe(Effect.scoped))

    it.effect("a message table made before tombstones existed gets their column when the tables are made, its rows kept", () =>
      Effect.gen(function*() {
        yield* TestClock.setTime(T0)
        const options = fresh()
        const table = options.messageTablePrefix
        const t0 = T0 / 1000
        const connection = yield* scopedPostgres(dsn, { poolSize: 1, timeoutMs: 5_000 })
        yield* connection.run("old table", async (query) => {
          await query(`CREATE TABLE "${table}" (uaid TEXT COLLATE "C" NOT NULL, chidmessageid TEXT COLLATE "C" NOT NULL, updateid TEXT, ttl BIGINT, timestamp BIGINT, expiry BIGINT, sortkey_timestamp BIGINT, urgency TEXT, receipt TEXT, data TEXT, headers TEXT, PRIMARY KEY (uaid, chidmessageid))`)
          await query(
            `INSERT INTO "${table}" (uaid, chidmessageid, updateid, ttl, timestamp, expiry) VALUES ($1, $2, $3, $4, $5, $6)`,
            [uaid(1), `02:${T0}:${chid(1)}`, "old", 3600, t0, t0 + 3600]
          )
        })
        const s = yield* openStore(options)
        yield* createActiveTables.pipe(Effect.provideService(Storage, s))
        yield* createActiveTables.pipe(Effect.provideService(Storage, s))
        const old = { channelId: chid(1), version: "old", ttl: 3600, timestamp: t0, sortkeyTimestamp: T0 }
        assert.deepStrictEqual((yield* s.fetchTimestampMessages(uaid(1), table, undefined, 10)).messages, [old])
        assert.isTrue(yield* s.cancelMessage(uaid(1), table, { kind: "timestamp", channelId: chid(1), sortkeyTimestamp: T0 }, "old"))
        assert.deepStrictEqual(yield* s.saveMessages(uaid(1), table, [old]), [])
        assert.deepStrictEqual((yield* s.fetchTimestampMessages(uaid(1), table, undefined, 10)).messages, [])
      }).pipe(Effect.scoped))

    it.effect("sort keys compare byte by byte, whatever the database's locale", () =>
      Effect.gen(function*() {
        yield* TestClock.setTime(T0)
        const options = fresh()
        const s = yield* openStore(options)
        yield* createActiveTables.pipe(Effect.provideService(Storage, s))
        const table = options.messageTablePrefix
        // "00;" ends the channel rows: a locale that ignores punctuation would sort it among them.
        yield* s.addChannels(uaid(1), table, [chid(1), chid(2)])
        yield* s.saveMessage(uaid(1), table, { channelId: chid(1), version: "t", ttl: 60, timestamp: T0 / 1000, topic: "a" })
        assert.strictEqual((yield* s.getChannels(uaid(1), table)).size, 2)
        assert.deepStrictEqual((yield* s.fetchMessages(uaid(1), table, 10)).messages.map((m) => m.version), ["t"])
      }).pipe(Effect.scoped))

    it.live("a server stopped: operations fail within storage_timeout; started again: the same store goes on", () =>
      Effect.gen(function*() {
        const cluster = yield* Effect.acquireRelease(Effect.promise(() => privatePostgres()), (c) => Effect.sync(() => c.remove()))
        const options = fresh({ dsn: cluster.dsn, timeoutMs: 1_000, poolSize: 2 })
        const s = yield* openStore(options)
        yield* createActiveTables.pipe(Effect.provideService(Storage, s))
        yield* s.registerUser({ uaid: uaid(1), routerType: "webpush", routerData: {}, connectedAt: T0 })
        cluster.stop()
        const started = Date.now()
        const error = yield* Effect.flip(s.getUser(uaid(1)))
        assert.strictEqual(error.operation, "getUser")
        assert.isBelow(Date.now() - started, 5_000, "failed within storage_timeout (1 s), with a margin")
        assert.isDefined(yield* Effect.flip(s.registerUser({ uaid: uaid(2), routerType: "webpush", routerData: {}, connectedAt: T0 })))
        cluster.start()
        assert.strictEqual((yield* s.getUser(uaid(1)))?.connectedAt, T0, "the pool connected again by itself")
        assert.isTrue(yield* s.registerUser({ uaid: uaid(2), routerType: "webpush", routerData: {}, connectedAt: T0 }))
      }).pipe(Effect.scoped), 120_000)

    it.live("a server that stops answering: each operation fails at storage_timeout with reason Timeout; answering again, the store goes on", () =>
      Effect.gen(function*() {
        const proxy = yield* Effect.acquireRelease(Effect.promise(() => freezableProxy(new URL(dsn))), (p) => Effect.promise(() => p.close()))
        const through = new URL(dsn)
        through.host = `127.0.0.1:${proxy.port}`
        const options = fresh({ dsn: through.href, timeoutMs: 1_000, poolSize: 2 })
        const s = yield* openStore(options)
        yield* createActiveTables.pipe(Effect.provideService(Storage, s))
        yield* s.registerUser({ uaid: uaid(1), routerType: "webpush", routerData: {}, connectedAt: T0 })
        proxy.freeze()
        const started = Date.now()
        const errors = yield* Effect.forEach([1, 2, 3], () => Effect.flip(s.getUser(uaid(1))), { concurrency: "unbounded" })
        const waited = Date.now() - started
        for (const error of errors) {
          assert.strictEqual(error.operation, "getUser")
          assert.strictEqual(error.reason._tag, "Timeout")
        }
        assert.isAtLeast(waited, 900)
        assert.isBelow(waited, 5_000, "within storage_timeout (1 s), with a margin")
        proxy.thaw()
        assert.strictEqual((yield* s.getUser(uaid(1)))?.connectedAt, T0)
      }).pipe(Effect.scoped), 60_000)

    it.effect("a wrong password fails at start, with PostgreSQL's code", () =>
      Effect.gen(function*() {
        const wrong = new URL(dsn)
        wrong.password = "not-the-password"
        const error = yield* Effect.flip(Effect.scoped(Layer.build(layerPostgres(fresh({ dsn: wrong.href })))))
        assert.strictEqual(error.operation, "connect")
        assert.strictEqual(sqlState(error.cause), "28P01")
      }))

    it.live("a server that is not there fails at start", () =>
      Effect.gen(function*() {
        const nowhere = new URL(dsn)
        nowhere.port = "1"
        const error = yield* Effect.flip(Effect.scoped(Layer.build(layerPostgres(fresh({ dsn: nowhere.href, timeoutMs: 2_000 })))))
        assert.strictEqual(error.operation, "connect")
      }))
  })
})
