/**
 * `compute` remembering its results for the last `size` keys it was asked about (oldest forgotten
 * first), for work that costs more than a map lookup and always gives the same answer for a key.
 * Only results `keep` accepts are remembered (a caller can leave failures out, so that garbage keys
 * cannot push out the useful ones).
 */
export const memoize = <A>(size: number, compute: (key: string) => A, keep: (value: A) => boolean = () => true): ((key: string) => A) => {
  const cache = new Map<string, A>()
  // Keys in order, as a ring (cheaper than a Map's first key after many deletions).
  const order: Array<string | undefined> = []
  let next = 0
  return (key) => {
    const hit = cache.get(key)
    if (hit !== undefined) return hit
    const value = compute(key)
    if (!keep(value)) return value
    const oldest = order[next]
    if (oldest !== undefined) cache.delete(oldest)
    order[next] = key
    next = (next + 1) % size
    cache.set(key, value)
    return value
  }
}
