import { readFileSync } from "node:fs"
import { createCipheriv, createHmac, randomBytes } from "node:crypto"
import { inspect } from "node:util"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Result, Schema } from "effect"
import {
  decrypt,
  encrypt,
  type FernetErrorReason,
  type FernetKey,
  fernetKeyFromBytes,
  generateFernetKey,
  makeMultiFernet,
  MAX_CLOCK_SKEW_SECONDS,
  parseFernetKey
} from "../../src/crypto/fernet.ts"

interface GenerateVector {
  readonly token: string
  readonly now: string
  readonly iv: ReadonlyArray<number>
  readonly src: string
  readonly secret: string
}
interface VerifyVector {
  readonly token: string
  readonly now: string
  readonly ttl_sec: number
  readonly src: string
  readonly secret: string
}
interface InvalidVector {
  readonly desc: string
  readonly token: string
  readonly now: string
  readonly ttl_sec: number
  readonly secret: string
}

const vectors = <A>(name: string): ReadonlyArray<A> =>
  JSON.parse(readFileSync(new URL(`./vectors/${name}.json`, import.meta.url), "utf8"))

const seconds = (iso: string): number => Date.parse(iso) / 1000
/** When the tokens of these tests are made (seconds since the epoch). */
const NOW_S = Math.floor(Date.UTC(2026, 10, 21, 12) / 1000)
const key = (secret: string): FernetKey => Result.getOrThrow(parseFernetKey(secret))
const reasonOf = (result: Result.Result<Buffer, { readonly reason: FernetErrorReason }>): string =>
  Result.isFailure(result) ? result.failure.reason : `ok:${result.success.toString("hex")}`

// Why each spec vector is invalid, in our reason vocabulary (every entry of invalid.json must be listed).
const expectedReasons: Record<string, FernetErrorReason> = {
  "incorrect mac": "bad-signature",
  "too short": "malformed",
  "invalid base64": "malformed",
  "payload size not multiple of block size": "malformed",
  "payload padding error": "bad-padding",
  "far-future TS (unacceptable clock skew)": "future",
  "expired TTL": "expired",
  "incorrect IV (causes padding error)": "bad-padding",
  "trailing characters after b64 padding": "malformed",
  "invalid characters in b64": "malformed",
  "invalid non-urlsafe characters in b64": "malformed"
}

const SPEC_KEY = "cw_0x689RpI-jtRR7oE8h_eQsKImvJapLeSbXpwF4e4="

/** Flip bits of one byte of the decoded token and re-encode it canonically. */
const tamper = (token: string, index: number, mask: number): string => {
  const bytes = Buffer.from(token, "base64url")
  bytes[index % bytes.length]! ^= mask
  const unpadded = bytes.toString("base64url")
  return unpadded + "=".repeat((4 - (unpadded.length % 4)) % 4)
}

describe("Fernet spec vectors", () => {
  it.effect.each(vectors<GenerateVector>("generate"))("generate: $src at $now", (v) =>
    Effect.sync(() => {
      const token = encrypt(key(v.secret), v.src, { now: seconds(v.now), iv: Uint8Array.from(v.iv) })
      assert.strictEqual(token, v.token)
    }))

  it.effect.each(vectors<VerifyVector>("verify"))("verify: $src at $now", (v) =>
    Effect.sync(() => {
      const result = decrypt(key(v.secret), v.token, { ttlSeconds: v.ttl_sec, now: seconds(v.now) })
      assert.strictEqual(reasonOf(result), `ok:${Buffer.from(v.src).toString("hex")}`)
    }))

  it.effect("every invalid vector has an expected reason", () =>
    Effect.sync(() => {
      assert.deepStrictEqual(
        vectors<InvalidVector>("invalid").map((v) => v.desc).sort(),
        Object.keys(expectedReasons).sort()
      )
    }))

  it.effect.each(vectors<InvalidVector>("invalid"))("invalid: $desc", (v) =>
    Effect.sync(() => {
      const result = decrypt(key(v.secret), v.token, { ttlSeconds: v.ttl_sec, now: seconds(v.now) })
      assert.strictEqual(reasonOf(result), expectedReasons[v.desc])
      if (Result.isFailure(result)) assert.strictEqual(result.failure._tag, "FernetError")
    }))

  it.effect("time checks apply only when a TTL is given (the service never enforces one)", () =>
    Effect.sync(() => {
      const byDesc = new Map(vectors<InvalidVector>("invalid").map((v) => [v.desc, v]))
      for (const desc of ["expired TTL", "far-future TS (unacceptable clock skew)"]) {
        const v = byDesc.get(desc)!
        assert.isTrue(Result.isSuccess(decrypt(key(v.secret), v.token)), desc)
      }
    }))
})

describe("Fernet keys", () => {
  it.effect("parses the canonical form and the form without padding", () =>
    Effect.sync(() => {
      const padded = parseFernetKey(SPEC_KEY)
      const unpadded = parseFernetKey(SPEC_KEY.slice(0, -1))
      assert.isTrue(Result.isSuccess(padded) && Result.isSuccess(unpadded))
      const raw = Buffer.from(SPEC_KEY, "base64url")
      const k = Result.getOrThrow(padded)
      assert.deepStrictEqual(k.signing.export(), raw.subarray(0, 16))
      assert.deepStrictEqual(k.encryption.export(), raw.subarray(16))
    }))

  it.effect.each([
    { desc: "empty", value: "" },
    { desc: "16 bytes", value: Buffer.alloc(16, 7).toString("base64url") },
    { desc: "33 bytes", value: Buffer.alloc(33, 7).toString("base64url") },
    { desc: "standard base64 alphabet", value: Buffer.alloc(32, 0xfb).toString("base64") },
    { desc: "characters outside base64", value: `${SPEC_KEY.slice(0, 20)}!${SPEC_KEY.slice(21)}` },
    { desc: "surrounding whitespace", value: ` ${SPEC_KEY}` },
    { desc: "trailing data", value: `${SPEC_KEY}AAAA` }
  ])("refuses a key that is $desc, without echoing it", ({ value }) =>
    Effect.sync(() => {
      const result = parseFernetKey(value)
      assert.isTrue(Result.isFailure(result))
      if (Result.isFailure(result)) {
        assert.strictEqual(result.failure._tag, "FernetKeyError")
        if (value.length > 0) assert.notInclude(result.failure.message, value)
      }
    }))

  it.effect("generated keys are 44 characters, parse, and differ", () =>
    Effect.sync(() => {
      const a = generateFernetKey()
      const b = generateFernetKey()
      assert.strictEqual(a.length, 44)
      assert.match(a, /^[A-Za-z0-9_-]{43}=$/)
      assert.notStrictEqual(a, b)
      assert.isTrue(Result.isSuccess(parseFernetKey(a)))
    }))

  it.effect("key material never shows up when logged or serialised", () =>
    Effect.sync(() => {
      const k = key(SPEC_KEY)
      const hex = Buffer.from(SPEC_KEY, "base64url").toString("hex")
      const b64 = Buffer.from(SPEC_KEY, "base64url")
      for (const shown of [inspect({ k }, { depth: 5, showHidden: true }), JSON.stringify({ k }), String(k.signing)]) {
        assert.notInclude(shown, hex.slice(0, 8))
        assert.notInclude(shown, hex.slice(32, 40))
        assert.notInclude(shown, b64.subarray(0, 6).toString("base64url"))
      }
    }))
})

describe("Fernet encrypt / decrypt", () => {
  const k = key(SPEC_KEY)

  it.effect("tokens are version 0x80, padded base64url, random per call", () =>
    Effect.sync(() => {
      const a = encrypt(k, "same", { now: NOW_S })
      const b = encrypt(k, "same", { now: NOW_S })
      assert.notStrictEqual(a, b)
      assert.match(a, /^gAAAAA[A-Za-z0-9_-]*=*$/)
      assert.strictEqual(a.length % 4, 0)
      assert.strictEqual(reasonOf(decrypt(k, a)), `ok:${Buffer.from("same").toString("hex")}`)
    }))

  it.effect("a string is encrypted as its UTF-8 bytes, ASCII or not, at every length around a block", () =>
    Effect.sync(() => {
      const iv = randomBytes(16)
      for (const text of ["", "a", "0123456789abcde", "0123456789abcdef", "é", "ünïcødé ✓ 😀", "x".repeat(47) + "€"]) {
        const token = encrypt(k, text, { now: NOW_S, iv })
        assert.strictEqual(token, encrypt(k, Buffer.from(text, "utf8"), { now: NOW_S, iv }), text)
        assert.strictEqual(reasonOf(decrypt(k, token)), `ok:${Buffer.from(text, "utf8").toString("hex")}`)
      }
    }))

  it.effect("empty plaintext round-trips (one block of padding)", () =>
    Effect.sync(() => {
      const token = encrypt(k, new Uint8Array(0), { now: NOW_S })
      assert.strictEqual(Buffer.from(token, "base64url").length, 25 + 16 + 32)
      assert.strictEqual(reasonOf(decrypt(k, token)), "ok:")
    }))

  it.effect("a tampered byte, a truncated token, a wrong key, an unpadded token fail with their reason", () =>
    Effect.sync(() => {
      const token = encrypt(k, "hello world", { now: NOW_S }) // 73 bytes: ends in "=="
      const bytes = Buffer.from(token, "base64url")
      const cut = (n: number) => {
        const s = bytes.subarray(0, n).toString("base64url")
        return s + "=".repeat((4 - (s.length % 4)) % 4)
      }
      assert.strictEqual(reasonOf(decrypt(k, tamper(token, 30, 0x01))), "bad-signature")
      assert.strictEqual(reasonOf(decrypt(k, tamper(token, bytes.length - 1, 0x80))), "bad-signature")
      assert.strictEqual(reasonOf(decrypt(k, tamper(token, 0, 0x01))), "bad-version")
      assert.strictEqual(reasonOf(decrypt(k, cut(bytes.length - 1))), "malformed")
      assert.strictEqual(reasonOf(decrypt(k, cut(40))), "malformed")
      assert.strictEqual(reasonOf(decrypt(k, "")), "malformed")
      assert.strictEqual(reasonOf(decrypt(key(generateFernetKey()), token)), "bad-signature")
      assert.isTrue(token.endsWith("=="))
      assert.strictEqual(reasonOf(decrypt(k, token.replace(/=+$/, ""))), "malformed")
      // Dropping a whole block keeps the structure valid, so only the signature can catch it.
      const long = encrypt(k, "x".repeat(40), { now: NOW_S })
      const longBytes = Buffer.from(long, "base64url")
      const shortened = Buffer.concat([longBytes.subarray(0, longBytes.length - 48), longBytes.subarray(-32)])
      const s = shortened.toString("base64url")
      assert.strictEqual(reasonOf(decrypt(k, s + "=".repeat((4 - (s.length % 4)) % 4))), "bad-signature")
    }))

  it.effect("TTL: valid up to ttl seconds old and up to the clock skew ahead", () =>
    Effect.sync(() => {
      const token = encrypt(k, "t", { now: 1_000_000 })
      const at = (now: number) => reasonOf(decrypt(k, token, { ttlSeconds: 60, now }))
      assert.strictEqual(at(1_000_060), `ok:${Buffer.from("t").toString("hex")}`)
      assert.strictEqual(at(1_000_061), "expired")
      assert.strictEqual(at(1_000_000 - MAX_CLOCK_SKEW_SECONDS), `ok:${Buffer.from("t").toString("hex")}`)
      assert.strictEqual(at(1_000_000 - MAX_CLOCK_SKEW_SECONDS - 1), "future")
    }))

  it.effect("a forged token is reported as bad-signature, never by its (unauthenticated) timestamp", () =>
    Effect.sync(() => {
      const token = encrypt(key(generateFernetKey()), "t", { now: 1 })
      assert.strictEqual(reasonOf(decrypt(k, token, { ttlSeconds: 60, now: 1_000_000 })), "bad-signature")
    }))

  it.effect.prop(
    "round-trips any plaintext under any key",
    [Schema.Uint8Array, Schema.Uint8Array.check(Schema.isMinLength(32), Schema.isMaxLength(32))],
    ([plaintext, raw]) =>
      Effect.sync(() => {
        const k2 = fernetKeyFromBytes(raw)
        const result = decrypt(k2, encrypt(k2, plaintext, { now: NOW_S }))
        assert.isTrue(Result.isSuccess(result))
        if (Result.isSuccess(result)) assert.deepStrictEqual(new Uint8Array(result.success), plaintext)
      })
  )

  it.effect.prop(
    "any single-byte change of the token is refused",
    [Schema.Uint8Array, Schema.Int.check(Schema.isBetween({ minimum: 0, maximum: 10_000 })), Schema.Int.check(Schema.isBetween({ minimum: 1, maximum: 255 }))],
    ([plaintext, index, mask]) =>
      Effect.sync(() => {
        const token = encrypt(k, plaintext, { now: NOW_S })
        const reason = reasonOf(decrypt(k, tamper(token, index, mask)))
        assert.include(["bad-signature", "bad-version"], reason)
      })
  )
})

describe("MultiFernet", () => {
  const oldKey = key(generateFernetKey())
  const newKey = key(generateFernetKey())

  it.effect("encrypts with the first key and decrypts tokens of every key (rotation)", () =>
    Effect.sync(() => {
      const before = makeMultiFernet([oldKey])
      const after = makeMultiFernet([newKey, oldKey])
      const oldToken = before.encrypt("old", { now: NOW_S })
      const newToken = after.encrypt("new", { now: NOW_S })
      assert.strictEqual(reasonOf(after.decrypt(oldToken)), `ok:${Buffer.from("old").toString("hex")}`)
      assert.strictEqual(reasonOf(after.decrypt(newToken)), `ok:${Buffer.from("new").toString("hex")}`)
      // The new token really is under the new key: the old ring and the old key alone refuse it.
      assert.strictEqual(reasonOf(before.decrypt(newToken)), "bad-signature")
      assert.strictEqual(reasonOf(decrypt(newKey, newToken)), `ok:${Buffer.from("new").toString("hex")}`)
      // Once the old key is dropped its tokens stop working.
      assert.strictEqual(reasonOf(makeMultiFernet([newKey]).decrypt(oldToken)), "bad-signature")
    }))

  it.effect("reports the outcome of the key whose signature matches", () =>
    Effect.sync(() => {
      const ring = makeMultiFernet([newKey, oldKey])
      const stale = encrypt(oldKey, "x", { now: 100 })
      assert.strictEqual(reasonOf(ring.decrypt(stale, { ttlSeconds: 10, now: 1000 })), "expired")
      assert.strictEqual(reasonOf(ring.decrypt("%%%")), "malformed")
    }))
})

describe("Fernet key primitives", () => {
  it.effect("HMAC and AES-CBC agree with node:crypto's own contexts on random keys, IVs and data", () =>
    Effect.sync(() => {
      for (let round = 0; round < 300; round++) {
        const raw = randomBytes(32)
        const k = fernetKeyFromBytes(raw)
        // Lengths across one to five SHA-256 blocks, each padding boundary among them.
        const data = randomBytes(round % 300)
        assert.deepStrictEqual(k.mac(data), createHmac("sha256", raw.subarray(0, 16)).update(data).digest())
        const iv = randomBytes(16)
        const blocks = randomBytes(16 * (1 + (round % 6)))
        const reference = createCipheriv("aes-128-cbc", raw.subarray(16), iv).setAutoPadding(false)
        const expected = Buffer.concat([reference.update(blocks), reference.final()])
        // Encrypting again on the same key: the context's chain restarts from each message's IV.
        for (let again = 0; again < 2; again++) assert.deepStrictEqual(k.encryptBlocks(iv, Buffer.from(blocks)), expected)
        assert.deepStrictEqual(k.decryptBlocks(iv, expected), blocks)
      }
    }))
})
