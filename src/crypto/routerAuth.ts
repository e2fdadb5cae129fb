/**
 * Requests between nodes on a connection node's router port (`PUT /push/{uaid}`, `PUT /notif/{uaid}`,
 * `DELETE /notif/{uaid}/{connected_at}`) carry a signature, so that only nodes holding the
 * deployment's keys can deliver to, poke or drop a client:
 *
 *     Autopush-Router-Auth: t=<unix time, ms>,v1=<base64url HMAC-SHA256, 43 characters>
 *
 * The MAC covers `v1\n{t}\n{METHOD}\n{path as sent, query included}\n{Autopush-Connected-At or ""}\n`
 * followed by the body's bytes. Its key is derived from each `crypto_key` with HKDF-SHA256 (no
 * salt, info `autopush-ts router port v1`, 32 bytes): the Fernet key itself is neither sent nor
 * used as a MAC key, and nodes that share `crypto_key` share the router keys without a new
 * secret to hand out. The first key signs, every key verifies (the rotation of `crypto_key`
 * rotates them too). A signature is good for `ROUTER_AUTH_WINDOW_MS` either side of the
 * receiver's clock (node clocks must agree within it: NTP). Keys are derived once, at start: a
 * request costs one HMAC to sign and one to verify (more only while `crypto_key` is rotated: one
 * per key tried).
 */
import { createHmac, hkdfSync, timingSafeEqual } from "node:crypto"
import * as Context from "effect/Context"
import * as Layer from "effect/Layer"
import * as Redacted from "effect/Redacted"
import { TEST_CRYPTO_KEY } from "./endpoint.ts"
import { hmacSha256 } from "./hmac.ts"

/** The request header of the signature (lower case, as Node reads headers). */
export const ROUTER_AUTH_HEADER = "autopush-router-auth"

/** How far a signature's time may be from the receiver's clock, either way (ms). */
export const ROUTER_AUTH_WINDOW_MS = 60_000

const HKDF_INFO = "autopush-ts router port v1"

/** Why a request was refused: no signature (401), or one that is not good (403). */
export type RouterAuthRefusal = "unsigned" | "malformed" | "stale" | "bad_signature"

/** The router key of a Fernet key (URL-safe base64 of 32 bytes). */
export const routerKeyOf = (fernetKey: string): Buffer =>
  Buffer.from(hkdfSync("sha256", Buffer.from(fernetKey, "base64url"), Buffer.alloc(0), HKDF_INFO, 32))

/**
 * Below this many bytes the MAC is computed in plain code (`hmac.ts`, from the key's pads hashed
 * once); above it OpenSSL's, whose per-call cost is then smaller than its faster hashing saves.
 */
const PLAIN_CODE_BELOW = 3_072

/** HMAC-SHA256 of `head ‖ body` under one key. */
const macOf = (key: Buffer): ((head: string, body: Uint8Array | string | undefined) => Buffer) => {
  const plain = hmacSha256(key)
  return (head, body) => {
    const bodyBytes = body === undefined ? 0 : typeof body === "string" ? Buffer.byteLength(body) : body.length
    if (head.length + bodyBytes >= PLAIN_CODE_BELOW) {
      const hmac = createHmac("sha256", key).update(head)
      if (body !== undefined) hmac.update(body)
      return hmac.digest()
    }
    if (body === undefined || bodyBytes === 0) return plain(Buffer.from(head))
    return plain(typeof body === "string" ? Buffer.from(head + body) : Buffer.concat([Buffer.from(head), body]))
  }
}

/** What the MAC covers before the body. */
const headOf = (t: string, method: string, path: string, connectedAt: string | undefined): string =>
  `v1\n${t}\n${method}\n${path}\n${connectedAt ?? ""}\n`

/** `t=<digits>,v1=<43 base64url>`: fixed shape, no backtracking. */
const HEADER = /^t=(\d{1,16}),v1=([A-Za-z0-9_-]{43})$/

export interface RouterAuthOptions {
  /** The `crypto_key` list: the first signs, all verify. */
  readonly keys: Redacted.Redacted<ReadonlyArray<string>>
  /** Let unsigned requests through (rolling the signature out over running nodes); a bad signature is refused all the same. */
  readonly acceptUnsigned: boolean
}

export interface RouterAuthService {
  /** The header value signing a request sent at `nowMs` (`path` as sent, query included). */
  readonly sign: (nowMs: number, method: string, path: string, connectedAt: string | undefined, body: string | Uint8Array | undefined) => string
  /**
   * What can be refused before a body is read: no header (unless unsigned requests are accepted),
   * a malformed one, a time outside the window. Undefined: read the body and `verify`.
   */
  readonly precheck: (nowMs: number, header: string | undefined) => RouterAuthRefusal | undefined
  /** The whole check, body included; undefined: accepted (signed well, or unsigned while they are accepted). */
  readonly verify: (
    nowMs: number,
    header: string | undefined,
    method: string,
    path: string,
    connectedAt: string | undefined,
    body: Uint8Array | undefined
  ) => RouterAuthRefusal | undefined
}

export const makeRouterAuth = (options: RouterAuthOptions): RouterAuthService => {
  const keys = Redacted.value(options.keys)
  if (keys.length === 0) throw new RangeError("router authentication needs at least one crypto key")
  const macs = keys.map((key) => macOf(routerKeyOf(key)))
  const signer = macs[0] as (typeof macs)[number]
  const acceptUnsigned = options.acceptUnsigned

  /** The header's time and MAC when its form and time are good; else why not (undefined: unsigned, let through). */
  const parsed = (nowMs: number, header: string | undefined): RouterAuthRefusal | undefined | { readonly t: string; readonly mac: Buffer } => {
    if (header === undefined) return acceptUnsigned ? undefined : "unsigned"
    const parts = HEADER.exec(header)
    if (parts === null) return "malformed"
    const t = parts[1] as string
    if (Math.abs(nowMs - Number(t)) > ROUTER_AUTH_WINDOW_MS) return "stale"
    const mac = Buffer.from(parts[2] as string, "base64url")
    return mac.length === 32 ? { t, mac } : "malformed"
  }

  return {
    sign: (nowMs, method, path, connectedAt, body) => {
      const t = String(Math.floor(nowMs))
      return `t=${t},v1=${signer(headOf(t, method, path, connectedAt), body).toString("base64url")}`
    },
    precheck: (nowMs, header) => {
      const signature = parsed(nowMs, header)
      return typeof signature === "object" ? undefined : signature
    },
    verify: (nowMs, header, method, path, connectedAt, body) => {
      const signature = parsed(nowMs, header)
      if (typeof signature !== "object") return signature
      const head = headOf(signature.t, method, path, connectedAt)
      // Each comparison is constant-time; trying the keys in order tells only which key signed,
      // and a node of the same deployment signs with the first.
      for (const mac of macs) if (timingSafeEqual(mac(head, body), signature.mac)) return undefined
      return "bad_signature"
    }
  }
}

/** The router port's signatures, from the deployment's `crypto_key`. */
export class RouterAuth extends Context.Service<RouterAuth, RouterAuthService>()("autopush/crypto/RouterAuth") {
  static readonly layer = (options: RouterAuthOptions): Layer.Layer<RouterAuth> => Layer.sync(RouterAuth, () => makeRouterAuth(options))

  /** Signing and verifying with the test crypto key (the one `EndpointCrypto.layerTest` uses). */
  static readonly layerTest: Layer.Layer<RouterAuth> = RouterAuth.layer({ keys: Redacted.make([TEST_CRYPTO_KEY]), acceptUnsigned: false })
}
