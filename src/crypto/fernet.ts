/**
 * Fernet (https://github.com/fernet/spec), version 0x80, on node:crypto.
 *
 *   token = base64url(0x80 ‖ timestamp (u64 BE seconds) ‖ IV (16) ‖ AES-128-CBC/PKCS7 ciphertext ‖ HMAC-SHA256 (32))
 *   key   = base64url(signing key (16) ‖ encryption key (16))
 *
 * Tokens are written and read in canonical padded base64url only; callers that strip `=` (endpoint
 * URLs) re-pad before decrypting. The primitives are synchronous CPU work returning `Result`, so the
 * per-request path allocates no Effect; the `EndpointCrypto` service lifts them.
 */
import {
  createCipheriv,
  createDecipheriv,
  createSecretKey,
  type KeyObject,
  randomBytes,
  randomFillSync,
  timingSafeEqual
} from "node:crypto"
import * as Data from "effect/Data"
import * as Result from "effect/Result"
import { hmacSha256 } from "./hmac.ts"

/**
 * Why a token was refused.
 * - `malformed`: not canonical padded base64url, shorter than one block, or ciphertext not a whole
 *   number of AES blocks (structure, checked before any key is used)
 * - `bad-version`: first byte is not 0x80
 * - `bad-signature`: HMAC does not match under any key (tampered, truncated body, or wrong key)
 * - `expired` / `future`: only with a `ttlSeconds` option — older than the TTL, or stamped more than
 *   {@link MAX_CLOCK_SKEW_SECONDS} ahead of now
 * - `bad-padding`: authentic token whose plaintext padding is wrong (a broken encoder, not an attacker)
 */
export type FernetErrorReason = "malformed" | "bad-version" | "bad-signature" | "expired" | "future" | "bad-padding"

export class FernetError extends Data.TaggedError("FernetError")<{ readonly reason: FernetErrorReason }> {}

/** A key string that is not 32 bytes of base64url. The message never contains the key. */
export class FernetKeyError extends Data.TaggedError("FernetKeyError")<{ readonly message: string }> {}

/** The Fernet libraries' bound (Python `cryptography`, Rust `fernet`): a token may be this far ahead of our clock. */
export const MAX_CLOCK_SKEW_SECONDS = 60

const VERSION = 0x80
const HEADER = 1 + 8 + 16
const MAC = 32
const BLOCK = 16

/**
 * A key: its two halves as KeyObjects (they never print their material), and the operations under
 * them. In a busy server every call into OpenSSL runs with cold caches and costs 20-35 µs whatever
 * its work (a fresh cipher, digest or HMAC context, `randomBytes`, measured), so a token takes as
 * few calls as possible: each key keeps one AES-CBC context for encrypting and one AES-ECB context
 * for decrypting for its life, its HMAC is computed in plain code from the padded keys' state
 * (`hmac.ts`: no call at all), and IVs come from a pool of random bytes filled 256 at a time. A
 * token is made in the buffer it is encoded from (its plaintext written where the ciphertext goes).
 * The prepared material lives in closures, where printing the key does not reach it.
 */
export interface FernetKey {
  readonly signing: KeyObject
  readonly encryption: KeyObject
  /** HMAC-SHA256 of `data` under the signing key. */
  readonly mac: (data: Uint8Array) => Buffer
  /** AES-128-CBC under the encryption key, no padding: whole blocks in (overwritten), as many out. */
  readonly encryptBlocks: (iv: Uint8Array, blocks: Buffer) => Buffer
  readonly decryptBlocks: (iv: Uint8Array, blocks: Uint8Array) => Buffer
}

const aes128Cbc = (key: KeyObject): Pick<FernetKey, "encryptBlocks" | "decryptBlocks"> => {
  // A CBC context chains each block onto the last ciphertext block it produced. Starting a new
  // message on it: its first block is XORed with (IV ⊕ that last block) beforehand, so the chain
  // restarts from the message's own IV — one call per message, no context made. Decrypting is one
  // ECB call, each block then XORed with the ciphertext block before it.
  const forward = createCipheriv("aes-128-cbc", key, Buffer.alloc(BLOCK)).setAutoPadding(false)
  let last: Uint8Array = Buffer.alloc(BLOCK)
  const backward = createDecipheriv("aes-128-ecb", key, null).setAutoPadding(false)
  return {
    encryptBlocks: (iv, blocks) => {
      for (let i = 0; i < BLOCK; i++) blocks[i] = (blocks[i] as number) ^ (iv[i] as number) ^ (last[i] as number)
      const out = forward.update(blocks)
      last = out.subarray(out.length - BLOCK)
      return out
    },
    decryptBlocks: (iv, blocks) => {
      const out = backward.update(blocks)
      for (let at = 0; at < out.length; at += BLOCK) {
        const previous = at === 0 ? iv : blocks.subarray(at - BLOCK, at)
        for (let i = 0; i < BLOCK; i++) out[at + i] = (out[at + i] as number) ^ (previous[i] as number)
      }
      return out
    }
  }
}

export const fernetKeyFromBytes = (raw: Uint8Array): FernetKey => {
  if (raw.length !== 32) throw new RangeError("a Fernet key is 32 bytes")
  const encryption = createSecretKey(raw.subarray(16))
  return { signing: createSecretKey(raw.subarray(0, 16)), encryption, mac: hmacSha256(raw.subarray(0, 16)), ...aes128Cbc(encryption) }
}

export const padBase64 = (s: string): string => s + "=".repeat((4 - (s.length % 4)) % 4)

/**
 * Strict base64url: Node's decoder skips characters outside the alphabet and accepts `+`/`/`, so
 * the input must re-encode to itself (this also rejects trailing data and non-zero filler bits).
 */
const decodeBase64Url = (s: string, padding: "required" | "optional"): Buffer | undefined => {
  const bytes = Buffer.from(s, "base64url")
  const unpadded = bytes.toString("base64url")
  if (s === padBase64(unpadded) || (padding === "optional" && s === unpadded)) return bytes
  return undefined
}

/** Parse a key string: 32 bytes of base64url, `=` padding optional. */
export const parseFernetKey = (key: string): Result.Result<FernetKey, FernetKeyError> => {
  const bytes = decodeBase64Url(key, "optional")
  if (bytes === undefined) {
    return Result.fail(new FernetKeyError({ message: "a Fernet key must be URL-safe base64 (A-Z a-z 0-9 - _)" }))
  }
  if (bytes.length !== 32) {
    return Result.fail(new FernetKeyError({ message: `a Fernet key is 32 bytes, this one decodes to ${bytes.length}` }))
  }
  return Result.succeed(fernetKeyFromBytes(bytes))
}

/** A new random key in the canonical 44-character form. */
export const generateFernetKey = (): string => randomBytes(32).toString("base64url") + "="

interface EncryptOptions {
  /** Timestamp to record, seconds since the epoch: the caller's Clock. */
  readonly now: number
  /** 16-byte IV; default random. Only the spec vectors need to set it: reusing an IV leaks equality. */
  readonly iv?: Uint8Array
}

/** A time check: refuse tokens older than `ttlSeconds` at `now` (and too far in the future). Without it, no time check. */
interface DecryptOptions {
  readonly ttlSeconds: number
  /** Seconds since the epoch: the caller's Clock. */
  readonly now: number
}

/** Random IVs, each used once: drawn from the CSPRNG 256 at a time. */
const ivPool = Buffer.alloc(BLOCK * 256)
let ivNext = ivPool.length

const nextIv = (): Buffer => {
  if (ivNext === ivPool.length) {
    randomFillSync(ivPool)
    ivNext = 0
  }
  ivNext += BLOCK
  return ivPool.subarray(ivNext - BLOCK, ivNext)
}

/**
 * All ASCII: its UTF-8 bytes are then its Latin-1 bytes (a message id's plaintext is). A pattern
 * rather than a loop over `charCodeAt`: a plaintext made by concatenation is a tree of strings,
 * which a pattern flattens once and every `charCodeAt` walks.
 */
const ASCII = /^[\x00-\x7f]*$/

export const encrypt = (key: FernetKey, plaintext: Uint8Array | string, options: EncryptOptions): string => {
  const iv = options.iv ?? nextIv()
  const ascii = typeof plaintext === "string" && ASCII.test(plaintext)
  const length = typeof plaintext !== "string" || ascii ? plaintext.length : Buffer.byteLength(plaintext, "utf8")
  // PKCS#7: 1 to 16 bytes, each the pad's length.
  const pad = BLOCK - (length % BLOCK)
  const bodyLength = HEADER + length + pad
  // The timestamp is whole seconds, not negative (a RangeError otherwise): two 32-bit halves.
  const now = options.now
  if (!Number.isSafeInteger(now) || now < 0) throw new RangeError(`a Fernet timestamp is whole seconds, not ${now}`)
  const token = Buffer.allocUnsafe(bodyLength + MAC)
  token[0] = VERSION
  token.writeUInt32BE(Math.floor(now / 0x1_0000_0000), 1)
  token.writeUInt32BE(now % 0x1_0000_0000, 5)
  token.set(iv, 9)
  // The padded plaintext is laid out where its ciphertext goes, and encrypted from there; the pad
  // byte by byte (at most 16: less than a call into Node's fill).
  const blocks = token.subarray(HEADER, bodyLength)
  if (typeof plaintext !== "string") blocks.set(plaintext, 0)
  else blocks.write(plaintext, 0, ascii ? "latin1" : "utf8")
  for (let i = length; i < blocks.length; i++) blocks[i] = pad
  blocks.set(key.encryptBlocks(iv, blocks), 0)
  token.set(key.mac(token.subarray(0, bodyLength)), bodyLength)
  return padBase64(token.toString("base64url"))
}

/** Decode and check the key-independent structure, once per token whatever the number of keys. */
const decodeToken = (token: string): Buffer | FernetErrorReason => {
  const bytes = decodeBase64Url(token, "required")
  if (bytes === undefined || bytes.length < HEADER + BLOCK + MAC || (bytes.length - HEADER - MAC) % BLOCK !== 0) {
    return "malformed"
  }
  return bytes[0] === VERSION ? bytes : "bad-version"
}

/** Verify the HMAC (constant time) before anything else touches the token, then time, then decrypt. */
const open = (key: FernetKey, bytes: Buffer, options: DecryptOptions | undefined): Buffer | FernetErrorReason => {
  const macAt = bytes.length - MAC
  const mac = key.mac(bytes.subarray(0, macAt))
  if (!timingSafeEqual(mac, bytes.subarray(macAt))) return "bad-signature"
  if (options !== undefined) {
    const { now } = options
    const stamped = Number(bytes.readBigUInt64BE(1))
    if (stamped + options.ttlSeconds < now) return "expired"
    if (stamped > now + MAX_CLOCK_SKEW_SECONDS) return "future"
  }
  const padded = key.decryptBlocks(bytes.subarray(9, HEADER), bytes.subarray(HEADER, macAt))
  const pad = padded[padded.length - 1] as number
  if (pad < 1 || pad > BLOCK) return "bad-padding"
  for (let i = padded.length - pad; i < padded.length; i++) if (padded[i] !== pad) return "bad-padding"
  return padded.subarray(0, padded.length - pad)
}

const fail = (reason: FernetErrorReason) => Result.fail(new FernetError({ reason }))

/** Try each key; the first whose HMAC matches decides the outcome. */
const decryptWith = (
  keys: ReadonlyArray<FernetKey>,
  token: string,
  options: DecryptOptions | undefined
): Result.Result<Buffer, FernetError> => {
  const bytes = decodeToken(token)
  if (typeof bytes === "string") return fail(bytes)
  for (const key of keys) {
    const opened = open(key, bytes, options)
    if (opened !== "bad-signature") return typeof opened === "string" ? fail(opened) : Result.succeed(opened)
  }
  return fail("bad-signature")
}

export const decrypt = (
  key: FernetKey,
  token: string,
  options?: DecryptOptions
): Result.Result<Buffer, FernetError> => decryptWith([key], token, options)

/** Key rotation: encrypt with the first key, decrypt with any. Prepend a new key to rotate. */
export interface MultiFernet {
  readonly encrypt: (plaintext: Uint8Array | string, options: EncryptOptions) => string
  readonly decrypt: (token: string, options?: DecryptOptions) => Result.Result<Buffer, FernetError>
}

export const makeMultiFernet = (keys: readonly [FernetKey, ...ReadonlyArray<FernetKey>]): MultiFernet => {
  const ring = [...keys]
  const first = keys[0]
  return {
    encrypt: (plaintext, options) => encrypt(first, plaintext, options),
    decrypt: (token, options) => decryptWith(ring, token, options)
  }
}
