import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import type { Notification } from "../../src/domain/notification.ts"
import { decodeTransportNotification, encodeTransportNotification } from "../../src/domain/router-wire.ts"

const base = { channelID: "eac8e1de-cddf-42d6-9919-a7b0e0f41e59", version: "gAAAA-id", ttl: 60, timestamp: 1_700_000_000 }

describe("router wire", () => {
  it.effect("what the endpoint encodes decodes to the same notification", () =>
    Effect.sync(() => {
      const cases: ReadonlyArray<Notification> = [
        { channelId: base.channelID, version: "v1", ttl: 0, timestamp: 1, topic: undefined, sortkeyTimestamp: undefined, data: undefined, headers: undefined },
        { channelId: base.channelID, version: "v2", ttl: 60, timestamp: 2, topic: "news", sortkeyTimestamp: 1_700_000_000_123, data: "aGVsbG8", headers: { encoding: "aes128gcm" } },
        { channelId: base.channelID, version: "v3", ttl: 60, timestamp: 3, topic: undefined, sortkeyTimestamp: 5, data: "", headers: {} },
        // sent with Push-Receipt: the node must know, to record the receipt when the client acks
        { channelId: base.channelID, version: "v4", ttl: 60, timestamp: 4, topic: undefined, sortkeyTimestamp: 4_000, receipt: "rs-4", data: undefined, headers: undefined },
        // sent with Urgency: the node takes it only for a client whose minimum it meets
        { channelId: base.channelID, version: "v5", ttl: 60, timestamp: 5, topic: undefined, sortkeyTimestamp: 5_000, urgency: "low", data: undefined, headers: undefined }
      ]
      for (const n of cases) assert.deepStrictEqual(decodeTransportNotification(encodeTransportNotification(n)), n)
    }))

  it.effect("optional fields may be null or absent, other keys are ignored; anything else is not a notification", () =>
    Effect.sync(() => {
      assert.deepStrictEqual(decodeTransportNotification(JSON.stringify({ ...base, topic: null, data: null, headers: null, sortkey_timestamp: null, extra: [1] })), {
        channelId: base.channelID, version: base.version, ttl: 60, timestamp: base.timestamp,
        topic: undefined, sortkeyTimestamp: undefined, data: undefined, headers: undefined
      })
      const refused = [
        "", "nope", "null", "[]", "42", JSON.stringify([base]),
        ...(["channelID", "version", "ttl", "timestamp"] as const).map((key) => JSON.stringify({ ...base, [key]: undefined })),
        JSON.stringify({ ...base, ttl: "60" }),
        JSON.stringify({ ...base, version: 1 }),
        JSON.stringify({ ...base, topic: 5 }),
        JSON.stringify({ ...base, sortkey_timestamp: "5" }),
        JSON.stringify({ ...base, data: {} }),
        JSON.stringify({ ...base, data: "x", headers: { encoding: 1 } }),
        JSON.stringify({ ...base, data: "x", headers: ["aes128gcm"] }),
        JSON.stringify({ ...base, receipt: 7 }),
        JSON.stringify({ ...base, urgency: "urgent" })
      ]
      for (const body of refused) assert.isUndefined(decodeTransportNotification(body), body)
    }))
})
