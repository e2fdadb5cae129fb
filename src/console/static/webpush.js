// Web Push message encryption (RFC 8291, aes128gcm; decryption of the older aesgcm too) and VAPID
// (RFC 8292) with the browser's WebCrypto, for the console page. No dependencies: it also runs in
// Node (globalThis.crypto), where a test checks it against the web-push and http_ece libraries.

const subtle = globalThis.crypto.subtle
const encoder = new TextEncoder()

/** @param {Uint8Array} bytes */
const toBase64Url = (bytes) => {
  let binary = ""
  for (const byte of bytes) binary += String.fromCharCode(byte)
  return btoa(binary).replaceAll("+", "-").replaceAll("/", "_").replace(/=+$/, "")
}

/** @param {string} text */
const fromBase64Url = (text) => {
  const binary = atob(text.replaceAll("-", "+").replaceAll("_", "/").replace(/=+$/, ""))
  return Uint8Array.from(binary, (c) => c.charCodeAt(0))
}

const concat = (...parts) => {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0))
  let at = 0
  for (const part of parts) {
    out.set(part, at)
    at += part.length
  }
  return out
}

const hkdf = async (salt, ikm, info, length) => {
  const key = await subtle.importKey("raw", ikm, "HKDF", false, ["deriveBits"])
  return new Uint8Array(await subtle.deriveBits({ name: "HKDF", hash: "SHA-256", salt, info }, key, length * 8))
}

const ecdhSecret = async (privateKey, publicRaw) => {
  const publicKey = await subtle.importKey("raw", publicRaw, { name: "ECDH", namedCurve: "P-256" }, false, [])
  return new Uint8Array(await subtle.deriveBits({ name: "ECDH", public: publicKey }, privateKey, 256))
}

const newEcdhPair = () => subtle.generateKey({ name: "ECDH", namedCurve: "P-256" }, false, ["deriveBits"])

/**
 * A subscriber's keys: an ECDH P-256 pair (private key not extractable) and a 16-byte auth secret.
 * `p256dh` and `auth` are what the subscription JSON carries.
 */
export const makeSubscriberKeys = async () => {
  const pair = await newEcdhPair()
  const publicRaw = new Uint8Array(await subtle.exportKey("raw", pair.publicKey))
  const auth = globalThis.crypto.getRandomValues(new Uint8Array(16))
  return { privateKey: pair.privateKey, publicRaw, auth, p256dh: toBase64Url(publicRaw), authText: toBase64Url(auth) }
}

const RECORD_SIZE = 4096

/**
 * The most plaintext bytes an aes128gcm push may carry when the server accepts bodies of at most
 * `maxBodyBytes`: the body adds its header (salt, record size, key id length, our 65-byte public
 * key), the padding delimiter and the 16-byte tag; and one record holds at most RECORD_SIZE - 17.
 * @param {number} maxBodyBytes
 */
export const maxPlaintextBytes = (maxBodyBytes) => Math.min(RECORD_SIZE - 17, maxBodyBytes - (21 + 65 + 1 + 16))

/**
 * The aes128gcm body of `plaintext` for a subscription's `p256dh` and `auth` (one record): salt,
 * record size, our ephemeral public key, then the ciphertext of plaintext + 0x02.
 * @param {{p256dh: string, auth: string}} keys
 * @param {Uint8Array} plaintext
 */
export const encryptAes128gcm = async (keys, plaintext) => {
  const uaPublic = fromBase64Url(keys.p256dh)
  const auth = fromBase64Url(keys.auth)
  if (plaintext.length > RECORD_SIZE - 17) throw new Error(`at most ${RECORD_SIZE - 17} bytes fit in one record`)
  const pair = await newEcdhPair()
  const asPublic = new Uint8Array(await subtle.exportKey("raw", pair.publicKey))
  const secret = await ecdhSecret(pair.privateKey, uaPublic)
  const ikm = await hkdf(auth, secret, concat(encoder.encode("WebPush: info\0"), uaPublic, asPublic), 32)
  const salt = globalThis.crypto.getRandomValues(new Uint8Array(16))
  const cek = await hkdf(salt, ikm, encoder.encode("Content-Encoding: aes128gcm\0"), 16)
  const nonce = await hkdf(salt, ikm, encoder.encode("Content-Encoding: nonce\0"), 12)
  const key = await subtle.importKey("raw", cek, "AES-GCM", false, ["encrypt"])
  const ciphertext = new Uint8Array(await subtle.encrypt({ name: "AES-GCM", iv: nonce }, key, concat(plaintext, Uint8Array.of(2))))
  const header = new Uint8Array(21)
  new DataView(header.buffer).setUint32(16, RECORD_SIZE)
  header.set(salt, 0)
  header[20] = asPublic.length
  return concat(header, asPublic, ciphertext)
}

/**
 * Encrypt `plaintext` for a subscription and POST it to its endpoint, as an application server
 * does: the response, and when it is not a success the error JSON's text ("413 (errno 104): …").
 * @param {{endpoint: string, keys: {p256dh: string, auth: string}}} subscription
 * @param {Uint8Array} plaintext
 * @param {Record<string, string>} headers  TTL, Topic, Urgency, Authorization…
 */
export const sendPush = async (subscription, plaintext, headers) => {
  const body = await encryptAes128gcm(subscription.keys, plaintext)
  const response = await fetch(subscription.endpoint, {
    method: "POST",
    headers: { "Content-Encoding": "aes128gcm", "Content-Type": "application/octet-stream", ...headers },
    body
  })
  if (response.ok) return { response, problem: undefined }
  const error = await response.json().catch(() => ({}))
  return { response, problem: `${response.status}${error.errno ? ` (errno ${error.errno})` : ""}: ${error.message ?? response.statusText}` }
}

const headerParam = (header, name) =>
  header?.split(/[;,]/).map((part) => part.trim().split("=")).find(([key]) => key === name)?.[1]

const decryptRecords = async (cek, nonce, body, recordSize, unpad) => {
  const key = await subtle.importKey("raw", cek, "AES-GCM", false, ["decrypt"])
  const out = []
  for (let at = 0, seq = 0; at < body.length; at += recordSize, seq++) {
    const iv = nonce.slice()
    const view = new DataView(iv.buffer)
    view.setUint32(8, view.getUint32(8) ^ seq)
    const record = new Uint8Array(await subtle.decrypt({ name: "AES-GCM", iv }, key, body.subarray(at, at + recordSize)))
    out.push(unpad(record, at + recordSize >= body.length))
  }
  return concat(...out)
}

/**
 * The plaintext of a push as the connection node delivers it: `data` (base64url) and `headers`
 * (`encoding`, and for aesgcm `crypto_key` / `encryption`), for the subscriber's keys.
 * @param {{privateKey: CryptoKey, publicRaw: Uint8Array, auth: Uint8Array}} keys
 * @param {string} data
 * @param {{encoding?: string, crypto_key?: string, encryption?: string}} headers
 */
export const decryptPush = async (keys, data, headers) => {
  const body = fromBase64Url(data)
  if (headers.encoding === "aes128gcm") {
    const view = new DataView(body.buffer, body.byteOffset, body.byteLength)
    const salt = body.subarray(0, 16)
    const recordSize = view.getUint32(16)
    const idLength = body[20]
    const asPublic = body.subarray(21, 21 + idLength)
    const secret = await ecdhSecret(keys.privateKey, asPublic)
    const ikm = await hkdf(keys.auth, secret, concat(encoder.encode("WebPush: info\0"), keys.publicRaw, asPublic), 32)
    const cek = await hkdf(salt, ikm, encoder.encode("Content-Encoding: aes128gcm\0"), 16)
    const nonce = await hkdf(salt, ikm, encoder.encode("Content-Encoding: nonce\0"), 12)
    // Padding: trailing zeros, then the delimiter (2 in the last record, 1 before).
    return decryptRecords(cek, nonce, body.subarray(21 + idLength), recordSize, (record) => {
      let end = record.length - 1
      while (end >= 0 && record[end] === 0) end--
      if (end < 0 || (record[end] !== 1 && record[end] !== 2)) throw new Error("bad padding")
      return record.subarray(0, end)
    })
  }
  if (headers.encoding === "aesgcm") {
    const dh = headerParam(headers.crypto_key, "dh")
    const salt = headerParam(headers.encryption, "salt")
    if (dh === undefined || salt === undefined) throw new Error("aesgcm push without dh or salt")
    const asPublic = fromBase64Url(dh)
    const secret = await ecdhSecret(keys.privateKey, asPublic)
    const ikm = await hkdf(keys.auth, secret, encoder.encode("Content-Encoding: auth\0"), 32)
    const length = (n) => Uint8Array.of(n >> 8, n & 0xff)
    const context = concat(encoder.encode("P-256\0"), length(keys.publicRaw.length), keys.publicRaw, length(asPublic.length), asPublic)
    const saltBytes = fromBase64Url(salt)
    const cek = await hkdf(saltBytes, ikm, concat(encoder.encode("Content-Encoding: aesgcm\0"), context), 16)
    const nonce = await hkdf(saltBytes, ikm, concat(encoder.encode("Content-Encoding: nonce\0"), context), 12)
    const rs = Number(headerParam(headers.encryption, "rs") ?? "4096")
    // Each record starts with a 2-byte padding length, then that many zeros.
    return decryptRecords(cek, nonce, body, rs + 16, (record) => record.subarray(2 + ((record[0] << 8) | record[1])))
  }
  throw new Error(`unsupported encoding ${JSON.stringify(headers.encoding)}`)
}

/** A VAPID key pair (ECDSA P-256) made here; `publicKey` is the base64url point an application server shares. */
export const makeVapidKeys = async () => {
  const pair = await subtle.generateKey({ name: "ECDSA", namedCurve: "P-256" }, false, ["sign"])
  const publicRaw = new Uint8Array(await subtle.exportKey("raw", pair.publicKey))
  return { privateKey: pair.privateKey, publicKey: toBase64Url(publicRaw) }
}

/**
 * The contact the console signs its own pushes with. A contact at the page's host would be
 * `localhost` on a laptop, which this server warns of (vapid-sub-local: Apple's push service refuses
 * it); the console's pushes only ever go to its own server, so a placeholder at a domain that
 * exists (example.com, reserved for examples) is honest and draws no warning.
 */
export const CONSOLE_VAPID_SUBJECT = "mailto:console@example.com"

/**
 * The `Authorization: vapid t=…, k=…` header for a push to `endpoint`: an ES256 JWT whose `aud` is
 * the endpoint's origin, valid 12 hours.
 * @param {{privateKey: CryptoKey, publicKey: string}} vapid
 * @param {string} endpoint
 * @param {string} subject
 */
export const vapidAuthorization = async (vapid, endpoint, subject) => {
  const json = (value) => toBase64Url(encoder.encode(JSON.stringify(value)))
  const claims = { aud: new URL(endpoint).origin, exp: Math.floor(Date.now() / 1000) + 12 * 3600, sub: subject }
  const unsigned = `${json({ typ: "JWT", alg: "ES256" })}.${json(claims)}`
  // WebCrypto's ECDSA signature is r || s, as JWS wants it.
  const signature = new Uint8Array(await subtle.sign({ name: "ECDSA", hash: "SHA-256" }, vapid.privateKey, encoder.encode(unsigned)))
  return `vapid t=${unsigned}.${toBase64Url(signature)}, k=${vapid.publicKey}`
}
