/**
 * HMAC-SHA256 (RFC 2104 over FIPS 180-4 SHA-256) in plain code, for Fernet's MAC: the key's padded
 * blocks are hashed once, and each MAC is the compression of the data's blocks from there — no call
 * into OpenSSL. On a busy server each such call (a digest's context made and freed) costs several
 * times its hashing; a message id's MAC is four compressions. SHA-256 has no secret-dependent
 * branch or table index, so the plain code's timing does not depend on the key or the data's values.
 */

const ROUND = new Int32Array([
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
  0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
  0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
  0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
  0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
  0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
  0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2
])

const INITIAL = new Int32Array([0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19])

const BLOCK = 64

/** The message schedule, reused by every compression (they never overlap). */
const schedule = new Int32Array(64)

/** SHA-256's compression of the 64 bytes of `bytes` at `at` into `state`. */
const compress = (state: Int32Array, bytes: Uint8Array, at: number): void => {
  const w = schedule
  for (let i = 0, o = at; i < 16; i++, o += 4) {
    w[i] = ((bytes[o] as number) << 24) | ((bytes[o + 1] as number) << 16) | ((bytes[o + 2] as number) << 8) | (bytes[o + 3] as number)
  }
  for (let i = 16; i < 64; i++) {
    const x = w[i - 15] as number
    const y = w[i - 2] as number
    const s0 = ((x >>> 7) | (x << 25)) ^ ((x >>> 18) | (x << 14)) ^ (x >>> 3)
    const s1 = ((y >>> 17) | (y << 15)) ^ ((y >>> 19) | (y << 13)) ^ (y >>> 10)
    w[i] = ((w[i - 16] as number) + s0 + (w[i - 7] as number) + s1) | 0
  }
  let a = state[0] as number
  let b = state[1] as number
  let c = state[2] as number
  let d = state[3] as number
  let e = state[4] as number
  let f = state[5] as number
  let g = state[6] as number
  let h = state[7] as number
  for (let i = 0; i < 64; i++) {
    const s1 = ((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7))
    const t1 = (h + s1 + ((e & f) ^ (~e & g)) + (ROUND[i] as number) + (w[i] as number)) | 0
    const s0 = ((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10))
    const t2 = (s0 + ((a & b) ^ (a & c) ^ (b & c))) | 0
    h = g
    g = f
    f = e
    e = (d + t1) | 0
    d = c
    c = b
    b = a
    a = (t1 + t2) | 0
  }
  state[0] = ((state[0] as number) + a) | 0
  state[1] = ((state[1] as number) + b) | 0
  state[2] = ((state[2] as number) + c) | 0
  state[3] = ((state[3] as number) + d) | 0
  state[4] = ((state[4] as number) + e) | 0
  state[5] = ((state[5] as number) + f) | 0
  state[6] = ((state[6] as number) + g) | 0
  state[7] = ((state[7] as number) + h) | 0
}

/** The last one or two blocks of a message: its tail, the 0x80 byte, zeros and the length in bits. */
const last = new Uint8Array(2 * BLOCK)

/**
 * The hash of a message whose first block (a padded key) is already in `state`, given the rest of
 * it (`data`), written big-endian into `out` (32 bytes at `at`). `state` is overwritten.
 */
const finish = (state: Int32Array, data: Uint8Array, out: Uint8Array, at: number): void => {
  let o = 0
  for (; o + BLOCK <= data.length; o += BLOCK) compress(state, data, o)
  const rest = data.length - o
  const blocks = rest + 9 > BLOCK ? 2 : 1
  last.fill(0)
  last.set(data.subarray(o), 0)
  last[rest] = 0x80
  // Bits of the whole message, the key's block included: below 2^53, so two 32-bit halves.
  const bits = (BLOCK + data.length) * 8
  const end = blocks * BLOCK
  const high = Math.floor(bits / 0x1_0000_0000)
  last[end - 8] = high >>> 24
  last[end - 7] = high >>> 16
  last[end - 6] = high >>> 8
  last[end - 5] = high
  last[end - 4] = bits >>> 24
  last[end - 3] = bits >>> 16
  last[end - 2] = bits >>> 8
  last[end - 1] = bits
  compress(state, last, 0)
  if (blocks === 2) compress(state, last, BLOCK)
  for (let i = 0; i < 8; i++) {
    const v = state[i] as number
    out[at + 4 * i] = v >>> 24
    out[at + 4 * i + 1] = v >>> 16
    out[at + 4 * i + 2] = v >>> 8
    out[at + 4 * i + 3] = v
  }
}

/** The state after the first block of a key's HMAC pad (`fill`: 0x36 inner, 0x5c outer). */
const padded = (key: Uint8Array, fill: number): Int32Array => {
  const block = new Uint8Array(BLOCK).fill(fill)
  for (let i = 0; i < key.length; i++) block[i] = (block[i] as number) ^ (key[i] as number)
  const state = INITIAL.slice()
  compress(state, block, 0)
  return state
}

/** HMAC-SHA256 under `key` (at most 64 bytes, as Fernet's 16-byte signing key). */
export const hmacSha256 = (key: Uint8Array): ((data: Uint8Array) => Buffer) => {
  if (key.length > BLOCK) throw new RangeError("an HMAC key longer than a SHA-256 block is hashed first: not supported here")
  const inner = padded(key, 0x36)
  const outer = padded(key, 0x5c)
  const state = new Int32Array(8)
  const innerDigest = new Uint8Array(32)
  return (data) => {
    state.set(inner)
    finish(state, data, innerDigest, 0)
    const mac = Buffer.allocUnsafe(32)
    state.set(outer)
    finish(state, innerDigest, mac, 0)
    return mac
  }
}
