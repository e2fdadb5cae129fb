/**
 * The broadcast set's sources: a megaphone server (real HTTP, with its failures) and storage,
 * polled by `Broadcasts.layerPolling`; the last good set stays in force whatever goes wrong.
 */
import { createServer, type IncomingMessage, type ServerResponse } from "node:http"
import type { AddressInfo } from "node:net"
import { assert, describe, it } from "@effect/vitest"
import { Context, Effect, Layer, Redacted } from "effect"
import { Broadcasts, megaphoneSource, storageSource } from "../../src/broadcast/Broadcasts.ts"
import { decodeBroadcastSet } from "../../src/broadcast/validate.ts"
import { Metrics } from "../../src/observability/Metrics.ts"
import { layerMemory } from "../../src/storage/memory/layer.ts"
import { createActiveTables, Storage } from "../../src/storage/Storage.ts"

/** A fake megaphone: answers with whatever `reply` does now; `requests` counts the calls. */
const fakeMegaphone = Effect.acquireRelease(
  Effect.promise(() =>
    new Promise<{ url: string; set: (reply: (req: IncomingMessage, res: ServerResponse) => void) => void; close: () => void; auth: Array<string> }>((resolve) => {
      let reply: (req: IncomingMessage, res: ServerResponse) => void = (_req, res) => void res.writeHead(500).end()
      const auth: Array<string> = []
      const server = createServer((req, res) => {
        auth.push(req.headers.authorization ?? "")
        reply(req, res)
      })
      server.listen(0, "127.0.0.1", () =>
        resolve({
          url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1/broadcasts`,
          set: (next) => void (reply = next),
          close: () => {
            server.closeAllConnections()
            server.close()
          },
          auth
        }))
    })
  ),
  (fake) => Effect.sync(fake.close)
)

const json = (body: unknown) => (_req: IncomingMessage, res: ServerResponse) =>
  void res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(body))

/** Until `check` holds (polling every 20 ms), at most `ms`. */
const eventually = (check: () => Effect.Effect<boolean, never, Metrics> | boolean, ms = 3_000) =>
  Effect.gen(function*() {
    const deadline = Date.now() + ms
    while (Date.now() < deadline) {
      const result = check()
      if (typeof result === "boolean" ? result : yield* result) return
      yield* Effect.sleep(20)
    }
  })

const errors = (reason: string) => Effect.map(Metrics, (m) => m.value("megaphone.updater.error", { reason }) ?? 0)

describe("broadcast sets", () => {
  it("only ids and versions of the documented shape, at most 1,000", () => {
    assert.deepStrictEqual(decodeBroadcastSet({ "remote-settings/monitor_changes": "\"1700\"" }), new Map([["remote-settings/monitor_changes", "\"1700\""]]))
    assert.isString(decodeBroadcastSet([]))
    assert.isString(decodeBroadcastSet({ "bad id": "v" }))
    assert.isString(decodeBroadcastSet({ [`${"a".repeat(129)}`]: "v" }))
    assert.isString(decodeBroadcastSet({ id: 1 }))
    assert.isString(decodeBroadcastSet({ id: "with space" }))
    assert.isString(decodeBroadcastSet(Object.fromEntries(Array.from({ length: 1_001 }, (_, i) => [`b${i}`, "v"]))))
  })
})

describe("megaphone source", () => {
  it.live("polls with the bearer token; failures of every kind keep the last good set and are counted by reason", () =>
    Effect.gen(function*() {
      const fake = yield* fakeMegaphone
      fake.set(json({ broadcasts: { "remote-settings/monitor_changes": "v1" } }))
      const source = megaphoneSource({ url: fake.url, token: Redacted.make("s3cret"), timeoutMs: 300 })
      const context = yield* Layer.build(Broadcasts.layerPolling(source, 50, "megaphone"))
      const broadcasts = Context.get(context, Broadcasts)
      assert.deepStrictEqual([...broadcasts.current()], [["remote-settings/monitor_changes", "v1"]])
      assert.strictEqual(fake.auth[0], "Bearer s3cret")

      const failures: Array<[string, (req: IncomingMessage, res: ServerResponse) => void]> = [
        ["status", (_req, res) => void res.writeHead(500).end("oops")],
        ["not_json", (_req, res) => void res.writeHead(200).end("<html>")],
        ["invalid", json({ broadcasts: { "no spaces allowed": "v" } })],
        ["invalid", json({ nothing: true })],
        ["too_large", (_req, res) => {
          res.writeHead(200)
          const chunk = Buffer.alloc(1_048_576, " ")
          for (let i = 0; i < 10; i++) res.write(chunk)
          res.end("{}")
        }],
        ["timeout", () => undefined] // never answers
      ]
      for (const [reason, reply] of failures) {
        const before = yield* errors(reason)
        fake.set(reply)
        yield* eventually(() => Effect.map(errors(reason), (n) => n > before))
        assert.isAbove(yield* errors(reason), before, reason)
        assert.deepStrictEqual([...broadcasts.current()], [["remote-settings/monitor_changes", "v1"]], `kept through ${reason}`)
      }
      fake.set(json({ broadcasts: { "remote-settings/monitor_changes": "v2", "test/b": "1" } }))
      yield* eventually(() => broadcasts.current().size === 2)
      assert.deepStrictEqual(new Map(broadcasts.current()), new Map([["remote-settings/monitor_changes", "v2"], ["test/b", "1"]]))
      assert.isAbove((yield* Metrics).value("megaphone.updater.ok") ?? 0, 1)

      fake.close()
      yield* eventually(() => Effect.map(errors("unreachable"), (n) => n > 0))
      assert.isAbove(yield* errors("unreachable"), 0)
      assert.strictEqual(broadcasts.current().get("remote-settings/monitor_changes"), "v2")
    }).pipe(Effect.scoped, Effect.provide(Metrics.layerMemory)), 20_000)
})

describe("storage source", () => {
  it.live("follows the set in storage", () =>
    Effect.gen(function*() {
      const storage = yield* Storage
      yield* storage.putBroadcast("a", "1")
      const context = yield* Layer.build(Layer.unwrap(Effect.map(storageSource, (source) => Broadcasts.layerPolling(source, 50, "storage"))))
      const broadcasts = Context.get(context, Broadcasts)
      assert.deepStrictEqual([...broadcasts.current()], [["a", "1"]])
      yield* storage.putBroadcast("a", "2")
      yield* storage.deleteBroadcast("missing")
      yield* eventually(() => broadcasts.current().get("a") === "2")
      assert.deepStrictEqual([...broadcasts.current()], [["a", "2"]])
    }).pipe(
      Effect.scoped,
      Effect.provide(Layer.mergeAll(
        Metrics.layerMemory,
        Layer.effectDiscard(createActiveTables).pipe(Layer.provideMerge(layerMemory({ routerTable: "router", messageTablePrefix: "message", noTableRotation: false })))
      ))
    ))
})
