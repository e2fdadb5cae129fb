/**
 * Per-sender rate limits of the push route: a token bucket per client address and per VAPID key.
 * A bucket holds up to `burst` pushes and refills at `perSecond`; a push that finds it empty is
 * answered 429 with `Retry-After` (the seconds until the next token). Buckets are kept for the
 * most recent senders only (a bounded map), so a flood of addresses costs bounded memory.
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
import { RateLimited } from "../domain/errors.ts"
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

/** Senders whose buckets are kept; an evicted sender starts again with a full bucket. */
const SENDERS = 100_000

/** Token buckets by key. `take` answers 0 (go) or the whole seconds until a token is back. */
export const makeTokenBuckets = (limit: RateLimit, capacity = SENDERS) => {
  const buckets = new RecentMap<Bucket>(capacity)
  return {
    take: (key: string, nowMs: number): number => {
      if (limit.perSecond <= 0) return 0
      let bucket = buckets.get(key)
      if (bucket === undefined) {
        bucket = { tokens: limit.burst, at: nowMs }
        buckets.set(key, bucket)
      }
      bucket.tokens = Math.min(limit.burst, bucket.tokens + (Math.max(0, nowMs - bucket.at) / 1000) * limit.perSecond)
      bucket.at = nowMs
      if (bucket.tokens >= 1) {
        bucket.tokens -= 1
        return 0
      }
      return Math.max(1, Math.ceil((1 - bucket.tokens) / limit.perSecond))
    }
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
  /** Addresses and CIDR blocks whose `X-Forwarded-For` is believed. */
  readonly trustedProxies: ReadonlyArray<string>
}

/** No limit at all (tests, and a node built without options). */
export const NO_LIMITS: RateLimitOptions = {
  perAddress: { perSecond: 0, burst: 1 },
  perVapidKey: { perSecond: 0, burst: 1 },
  trustedProxies: []
}

export type RateLimits = ReturnType<typeof makeRateLimits>

/** Peers whose counted address is remembered (the address's parse and list checks are not redone for each push). */
const PEERS = 10_000

/** A peer not limited by address, as remembered. */
const NOT_LIMITED: unique symbol = Symbol("not limited")

/** A sender within its limits. */
const WITHIN: Result.Result<void, RateLimited> = Result.succeed(undefined)

/** The two limits of the push route, as checks that fail with `RateLimited`: plain values, checked on every push. */
export const makeRateLimits = (options: RateLimitOptions) => {
  const proxies = trustedProxies(options.trustedProxies)
  const addresses = makeTokenBuckets(options.perAddress)
  const keys = makeTokenBuckets(options.perVapidKey)
  // Without an `X-Forwarded-For` to believe, the counted address is the peer's alone.
  const ofPeer = memoize<string | typeof NOT_LIMITED>(PEERS, (peer) => clientAddress(peer, undefined, proxies) ?? NOT_LIMITED)
  const clientOf = (peer: string | undefined, forwardedFor: string | ReadonlyArray<string> | undefined): string | undefined => {
    if (forwardedFor !== undefined && proxies !== undefined) return clientAddress(peer, forwardedFor, proxies)
    const client = ofPeer(peer ?? "")
    return client === NOT_LIMITED ? undefined : client
  }
  const verdict = (by: RateLimited["by"], wait: number): Result.Result<void, RateLimited> =>
    wait === 0 ? WITHIN : Result.fail(new RateLimited({ by, retryAfter: wait }))
  return {
    /** The address a request from `peer` is counted as (undefined: not limited by address). */
    clientOf,
    address: (peer: string | undefined, forwardedFor: string | ReadonlyArray<string> | undefined, nowMs: number) => {
      if (options.perAddress.perSecond <= 0) return WITHIN
      const client = clientOf(peer, forwardedFor)
      return client === undefined ? WITHIN : verdict("address", addresses.take(client, nowMs))
    },
    /** By the key's raw point (a v1 push signed with any key counts against that key). */
    vapidKey: (rawKey: Buffer, nowMs: number) =>
      options.perVapidKey.perSecond <= 0 ? WITHIN : verdict("VAPID key", keys.take(rawKey.toString("base64url"), nowMs))
  }
}
