/**
 * Router records of WebPush users and the channels a storage read found them to have, kept for a
 * while so that a push reads the record no more than once per channel per `ttlMs`:
 * - a record of a connected client is only used to try a direct delivery, and the node checks what
 *   the cache cannot: it takes the message only for the session the record names (`connected_at`)
 *   and only if that session has not unregistered the channel. When the node does not take it (the
 *   client moved, left, reconnected, unregistered, or the user was reset) the record is forgotten
 *   and the push goes the normal way on a fresh read;
 * - a record of a client that was offline is used to store the message, and the read of the record
 *   that follows every store (it finds a client that reconnected meanwhile) checks it: a user gone
 *   is answered 410, a client that came back (a new `connected_at`: it may have unregistered the
 *   channel in that session) has its record replaced by the new one (connected: the node checks
 *   the channel) or forgotten. So a channel its client unregistered is answered 201 once more at
 *   most, for the first push after the client's reconnection; and that first push goes through
 *   storage (stored, the node poked, read by the session at once, whatever its client holds
 *   unacked) rather than directly: milliseconds later, never after the client's acks.
 * Nothing is dropped on a cached record (a user, or a TTL 0 message).
 *
 * What a push to an offline client costs the store: the first (and the first after `ttlMs`) reads
 * the record and the channel, counts the subscription's stored messages, stores, and reads the
 * record again (five operations); every later one while the record is kept only counts, stores and
 * reads it again (three), whatever the backend; a channel not yet seen with the record costs one
 * read more, once. The lifetime runs from the read that cached
 * the record and is not renewed by the re-reads: a channel is only ever checked by a read, and a
 * session whose `node_id` was cleared while it still ran (its node unreachable from here) could
 * unregister a channel without changing `connected_at`, so a channel known here is trusted for
 * `ttlMs` at most.
 */
import { RecentMap } from "../platform/memo.ts"
import type { UserRecord } from "../domain/user.ts"

export interface RouterCacheOptions {
  /** How long a record is used (ms); 0 turns the cache off. */
  readonly ttlMs: number
  /** Records kept at most; the oldest go first. */
  readonly entries: number
}

export interface CachedRouter {
  readonly user: UserRecord
  /** Channels a read found the user to have since the record was cached. */
  readonly channels: Set<string>
}

export class RouterCache {
  private readonly records: RecentMap<CachedRouter & { readonly until: number }>
  private readonly options: RouterCacheOptions

  constructor(options: RouterCacheOptions) {
    this.options = options
    this.records = new RecentMap(Math.max(1, options.entries))
  }

  /** The record of `uaid` if it is fresh. */
  get(uaid: string, now: number): CachedRouter | undefined {
    const entry = this.records.get(uaid)
    if (entry === undefined) return undefined
    if (entry.until > now) return entry
    this.records.delete(uaid)
    return undefined
  }

  /** Keep a record just read from storage, with a channel just found, if it names a WebPush user. */
  remember(user: UserRecord, channelId: string, now: number): void {
    if (this.options.ttlMs <= 0) return
    this.records.delete(user.uaid)
    if (user.routerType !== "webpush" || user.currentMonth === undefined) return
    this.records.set(user.uaid, { user, channels: new Set([channelId]), until: now + this.options.ttlMs })
  }

  forget(uaid: string): void {
    this.records.delete(uaid)
  }

  get size(): number {
    return this.records.size
  }
}
