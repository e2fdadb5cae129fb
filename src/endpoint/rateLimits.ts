/**
 * The rate limits of the push route: token buckets keyed on who sends and to whom. A bucket holds
 * up to `burst` pushes and refills at `perSecond`; a push that finds it empty is answered 429 with
 * `Retry-After` (the seconds until the next token) and the limit it met (`RateLimited.by`, counted
 * in `notification.rate_limited{limit}`). Buckets are kept for the most recent keys only (a
 * bounded map each), so a flood of addresses, keys or subscriptions costs bounded memory.
 *
 * Who sends: a push to a v2 subscription (bound to a VAPID key when it was made), signed by that
 * key, is counted against the key (its signature verified first, so nobody spends another's
 * allowance), not against its address: the binding makes the key the sender's name, and senders
 * behind one address (a NAT, a hosting provider) are then limited apart. Every other push — unsigned,
 * or signed with a key its subscription is not bound to, which anyone can mint — is counted against
 * its address before any work is done for it, and, when signed, against its key too. A push that
 * claims its subscription's key but whose signature does not verify (forged, expired, for another
 * audience) is counted, after the check, in a bucket of that key at its address (at the address's
 * rate): a bound on the signature checks one address makes the node do for a key, which neither
 * the address's unsigned pushes nor its other senders' failures spend.
 *
 * To whom: every push, whoever sends it, takes a token of its subscription's bucket, which
 * protects one client from all its senders together.
 *
 * The client address is the connection's peer, unless that peer is a listed trusted proxy: then
 * it is the rightmost `X-Forwarded-For` entry that is not a trusted proxy itself (the entries to
 * its left are whatever the client wrote). IPv6 clients are counted by their /64, the block one
 * host usually holds. A peer on the loopback that is not a listed proxy is not limited by address:
 * it is this machine (a proxy in front, an application server beside), whose senders cannot be told
 * apart.
 */
import { BlockList, isIP } from "node:net"
import * as Result from "effect/Result"
import { addressList, countedAddress, inList, LOOPBACK, plainAddress } from "../platform/addresses.ts"
import { RateLimited, type RateLimitName } from "../domain/errors.ts"
import { METRICS } from "../observability/catalog.ts"
import type { Counter, MetricsService } from "../observability/Metrics.ts"
import { memoize, RecentMap } from "../platform/memo.ts"

export interface RateLimit {
  /** Pushes per second, sustained; 0: no limit. */
  readonly perSecond: number
  /** Pushes at once after a quiet period. */
  readonly burst: number
}

interface Bucket {
  tokens: number
  at: number
}

/** Keys whose buckets are kept; an evicted key starts again with a full bucket. */
const SENDERS = 100_000

/**
 * Token buckets by key. `take` takes a token, answering 0 (go) or the whole seconds until one is
 * back; `wait` answers the same without taking one.
 */
export const makeTokenBuckets = (limit: RateLimit, capacity = SENDERS) => {
  const buckets = new RecentMap<Bucket>(capacity)
  /** The bucket of `key`, refilled to `nowMs`. */
  const refilled = (key: string, nowMs: number): Bucket => {
    let bucket = buckets.get(key)
    if (bucket === undefined) {
      bucket = { tokens: limit.burst, at: nowMs }
      buckets.set(key, bucket)
    }
    bucket.tokens = Math.min(limit.burst, bucket.tokens + (Math.max(0, nowMs - bucket.at) / 1000) * limit.perSecond)
    bucket.at = nowMs
    return bucket
  }
  const waitFor = (bucket: Bucket): number =>
    bucket.tokens >= 1 ? 0 : Math.max(1, Math.ceil((1 - bucket.tokens) / limit.perSecond))
  return {
    take: (key: string, nowMs: number): number => {
      if (limit.perSecond <= 0) return 0
      const bucket = refilled(key, nowMs)
      if (bucket.tokens < 1) return waitFor(bucket)
      bucket.tokens -= 1
      return 0
    },
    // A key without a bucket has a full one: none is made for it.
    wait: (key: string, nowMs: number): number =>
      limit.perSecond <= 0 || buckets.get(key) === undefined ? 0 : waitFor(refilled(key, nowMs))
  }
}

/** A list of addresses and CIDR blocks (`10.0.0.1`, `10.0.0.0/8`, `fd00::/8`, checked by the config); undefined for none. */
export const trustedProxies = (entries: ReadonlyArray<string>): BlockList | undefined =>
  entries.length === 0 ? undefined : addressList(entries)

const LOOPBACK_LIST = addressList(LOOPBACK)

/** The address a push is counted against (see the module comment); undefined: not limited by address. */
export const clientAddress = (
  peer: string | undefined,
  forwardedFor: string | ReadonlyArray<string> | undefined,
  proxies: BlockList | undefined
): string | undefined => {
  const remote = plainAddress(peer ?? "")
  const trusted = proxies !== undefined && inList(proxies, remote)
  if (!trusted && inList(LOOPBACK_LIST, remote)) return undefined
  let client = remote
  if (proxies !== undefined && trusted && forwardedFor !== undefined) {
    // Read from the right, one entry at a time, only as far as the trusted proxies go: the entries
    // further left (as many as a header holds) cost nothing.
    const list = typeof forwardedFor === "string" ? forwardedFor : forwardedFor.join(",")
    let end = list.length
    for (;;) {
      const start = end === 0 ? 0 : list.lastIndexOf(",", end - 1) + 1
      const hop = plainAddress(list.slice(start, end).trim())
      if (isIP(hop) === 0) break // not an address: nothing left of it can be believed
      client = hop
      if (!inList(proxies, hop) || start === 0) break
      end = start - 1
    }
  }
  return countedAddress(client)
}

export interface RateLimitOptions {
  readonly perAddress: RateLimit
  readonly perVapidKey: RateLimit
  /** What one subscription may be sent, whoever sends it. */
  readonly perSubscription: RateLimit
  /** Addresses and CIDR blocks whose `X-Forwarded-For` is believed. */
  readonly trustedProxies: ReadonlyArray<string>
}

const OFF: RateLimit = { perSecond: 0, burst: 1 }

/** No limit at all (tests, and a node built without options). */
export const NO_LIMITS: RateLimitOptions = { perAddress: OFF, perVapidKey: OFF, perSubscription: OFF, trustedProxies: [] }

export type RateLimits = ReturnType<typeof makeRateLimits>

/** Peers whose counted address is remembered (the address's parse and list checks are not redone for each push). */
const PEERS = 10_000

/** A peer not limited by address, as remembered. */
const NOT_LIMITED: unique symbol = Symbol("not limited")

/** A sender within its limits. */
const WITHIN: Result.Result<void, RateLimited> = Result.succeed(undefined)

const LIMIT_NAMES: ReadonlyArray<RateLimitName> = ["address", "vapid_key", "subscription", "bad_signature"]

/** The key of a VAPID key's failed signatures from one client address. */
const signerAt = (client: string, rawKey: Buffer): string => `${client} ${rawKey.toString("base64url")}`

/**
 * The limits of the push route (and the address's of the other routes), as checks that fail with
 * `RateLimited`: plain values, checked on every push; each refusal counted in `metrics`, when given.
 */
export const makeRateLimits = (options: RateLimitOptions, metrics?: MetricsService) => {
  const proxies = trustedProxies(options.trustedProxies)
  const addresses = makeTokenBuckets(options.perAddress)
  const badSignatures = makeTokenBuckets(options.perAddress)
  const keys = makeTokenBuckets(options.perVapidKey)
  const subscriptions = makeTokenBuckets(options.perSubscription)
  const refusals = new Map<RateLimitName, Counter>(
    metrics === undefined ? [] : LIMIT_NAMES.map((limit) => [limit, metrics.counter(METRICS.rateLimited.name, { limit })])
  )
  // Without an `X-Forwarded-For` to believe, the counted address is the peer's alone.
  const ofPeer = memoize<string | typeof NOT_LIMITED>(PEERS, (peer) => clientAddress(peer, undefined, proxies) ?? NOT_LIMITED)
  const clientOf = (peer: string | undefined, forwardedFor: string | ReadonlyArray<string> | undefined): string | undefined => {
    if (forwardedFor !== undefined && proxies !== undefined) return clientAddress(peer, forwardedFor, proxies)
    const client = ofPeer(peer ?? "")
    return client === NOT_LIMITED ? undefined : client
  }
  const verdict = (by: RateLimitName, wait: number): Result.Result<void, RateLimited> => {
    if (wait === 0) return WITHIN
    refusals.get(by)?.inc()
    return Result.fail(new RateLimited({ by, retryAfter: wait }))
  }
  return {
    /** The address a request from `peer` is counted as (undefined: not limited by address). */
    clientOf,
    /** A token of the sender's address (a push that does not name its sender, and the other routes' requests). */
    address: (peer: string | undefined, forwardedFor: string | ReadonlyArray<string> | undefined, nowMs: number) => {
      if (options.perAddress.perSecond <= 0) return WITHIN
      const client = clientOf(peer, forwardedFor)
      return client === undefined ? WITHIN : verdict("address", addresses.take(client, nowMs))
    },
    /** Before the signature of a push claiming its subscription's key (`rawKey`) is checked: whether the key may have one more fail from its address. */
    signatureCheck: (peer: string | undefined, forwardedFor: string | ReadonlyArray<string> | undefined, rawKey: Buffer, nowMs: number) => {
      if (options.perAddress.perSecond <= 0) return WITHIN
      const client = clientOf(peer, forwardedFor)
      return client === undefined ? WITHIN : verdict("bad_signature", badSignatures.wait(signerAt(client, rawKey), nowMs))
    },
    /** A push claiming its subscription's key (`rawKey`) whose signature failed: a token of that key's bucket at its address. */
    signatureFailed: (peer: string | undefined, forwardedFor: string | ReadonlyArray<string> | undefined, rawKey: Buffer, nowMs: number): void => {
      if (options.perAddress.perSecond <= 0) return
      const client = clientOf(peer, forwardedFor)
      if (client !== undefined) badSignatures.take(signerAt(client, rawKey), nowMs)
    },
    /** By the verified key's raw point. */
    vapidKey: (rawKey: Buffer, nowMs: number) =>
      options.perVapidKey.perSecond <= 0 ? WITHIN : verdict("vapid_key", keys.take(rawKey.toString("base64url"), nowMs)),
    /** By the subscription a push is for, whoever sends it. */
    subscription: (uaid: string, channelId: string, nowMs: number) =>
      options.perSubscription.perSecond <= 0 ? WITHIN : verdict("subscription", subscriptions.take(uaid + channelId, nowMs))
  }
}
