/**
 * The event log file: one JSON line per domain event, in order, with opaque uaids and message ids,
 * no payloads and no endpoint tokens; appended across restarts; stdout with `-`; a path that cannot
 * be opened fails at startup.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Layer } from "effect"
import { TestClock } from "effect/testing"
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { vi } from "vitest"
import { EndpointCrypto } from "../../src/crypto/endpoint.ts"
import type { DomainEvent } from "../../src/domain/events.ts"
import { EventLog, EventLogMemory } from "../../src/observability/EventLog.ts"
import { makeEventLine } from "../../src/observability/eventLogFile.ts"
import { observabilityLayer, observabilityLayerMemory } from "../../src/observability/observability.ts"
import { opaqueId } from "../../src/observability/opaque.ts"
import { layerMemory } from "../../src/storage/memory/layer.ts"
import { makeHarness, pump, pushMessage } from "../protocol/harness.ts"

const NOW = Date.UTC(2026, 10, 21, 12, 0, 0)
const CHID = "eac8e1de-cddf-42d6-9919-a7b0e0f41e59"
const PAYLOAD = "c2VjcmV0LXBheWxvYWQtZG8tbm90LWxvZw"

const parts = (eventLog: string) =>
  Layer.mergeAll(
    layerMemory({ routerTable: "router", messageTablePrefix: "message", noTableRotation: false }),
    EndpointCrypto.layerTest,
    observabilityLayerMemory({ eventLog })
  )

interface Line {
  readonly time: number
  readonly type: string
  readonly uaid: string
  readonly data: Record<string, unknown>
}

describe("event log", () => {
  it.effect("a session's events as JSON lines: opaque uaid and versions, no payload, no endpoint", () =>
    Effect.gen(function*() {
      const path = join(mkdtempSync(join(tmpdir(), "eventlog-")), "events.jsonl")
      writeFileSync(path, "{\"earlier\":true}\n")
      const run = Effect.gen(function*() {
        yield* TestClock.setTime(NOW)
        const harness = yield* makeHarness()
        const client = yield* harness.connect()
        yield* client.frame({ messageType: "hello", use_webpush: true })
        const uaid = client.of("hello")[0]!["uaid"] as string
        yield* client.frame({ messageType: "register", channelID: CHID })
        const endpoint = client.of("register")[0]!["pushEndpoint"] as string
        const { notification } = yield* pushMessage(harness, uaid, CHID, { data: PAYLOAD })
        yield* pump(client)
        yield* client.frame({ messageType: "ack", updates: [{ channelID: CHID, version: notification.version, code: 100 }] })
        yield* pushMessage(harness, uaid, CHID, { data: PAYLOAD, topic: "news" })
        yield* pump(client)
        yield* client.feed({ _tag: "SocketClosed" })
        const { events } = yield* EventLogMemory
        return { uaid, endpoint, version: notification.version, events: events.slice() }
      }).pipe(Effect.provide(parts(path)))
      const { uaid, endpoint, version, events } = yield* run

      // The layer is closed: everything is flushed; what was in the file is kept.
      const text = readFileSync(path, "utf8")
      const [earlier, ...rest] = text.trimEnd().split("\n")
      assert.strictEqual(earlier, "{\"earlier\":true}")
      const lines = rest.map((l) => JSON.parse(l) as Line)
      assert.deepStrictEqual(lines.map((l) => l.type), events.map((e) => e.type))
      assert.deepStrictEqual(lines.map((l) => l.type), [
        "client.hello.1",
        "channel.registered.1",
        "notification.delivered.1",
        "notification.acked.1",
        "notification.delivered.1",
        "notification.stored.1",
        "session.ended.1"
      ])
      for (const line of lines) {
        assert.deepStrictEqual(Object.keys(line), ["time", "type", "uaid", "data"])
        assert.isNumber(line.time)
        assert.strictEqual(line.uaid, opaqueId(uaid))
      }
      assert.deepStrictEqual(lines[2]!.data, { channelId: CHID, version: opaqueId(version), source: "direct" })
      assert.deepStrictEqual(lines[3]!.data, { version: opaqueId(version), code: 100, source: "direct" })
      assert.deepStrictEqual(lines[5]!.data["reason"], "disconnect")
      // Never the credentials or the payload.
      assert.notInclude(text, uaid)
      assert.notInclude(text, version)
      assert.notInclude(text, PAYLOAD)
      assert.notInclude(text, new URL(endpoint).pathname.split("/").pop() as string)
      assert.notInclude(text, "aes128gcm")
    }))

  it("the line of an event: fields that could carry secrets are dropped whatever the event", () => {
    const line = makeEventLine()
    const event = {
      type: "notification.future.9",
      uaid: "a90359e3e4eb64f6e33d1267813bf91c",
      time: 5,
      data: { version: "gAAAAAB-token", receipt: "rs-subscription-id", data: PAYLOAD, headers: { encryption: "x" }, token: "t", ttl: 60, note: undefined }
    } as unknown as DomainEvent
    assert.deepStrictEqual(JSON.parse(line(event)), {
      time: 5,
      type: "notification.future.9",
      uaid: opaqueId("a90359e3e4eb64f6e33d1267813bf91c"),
      data: { version: opaqueId("gAAAAAB-token"), receipt: opaqueId("rs-subscription-id"), ttl: 60 }
    })
    assert.match(opaqueId("x"), /^[0-9a-f]{16}$/)
  })

  it.effect("`-` writes the lines to stdout", () =>
    Effect.gen(function*() {
      const written: Array<string> = []
      const spy = vi.spyOn(process.stdout, "write").mockImplementation((chunk: string | Uint8Array) => {
        written.push(String(chunk))
        return true
      })
      yield* Effect.gen(function*() {
        const events = yield* EventLog
        events.record({ type: "uaid.reset.1", uaid: "a90359e3e4eb64f6e33d1267813bf91c", time: 0, data: { reason: "stale_month" } })
      }).pipe(Effect.provide(observabilityLayer({ role: "autopush", eventLog: "-" })), Effect.ensuring(Effect.sync(() => spy.mockRestore())))
      const lines = written.filter((w) => w.includes("uaid.reset.1"))
      assert.strictEqual(lines.length, 1)
      assert.deepStrictEqual(JSON.parse(lines[0]!).data, { reason: "stale_month" })
    }))

  it.effect("an event log that cannot be opened fails at startup, naming the path", () =>
    Effect.gen(function*() {
      const path = join(tmpdir(), "no-such-dir-for-autopush", "x", "events.jsonl")
      const exit = yield* Effect.exit(Effect.provide(Effect.service(EventLog), observabilityLayer({ role: "autopush", eventLog: path })))
      assert.isTrue(Exit.isFailure(exit))
      if (Exit.isFailure(exit)) {
        const error = exit.cause.reasons.find((r) => r._tag === "Fail")
        assert.include(String(error?._tag === "Fail" ? (error.error as Error).message : ""), path)
      }
    }))
})
