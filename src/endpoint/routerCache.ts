/**
 * Router records of connected users, kept for a while so that a push to a connected client costs
 * one storage read (its channel) instead of two. A record from here is only ever used to try a
 * direct delivery: when the node it names does not take the message (the client moved, left, or
 * the user was reset), the record is forgotten and the push goes the normal way on a fresh read.
 * Nothing destructive (dropping a user, storing a message) is decided on a cached record.
 */
import type { UserRecord } from "../domain/user.ts"

export interface RouterCacheOptions {
  /** How long a record is used (ms); 0 turns the cache off. */
  readonly ttlMs: number
  /** Records kept at most; the oldest go first. */
  readonly entries: number
}

export class RouterCache {
  private readonly records = new Map<string, { readonly user: UserRecord; readonly until: number }>()
  private readonly options: RouterCacheOptions

  constructor(options: RouterCacheOptions) {
    this.options = options
  }

  /** The record of `uaid` if it is fresh. */
  get(uaid: string, now: number): UserRecord | undefined {
    const entry = this.records.get(uaid)
    if (entry === undefined) return undefined
    if (entry.until > now) return entry.user
    this.records.delete(uaid)
    return undefined
  }

  /** Keep a record just read from storage, if it names a connected WebPush client. */
  remember(user: UserRecord, now: number): void {
    if (this.options.ttlMs <= 0) return
    this.records.delete(user.uaid)
    if (user.routerType !== "webpush" || user.nodeId === undefined || user.currentMonth === undefined) return
    if (this.records.size >= this.options.entries) {
      const oldest = this.records.keys().next()
      if (oldest.done !== true) this.records.delete(oldest.value)
    }
    this.records.set(user.uaid, { user, until: now + this.options.ttlMs })
  }

  forget(uaid: string): void {
    this.records.delete(uaid)
  }

  get size(): number {
    return this.records.size
  }
}
