/**
 * Router records of connected users and the channels a storage read found them to have, kept for a
 * while so that a push to a connected client reads storage no more than once per channel per
 * `ttlMs`. A record from here is only ever used to try a direct delivery, and the node checks what
 * the cache cannot: it takes the message only for the session the record names (`connected_at`)
 * and only if that session has not unregistered the channel. When the node does not take it (the
 * client moved, left, reconnected, unregistered, or the user was reset) the record is forgotten and
 * the push goes the normal way on a fresh read. Nothing destructive (dropping a user, storing a
 * message) is decided on a cached record.
 */
import { RecentMap } from "../domain/memo.ts"
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

  /** Keep a record just read from storage, with a channel just found, if it names a connected WebPush client. */
  remember(user: UserRecord, channelId: string, now: number): void {
    if (this.options.ttlMs <= 0) return
    this.records.delete(user.uaid)
    if (user.routerType !== "webpush" || user.nodeId === undefined || user.currentMonth === undefined) return
    this.records.set(user.uaid, { user, channels: new Set([channelId]), until: now + this.options.ttlMs })
  }

  forget(uaid: string): void {
    this.records.delete(uaid)
  }

  get size(): number {
    return this.records.size
  }
}
