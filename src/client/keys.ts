/**
 * A subscriber's keys (RFC 8291): an ECDH P-256 key pair and a 16-byte auth secret, kept as
 * base64url so they can be saved and printed; and the decryption of a push with them (`http_ece`,
 * the library `web-push` encrypts with), for both content encodings the service accepts.
 */
import { createECDH, type ECDH, randomBytes } from "node:crypto"
import ece from "http_ece"

export interface SubscriberKeys {
  /** The private key (32 bytes, base64url): never printed, only saved to the state file. */
  readonly privateKey: string
  /** The public key, uncompressed point (65 bytes, base64url): the subscription's `p256dh`. */
  readonly p256dh: string
  /** The auth secret (16 bytes, base64url). */
  readonly auth: string
}

export const makeKeys = (): SubscriberKeys => {
  const ecdh = createECDH("prime256v1")
  ecdh.generateKeys()
  return {
    privateKey: ecdh.getPrivateKey().toString("base64url"),
    p256dh: ecdh.getPublicKey().toString("base64url"),
    auth: randomBytes(16).toString("base64url")
  }
}

const ecdhOf = (keys: SubscriberKeys): ECDH => {
  const ecdh = createECDH("prime256v1")
  ecdh.setPrivateKey(Buffer.from(keys.privateKey, "base64url"))
  return ecdh
}

/** A `name=value` parameter of an `Encryption` / `Crypto-Key` header (`;` or `,` separated). */
const headerParam = (header: string | undefined, name: string): string | undefined =>
  header?.split(/[;,]/).map((part) => part.trim().split("=")).find(([key]) => key === name)?.[1]

/** The encryption headers of a notification frame (the service passes them lowercase, `-` as `_`). */
export interface PushHeaders {
  readonly encoding?: string
  readonly crypto_key?: string
  readonly encryption?: string
}

/**
 * The plaintext of a push's `data` (base64url, as the connection node sends it). Throws when the
 * payload was not encrypted for these keys, or its encoding is neither aes128gcm nor aesgcm.
 */
export const decryptPush = (keys: SubscriberKeys, data: string, headers: PushHeaders): Buffer => {
  const body = Buffer.from(data, "base64url")
  const common = { privateKey: ecdhOf(keys), authSecret: Buffer.from(keys.auth, "base64url") }
  if (headers.encoding === "aes128gcm") return ece.decrypt(body, { version: "aes128gcm", ...common })
  if (headers.encoding === "aesgcm") {
    const dh = headerParam(headers.crypto_key, "dh")
    const salt = headerParam(headers.encryption, "salt")
    if (dh === undefined || salt === undefined) throw new Error("aesgcm push without dh or salt")
    return ece.decrypt(body, { version: "aesgcm", ...common, dh, salt })
  }
  throw new Error(`unsupported encoding ${JSON.stringify(headers.encoding)}`)
}
