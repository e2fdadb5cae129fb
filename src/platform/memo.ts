/**
 * A map that keeps the last `capacity` keys set (the oldest forgotten first), and `memoize` over it:
 * the one bounded map of the project (caches, the message trace's window, open spans). Keys are kept
 * in order as a ring: cheaper than a Map's first key after many deletions.
 */
export class RecentMap<V> {
  private readonly entries = new Map<string, V>()
  private readonly order: Array<string | undefined> = []
  private next = 0
  private readonly capacity: number

  constructor(capacity: number) {
    this.capacity = capacity
  }

  get(key: string): V | undefined {
    return this.entries.get(key)
  }

  /**
   * Forget `key` now. Its slot in the ring stays until it comes round: a key deleted and set again
   * may then be forgotten before `capacity` newer keys were set (for caches, one more miss).
   */
  delete(key: string): void {
    this.entries.delete(key)
  }

  get size(): number {
    return this.entries.size
  }

  /** Key and value of every entry, oldest first by when it was last set. */
  [Symbol.iterator](): IterableIterator<[string, V]> {
    return this.entries[Symbol.iterator]()
  }

  set(key: string, value: V): void {
    if (!this.entries.has(key)) {
      const oldest = this.order[this.next]
      if (oldest !== undefined) this.entries.delete(oldest)
      this.order[this.next] = key
      this.next = (this.next + 1) % this.capacity
    }
    this.entries.set(key, value)
  }
}

/**
 * `compute` remembering its results for the last `size` keys it was asked about, for work that
 * costs more than a map lookup and always gives the same answer for a key. Only results `keep`
 * accepts are remembered (a caller can leave failures out, so that garbage keys cannot push out the
 * useful ones).
 */
export const memoize = <A>(size: number, compute: (key: string) => A, keep: (value: A) => boolean = () => true): ((key: string) => A) => {
  const cache = new RecentMap<A>(size)
  return (key) => {
    const hit = cache.get(key)
    if (hit !== undefined) return hit
    const value = compute(key)
    if (keep(value)) cache.set(key, value)
    return value
  }
}
