import { readFileSync } from "node:fs"
import { generateKeyPairSync } from "node:crypto"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Layer, Redacted, Result, Schema } from "effect"
import {
  decodeVapidPublicKey,
  EndpointCrypto,
  makeEndpointToken,
  makeKeyRing,
  makeMessageId,
  matchesVapidKey,
  type MessageIdData,
  parseEndpointToken,
  parseMessageId,
  TEST_CRYPTO_KEY,
  TEST_ENDPOINT_URL,
  vapidKeyHash
} from "../../src/crypto/endpoint.ts"
import { decrypt, generateFernetKey, type MultiFernet, parseFernetKey } from "../../src/crypto/fernet.ts"

interface Interop {
  readonly key: string
  readonly oldKey: string
  readonly uaid: string
  readonly channelId: string
  readonly vapidPublicKey: string
  readonly vapidKeyHashHex: string
  readonly endpointV1: string
  readonly endpointV2: string
  readonly endpointV1OldKey: string
  readonly topic: string
  readonly messageIdTopic: string
  readonly sortkeyTimestamp: number
  readonly messageIdTimestamp: string
}
/** Tokens made by Python's `cryptography` Fernet the way autopush makes them (see the file's `source`). */
const interop: Interop = JSON.parse(readFileSync(new URL("./vectors/interop.json", import.meta.url), "utf8"))

const ring = (...keys: ReadonlyArray<string>): MultiFernet => Result.getOrThrow(makeKeyRing(keys))
const fernet = ring(TEST_CRYPTO_KEY)
/** When the tokens of these tests are made (seconds since the epoch). */
const NOW_S = Math.floor(Date.UTC(2026, 10, 21, 12) / 1000)
const plaintextOf = (token: string): Buffer =>
  Result.getOrThrow(decrypt(Result.getOrThrow(parseFernetKey(TEST_CRYPTO_KEY)), token))

const UAID = "deadbeef00000000decafbad00000000"
const CHID = "0b8e3c1a-9d2f-4e6b-a7c5-3f1e2d4c6b8a"

const newVapidKey = (): Buffer =>
  generateKeyPairSync("ec", { namedCurve: "P-256" }).publicKey.export({ format: "der", type: "spki" }).subarray(-65)

const uuidHex = Schema.String.check(Schema.isPattern(/^[0-9a-f]{32}$/))
const uuid = Schema.String.check(Schema.isUUID())
const topic = Schema.String.check(Schema.isPattern(/^[0-9A-Za-z_-]{1,32}$/))
const timestamp = Schema.Int.check(Schema.isBetween({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER }))
const rawKey = Schema.Uint8Array.check(Schema.isMinLength(65), Schema.isMaxLength(65))
const fernetKeyBytes = Schema.Uint8Array.check(Schema.isMinLength(32), Schema.isMaxLength(32))

describe("endpoint tokens", () => {
  const key = newVapidKey()

  it.effect("v1 is Fernet(uaid ‖ chid): 32 bytes, 140 characters, no padding", () =>
    Effect.sync(() => {
      const token = makeEndpointToken(fernet, NOW_S, UAID, CHID)
      assert.strictEqual(token.length, 140)
      assert.match(token, /^[A-Za-z0-9_-]+$/)
      assert.strictEqual(plaintextOf(token).toString("hex"), UAID + CHID.replaceAll("-", ""))
    }))

  it.effect("v2 appends sha256(raw key): 64 bytes, 184 characters of which the one `=` is stripped", () =>
    Effect.sync(() => {
      const token = makeEndpointToken(fernet, NOW_S, UAID, CHID, key)
      assert.strictEqual(token.length, 183)
      assert.notInclude(token, "=")
      const plain = plaintextOf(`${token}=`)
      assert.strictEqual(plain.length, 64)
      assert.deepStrictEqual(plain.subarray(32), vapidKeyHash(key))
    }))

  it.effect("any uuid spelling makes the same plaintext", () =>
    Effect.sync(() => {
      const a = plaintextOf(makeEndpointToken(fernet, NOW_S, UAID, CHID))
      const b = plaintextOf(makeEndpointToken(fernet, NOW_S, UAID.toUpperCase(), `{${CHID.replaceAll("-", "").toUpperCase()}}`))
      assert.deepStrictEqual(a, b)
    }))

  it.effect("a value that is not a uuid is a bug: it throws", () =>
    Effect.sync(() => {
      assert.throws(() => makeEndpointToken(fernet, NOW_S, "not-a-uuid", CHID))
      assert.throws(() => makeEndpointToken(fernet, NOW_S, UAID, "0b8e3c1a"))
    }))

  it.effect("parses back, re-padding what the URL stripped", () =>
    Effect.sync(() => {
      const v1 = Result.getOrThrow(parseEndpointToken(fernet, "v1", makeEndpointToken(fernet, NOW_S, UAID, CHID)))
      assert.deepStrictEqual(v1, { uaid: UAID, channelId: CHID })
      assert.isFalse("keyHash" in v1)
      const v2 = Result.getOrThrow(parseEndpointToken(fernet, "v2", makeEndpointToken(fernet, NOW_S, UAID, CHID, key)))
      assert.strictEqual(v2.uaid, UAID)
      assert.strictEqual(v2.channelId, CHID)
      assert.isTrue(matchesVapidKey(v2, key))
      assert.isFalse(matchesVapidKey(v2, newVapidKey()))
      assert.isFalse(matchesVapidKey(v1, key))
      // A client that kept the padding is fine too.
      assert.isTrue(Result.isSuccess(parseEndpointToken(fernet, "v2", `${makeEndpointToken(fernet, NOW_S, UAID, CHID, key)}=`)))
    }))

  it.effect("a token of the other version's length is invalid", () =>
    Effect.sync(() => {
      const v1 = parseEndpointToken(fernet, "v2", makeEndpointToken(fernet, NOW_S, UAID, CHID))
      const v2 = parseEndpointToken(fernet, "v1", makeEndpointToken(fernet, NOW_S, UAID, CHID, key))
      for (const result of [v1, v2]) {
        assert.isTrue(Result.isFailure(result))
        if (Result.isFailure(result)) {
          assert.strictEqual(result.failure._tag, "EndpointTokenError")
          assert.strictEqual(result.failure.reason, "bad-length")
        }
      }
      // Other plaintext lengths too (e.g. a message id presented as an endpoint token).
      const other = parseEndpointToken(fernet, "v1", fernet.encrypt(Buffer.alloc(48), { now: NOW_S }).replace(/=+$/, ""))
      assert.isTrue(Result.isFailure(other) && other.failure.reason === "bad-length")
    }))

  it.effect("garbage, a tampered token and another key's token are invalid with Fernet's reason", () =>
    Effect.sync(() => {
      const token = makeEndpointToken(fernet, NOW_S, UAID, CHID)
      const reason = (t: string, f: MultiFernet = fernet) => {
        const r = parseEndpointToken(f, "v1", t)
        return Result.isFailure(r) ? r.failure.reason : "ok"
      }
      assert.strictEqual(reason("abc"), "malformed")
      assert.strictEqual(reason(`${token.slice(0, 100)}${token[100] === "A" ? "B" : "A"}${token.slice(101)}`), "bad-signature")
      assert.strictEqual(reason(token, ring(generateFernetKey())), "bad-signature")
      assert.strictEqual(reason(token, ring(generateFernetKey(), TEST_CRYPTO_KEY)), "ok")
    }))

  it.effect.prop("round-trip for random uaids, channel ids, keys and VAPID keys", {
    uaid: uuidHex,
    channelId: uuid,
    vapid: Schema.UndefinedOr(rawKey),
    fernetKey: fernetKeyBytes
  }, ({ uaid, channelId, vapid, fernetKey }) =>
    Effect.sync(() => {
      const f = ring(Buffer.from(fernetKey).toString("base64url"))
      const version = vapid === undefined ? "v1" : "v2"
      const parsed = Result.getOrThrow(parseEndpointToken(f, version, makeEndpointToken(f, NOW_S, uaid, channelId, vapid)))
      assert.strictEqual(parsed.uaid, uaid)
      assert.strictEqual(parsed.channelId, channelId.toLowerCase())
      assert.strictEqual(vapid === undefined ? parsed.keyHash === undefined : matchesVapidKey(parsed, vapid), true)
    }))
})

describe("message ids", () => {
  it.effect("topic and timestamp ids carry the documented plaintext and keep their padding", () =>
    Effect.sync(() => {
      const t = makeMessageId(fernet, NOW_S, { kind: "topic", uaid: UAID, channelId: CHID, topic: "a".repeat(32) })
      assert.strictEqual(plaintextOf(t).toString(), `01:${UAID}:${CHID.replaceAll("-", "")}:${"a".repeat(32)}`)
      assert.strictEqual(t.length, 228)
      assert.isTrue(t.endsWith("=="))
      const s = makeMessageId(fernet, NOW_S, { kind: "timestamp", uaid: UAID, channelId: CHID, sortkeyTimestamp: 1_700_000_000_123 })
      assert.strictEqual(plaintextOf(s).toString(), `02:${UAID}:${CHID.replaceAll("-", "")}:1700000000123`)
      assert.strictEqual(s.length, 204)
    }))

  it.effect("parse back to uaid (simple hex), channel id (hyphenated) and topic / sort key", () =>
    Effect.sync(() => {
      const topicData: MessageIdData = { kind: "topic", uaid: UAID, channelId: CHID, topic: "mail" }
      const tsData: MessageIdData = { kind: "timestamp", uaid: UAID, channelId: CHID, sortkeyTimestamp: 42 }
      assert.deepStrictEqual(Result.getOrThrow(parseMessageId(fernet, makeMessageId(fernet, NOW_S, topicData))), topicData)
      assert.deepStrictEqual(Result.getOrThrow(parseMessageId(fernet, makeMessageId(fernet, NOW_S, tsData))), tsData)
    }))

  it.effect.each([
    { desc: "three segments", plain: `02:${UAID}:${CHID.replaceAll("-", "")}` },
    { desc: "six segments", plain: `01:${UAID}:${CHID.replaceAll("-", "")}:a:b:c` },
    { desc: "an empty receipt subscription", plain: `01:${UAID}:${CHID.replaceAll("-", "")}:a:` },
    { desc: "hyphenated channel id", plain: `01:${UAID}:${CHID}:a` },
    { desc: "short uaid", plain: `01:${UAID.slice(1)}:${CHID.replaceAll("-", "")}:a` },
    { desc: "unknown kind", plain: `03:${UAID}:${CHID.replaceAll("-", "")}:1` },
    { desc: "legacy m: id", plain: `m:${UAID}:${CHID.replaceAll("-", "")}` },
    { desc: "empty topic", plain: `01:${UAID}:${CHID.replaceAll("-", "")}:` },
    { desc: "sort key not a number", plain: `02:${UAID}:${CHID.replaceAll("-", "")}:12a` },
    { desc: "sort key with leading zero", plain: `02:${UAID}:${CHID.replaceAll("-", "")}:0012` },
    { desc: "sort key beyond 2^53", plain: `02:${UAID}:${CHID.replaceAll("-", "")}:99999999999999999999` },
    { desc: "an endpoint token's plaintext", plain: Buffer.from(UAID + CHID.replaceAll("-", ""), "hex") }
  ])("refuses a plaintext with $desc", ({ plain }) =>
    Effect.sync(() => {
      const result = parseMessageId(fernet, fernet.encrypt(plain, { now: NOW_S }))
      assert.isTrue(Result.isFailure(result))
      if (Result.isFailure(result)) {
        assert.strictEqual(result.failure._tag, "MessageIdError")
        assert.strictEqual(result.failure.reason, "bad-format")
      }
    }))

  it.effect("refuses an id that does not decrypt, including one stripped of its padding", () =>
    Effect.sync(() => {
      const id = makeMessageId(fernet, NOW_S, { kind: "topic", uaid: UAID, channelId: CHID, topic: "a".repeat(32) })
      const reason = (s: string) => {
        const r = parseMessageId(fernet, s)
        return Result.isFailure(r) ? r.failure.reason : "ok"
      }
      assert.strictEqual(reason(id.replace(/=+$/, "")), "malformed")
      assert.strictEqual(reason("not-an-id"), "malformed")
      assert.strictEqual(reason(makeMessageId(ring(generateFernetKey()), NOW_S, { kind: "timestamp", uaid: UAID, channelId: CHID, sortkeyTimestamp: 1 })), "bad-signature")
    }))

  it.effect.prop("round-trip for random ids, topics, sort keys and receipt subscriptions", {
    uaid: uuid,
    channelId: uuid,
    topic: Schema.UndefinedOr(topic),
    sortkeyTimestamp: timestamp,
    receipt: Schema.UndefinedOr(topic)
  }, ({ uaid, channelId, topic, sortkeyTimestamp, receipt }) =>
    Effect.sync(() => {
      // A receipt subscription id (base64url) rides along for a message sent with Push-Receipt.
      const ids = {
        uaid: uaid.replaceAll("-", "").toLowerCase(),
        channelId: channelId.toLowerCase(),
        ...(receipt === undefined ? {} : { receipt })
      }
      const data: MessageIdData = topic === undefined
        ? { kind: "timestamp", ...ids, sortkeyTimestamp }
        : { kind: "topic", ...ids, topic }
      const id = makeMessageId(fernet, NOW_S, { ...data, uaid, channelId })
      assert.deepStrictEqual(Result.getOrThrow(parseMessageId(fernet, id)), data)
    }))
})

describe("VAPID public keys", () => {
  const raw = newVapidKey()

  it.effect("decodes base64url and standard base64, with or without padding", () =>
    Effect.sync(() => {
      const url = raw.toString("base64url")
      const std = raw.toString("base64")
      for (const s of [url, `${url}=`, std, std.replace(/=+$/, "")]) {
        assert.deepStrictEqual(decodeVapidPublicKey(s), raw, s)
      }
      // Which alphabet is decided by `/` and `+`; a key with both alphabets is neither.
      const mixed = Buffer.from([0x04, ...Buffer.alloc(64, 0xfb)])
      const mixedStd = mixed.toString("base64")
      assert.include(mixedStd, "+")
      assert.deepStrictEqual(decodeVapidPublicKey(mixedStd), mixed)
      assert.isUndefined(decodeVapidPublicKey(`${mixedStd.slice(0, 10)}_${mixedStd.slice(11)}`))
    }))

  it.effect.each([
    { desc: "empty", value: "" },
    { desc: "64 bytes", value: raw.subarray(1).toString("base64url") },
    { desc: "66 bytes", value: Buffer.concat([raw, Buffer.from([1])]).toString("base64url") },
    { desc: "compressed point prefix", value: Buffer.from([0x02, ...raw.subarray(1)]).toString("base64url") },
    { desc: "characters outside base64", value: `${raw.toString("base64url").slice(0, 40)}!${raw.toString("base64url").slice(41)}` },
    { desc: "hex", value: raw.toString("hex") }
  ])("refuses a key that is $desc", ({ value }) =>
    Effect.sync(() => {
      assert.isUndefined(decodeVapidPublicKey(value))
    }))

  it.effect("a long run of one character (64 KiB, a WebSocket frame's worth) is refused at once, not backtracked over", () =>
    Effect.sync(() => {
      const url = raw.toString("base64url")
      assert.deepStrictEqual(decodeVapidPublicKey(url + "=".repeat(1_000)), raw, "padding of any length is ignored, as before")
      for (const run of ["=".repeat(65_000) + "A", "=".repeat(65_000), "A".repeat(65_000) + "!", "/".repeat(65_000) + "_", "A" + "=".repeat(65_000) + "A"]) {
        const started = performance.now()
        assert.isUndefined(decodeVapidPublicKey(run))
        assert.isBelow(performance.now() - started, 500, `${run.slice(0, 3)}… of ${run.length}`)
      }
    }))

  it.effect("the key hash is sha256 of the raw point", () =>
    Effect.sync(() => {
      assert.strictEqual(
        vapidKeyHash(Buffer.from("04", "hex")).toString("hex"),
        "e52d9c508c502347344d8c07ad91cbd6068afc75ff6292f062a09ca381c89e71"
      )
    }))
})

describe("interop with autopush's Fernet (Python cryptography)", () => {
  const f = ring(interop.key, interop.oldKey)

  it.effect("decodes endpoint tokens it made, v1 and v2, with current and rotated-out keys", () =>
    Effect.sync(() => {
      const expected = { uaid: interop.uaid, channelId: interop.channelId }
      assert.deepStrictEqual(Result.getOrThrow(parseEndpointToken(f, "v1", interop.endpointV1)), expected)
      assert.deepStrictEqual(Result.getOrThrow(parseEndpointToken(f, "v1", interop.endpointV1OldKey)), expected)
      const v2 = Result.getOrThrow(parseEndpointToken(f, "v2", interop.endpointV2))
      assert.strictEqual(v2.keyHash?.toString("hex"), interop.vapidKeyHashHex)
      const key = decodeVapidPublicKey(interop.vapidPublicKey)
      assert.isDefined(key)
      assert.isTrue(matchesVapidKey(v2, key!))
    }))

  it.effect("decodes message ids it made", () =>
    Effect.sync(() => {
      const ids = { uaid: interop.uaid, channelId: interop.channelId }
      assert.deepStrictEqual(Result.getOrThrow(parseMessageId(f, interop.messageIdTopic)), {
        kind: "topic",
        ...ids,
        topic: interop.topic
      })
      assert.deepStrictEqual(Result.getOrThrow(parseMessageId(f, interop.messageIdTimestamp)), {
        kind: "timestamp",
        ...ids,
        sortkeyTimestamp: interop.sortkeyTimestamp
      })
    }))
})

describe("EndpointCrypto service", () => {
  it.effect("layerTest makes endpoints under the test URL that parse back", () =>
    Effect.gen(function*() {
      const crypto = yield* EndpointCrypto
      const url = yield* crypto.makeEndpoint(UAID, CHID)
      assert.isTrue(url.startsWith(`${TEST_ENDPOINT_URL}/wpush/v1/`))
      const token = url.split("/").at(-1)!
      assert.deepStrictEqual(yield* crypto.parseEndpoint("v1", token), { uaid: UAID, channelId: CHID })
      const key = newVapidKey()
      const v2 = yield* crypto.makeEndpoint(UAID, CHID, key)
      assert.isTrue(v2.startsWith(`${TEST_ENDPOINT_URL}/wpush/v2/`))
      const parsed = yield* crypto.parseEndpoint("v2", v2.split("/").at(-1)!)
      assert.isTrue(matchesVapidKey(parsed, key))
      const id = yield* crypto.makeMessageId({ kind: "topic", uaid: UAID, channelId: CHID, topic: "t" })
      assert.deepStrictEqual(yield* crypto.parseMessageId(id), { kind: "topic", uaid: UAID, channelId: CHID, topic: "t" })
    }).pipe(Effect.provide(EndpointCrypto.layerTest)))

  it.effect("failures are typed errors in the error channel", () =>
    Effect.gen(function*() {
      const crypto = yield* EndpointCrypto
      const token = yield* Effect.flip(crypto.parseEndpoint("v1", "nope"))
      assert.strictEqual(token._tag, "EndpointTokenError")
      const id = yield* Effect.flip(crypto.parseMessageId("nope"))
      assert.strictEqual(id._tag, "MessageIdError")
    }).pipe(Effect.provide(EndpointCrypto.layerTest)))

  it.effect("a bad uuid passed to a maker is a defect, not a typed failure", () =>
    Effect.gen(function*() {
      const crypto = yield* EndpointCrypto
      const exit = yield* Effect.exit(crypto.makeEndpoint("nope", CHID))
      assert.isTrue(Exit.hasDies(exit))
    }).pipe(Effect.provide(EndpointCrypto.layerTest)))

  it.effect("layer: trailing slashes of the endpoint URL are dropped; rotation decrypts old endpoints", () =>
    Effect.gen(function*() {
      const oldKey = generateFernetKey()
      const oldEndpoint = makeEndpointToken(ring(oldKey), NOW_S, UAID, CHID)
      const crypto = yield* EndpointCrypto.pipe(
        Effect.provide(EndpointCrypto.layer({ keys: Redacted.make([generateFernetKey(), oldKey]), endpointUrl: "https://push.example/" }))
      )
      const url = yield* crypto.makeEndpoint(UAID, CHID)
      assert.isTrue(url.startsWith("https://push.example/wpush/v1/"))
      assert.deepStrictEqual(yield* crypto.parseEndpoint("v1", oldEndpoint), { uaid: UAID, channelId: CHID })
      // New endpoints are made with the first key, not the old one.
      assert.isTrue(Result.isFailure(parseEndpointToken(ring(oldKey), "v1", url.split("/").at(-1)!)))
    }))

  it.effect("layer: an invalid key fails the layer naming its position, never its value", () =>
    Effect.gen(function*() {
      const bad = "this-is-not-a-fernet-key"
      const error = yield* Effect.flip(
        Layer.build(EndpointCrypto.layer({ keys: Redacted.make([generateFernetKey(), bad]), endpointUrl: TEST_ENDPOINT_URL }))
      )
      assert.strictEqual(error._tag, "CryptoKeyConfigError")
      assert.include(error.message, "#2")
      assert.notInclude(error.message, bad)
      const empty = yield* Effect.flip(Layer.build(EndpointCrypto.layer({ keys: Redacted.make([]), endpointUrl: TEST_ENDPOINT_URL })))
      assert.include(empty.message, "at least one")
    }))
})
