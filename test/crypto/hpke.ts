/**
 * A small HPKE (RFC 9180, base mode) for the tests: DHKEM(X25519, HKDF-SHA256), HKDF-SHA256 and
 * AES-128-GCM, with `node:crypto`. Enough to make a real push message of the HPKE Web Push draft's
 * kind (no `Content-Encoding`; the draft's own KEM is ML-KEM768-X25519, which only changes the
 * sizes) and to open it again on the receiving side: the service carries it without decrypting.
 * A message is the KEM's `enc` (32 bytes) followed by the sealed payload.
 */
import {
  createCipheriv,
  createDecipheriv,
  createHmac,
  createPrivateKey,
  createPublicKey,
  diffieHellman,
  generateKeyPairSync,
  type KeyObject
} from "node:crypto"

const KEM_ID = 0x0020
const KDF_ID = 0x0001
const AEAD_ID = 0x0001
const ENC_LENGTH = 32
const TAG_LENGTH = 16

const u16 = (n: number) => Buffer.from([n >> 8, n & 0xff])
const KEM_SUITE = Buffer.concat([Buffer.from("KEM"), u16(KEM_ID)])
const HPKE_SUITE = Buffer.concat([Buffer.from("HPKE"), u16(KEM_ID), u16(KDF_ID), u16(AEAD_ID)])
const VERSION = Buffer.from("HPKE-v1")

const extract = (salt: Buffer, ikm: Buffer) => createHmac("sha256", salt.length === 0 ? Buffer.alloc(32) : salt).update(ikm).digest()

const expand = (prk: Buffer, info: Buffer, length: number) => {
  const blocks: Array<Buffer> = []
  let previous = Buffer.alloc(0)
  for (let i = 1; Buffer.concat(blocks).length < length; i++) {
    previous = createHmac("sha256", prk).update(Buffer.concat([previous, info, Buffer.from([i])])).digest()
    blocks.push(previous)
  }
  return Buffer.concat(blocks).subarray(0, length)
}

const labeledExtract = (suite: Buffer, salt: Buffer, label: string, ikm: Buffer) =>
  extract(salt, Buffer.concat([VERSION, suite, Buffer.from(label), ikm]))

const labeledExpand = (suite: Buffer, prk: Buffer, label: string, info: Buffer, length: number) =>
  expand(prk, Buffer.concat([u16(length), VERSION, suite, Buffer.from(label), info]), length)

const EMPTY = Buffer.alloc(0)

const rawPublic = (key: KeyObject): Buffer => Buffer.from(key.export({ format: "jwk" }).x ?? "", "base64url")
const publicFromRaw = (raw: Buffer): KeyObject => createPublicKey({ key: { kty: "OKP", crv: "X25519", x: raw.toString("base64url") }, format: "jwk" })
/** The PKCS #8 form of a raw X25519 private key: this fixed prefix, then the key. */
const PKCS8_X25519 = Buffer.from("302e020100300506032b656e04220420", "hex")
const privateFromRaw = (raw: Buffer): KeyObject => createPrivateKey({ key: Buffer.concat([PKCS8_X25519, raw]), format: "der", type: "pkcs8" })

/** The KEM's shared secret of `dh`, bound to both public keys. */
const sharedSecret = (dh: Buffer, enc: Buffer, recipient: Buffer) => {
  const prk = labeledExtract(KEM_SUITE, EMPTY, "eae_prk", dh)
  return labeledExpand(KEM_SUITE, prk, "shared_secret", Buffer.concat([enc, recipient]), 32)
}

/** The AEAD key and base nonce of the base mode's key schedule. */
const keySchedule = (shared: Buffer, info: Buffer) => {
  const context = Buffer.concat([
    Buffer.from([0]),
    labeledExtract(HPKE_SUITE, EMPTY, "psk_id_hash", EMPTY),
    labeledExtract(HPKE_SUITE, EMPTY, "info_hash", info)
  ])
  const secret = labeledExtract(HPKE_SUITE, shared, "secret", EMPTY)
  return { key: labeledExpand(HPKE_SUITE, secret, "key", context, 16), nonce: labeledExpand(HPKE_SUITE, secret, "base_nonce", context, 12) }
}

export interface HpkeRecipient {
  /** Raw X25519 public key (what a subscription would hand the application server). */
  readonly publicKey: Buffer
  /** The plaintext of a message sealed to this recipient with `info` and `aad` (throws when it does not open). */
  readonly open: (message: Buffer, info: Buffer, aad?: Buffer) => Buffer
}

/** A new recipient, or the one of a raw X25519 private key. */
export const hpkeRecipient = (secret?: Buffer): HpkeRecipient => {
  const privateKey = secret === undefined ? generateKeyPairSync("x25519").privateKey : privateFromRaw(secret)
  const raw = rawPublic(createPublicKey(privateKey))
  return {
    publicKey: raw,
    open: (message, info, aad = EMPTY) => {
      const enc = message.subarray(0, ENC_LENGTH)
      const sealed = message.subarray(ENC_LENGTH)
      const dh = diffieHellman({ privateKey, publicKey: publicFromRaw(enc) })
      const { key, nonce } = keySchedule(sharedSecret(dh, enc, raw), info)
      const decipher = createDecipheriv("aes-128-gcm", key, nonce)
      decipher.setAAD(aad)
      decipher.setAuthTag(sealed.subarray(sealed.length - TAG_LENGTH))
      return Buffer.concat([decipher.update(sealed.subarray(0, sealed.length - TAG_LENGTH)), decipher.final()])
    }
  }
}

/** `plaintext` sealed to `recipient` (raw X25519 public key) with `info`: `enc || ciphertext || tag`. */
export const hpkeSeal = (recipient: Buffer, info: Buffer, plaintext: Buffer): Buffer => {
  const ephemeral = generateKeyPairSync("x25519")
  const enc = rawPublic(ephemeral.publicKey)
  const dh = diffieHellman({ privateKey: ephemeral.privateKey, publicKey: publicFromRaw(recipient) })
  const { key, nonce } = keySchedule(sharedSecret(dh, enc, recipient), info)
  const cipher = createCipheriv("aes-128-gcm", key, nonce)
  return Buffer.concat([enc, cipher.update(plaintext), cipher.final(), cipher.getAuthTag()])
}
