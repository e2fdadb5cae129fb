/**
 * A map from string keys kept as a value, for what a session tracks per message (its unacked
 * messages, the newest message of each topic): `set` and `delete` return a new ledger and leave
 * this one as it was, so a phase stays a value and `step` stays a function of its arguments — yet
 * an update costs O(1), where copying a Map costs what the session holds (a client that never acks
 * made every later push dearer).
 *
 * How: the ledgers made from one another share one Map. It holds the contents of the one read last
 * (the root); every other ledger is a change away from the next one towards the root. Reading an
 * older ledger turns the Map back to it, one change at a time, and the ledgers on the way point the
 * other way (rerooting). A session only ever reads its newest ledger: nothing is turned back. A test
 * that steps an old phase again pays for the changes in between, and sees that phase as it was.
 * Iteration follows first insertion (each entry keeps its number), whatever was turned back.
 */

interface Entry<V> {
  readonly value: V
  /** Order of first insertion. */
  readonly seq: number
}

/** The ledger whose contents the Map holds. */
interface Root<V> {
  readonly map: Map<string, Entry<V>>
}

/** One change away from `next`: `key` holds `entry` here (undefined: absent). */
interface Change<V> {
  readonly key: string
  readonly entry: Entry<V> | undefined
  readonly next: Ledger<V>
}

const isRoot = <V>(node: Root<V> | Change<V>): node is Root<V> => "map" in node

export class Ledger<V> {
  readonly size: number
  /** How many entries `counts` counts (e.g. stored messages among the unacked ones). */
  readonly counted: number
  private readonly counts: (value: V) => boolean
  /** The next entry's insertion number. */
  private readonly seq: number
  private node: Root<V> | Change<V>

  private constructor(size: number, counted: number, seq: number, counts: (value: V) => boolean, node: Root<V> | Change<V>) {
    this.size = size
    this.counted = counted
    this.seq = seq
    this.counts = counts
    this.node = node
  }

  /** An empty ledger; `counts` picks the entries `counted` counts. */
  static empty<V>(counts: (value: V) => boolean = () => false): Ledger<V> {
    return new Ledger<V>(0, 0, 0, counts, { map: new Map() })
  }

  /** A ledger of `entries`, in order. */
  static of<V>(entries: Iterable<readonly [string, V]>, counts?: (value: V) => boolean): Ledger<V> {
    let ledger = Ledger.empty(counts)
    for (const [key, value] of entries) ledger = ledger.set(key, value)
    return ledger
  }

  get(key: string): V | undefined {
    return this.root().get(key)?.value
  }

  has(key: string): boolean {
    return this.root().has(key)
  }

  /** This ledger with `key` holding `value` (where `key` was, if it was there already). */
  set(key: string, value: V): Ledger<V> {
    // An empty ledger may be shared by unrelated owners (every session starts from one): each gets a Map of its own.
    const map = this.size === 0 ? new Map<string, Entry<V>>() : this.root()
    const before = map.get(key)
    map.set(key, { value, seq: before?.seq ?? this.seq })
    const counted = this.counted - (before !== undefined && this.counts(before.value) ? 1 : 0) + (this.counts(value) ? 1 : 0)
    const next = new Ledger(this.size + (before === undefined ? 1 : 0), counted, this.seq + 1, this.counts, { map })
    if (this.size > 0) this.node = { key, entry: before, next }
    return next
  }

  /** This ledger without `key` (itself when `key` is not there). */
  delete(key: string): Ledger<V> {
    const map = this.root()
    const before = map.get(key)
    if (before === undefined) return this
    map.delete(key)
    const next = new Ledger(this.size - 1, this.counted - (this.counts(before.value) ? 1 : 0), this.seq, this.counts, { map })
    this.node = { key, entry: before, next }
    return next
  }

  /** The values, in order of first insertion. */
  values(): ReadonlyArray<V> {
    const entries = Array.from(this.root().values())
    entries.sort((a, b) => a.seq - b.seq)
    return entries.map((entry) => entry.value)
  }

  /** The Map as of this ledger: turned back along the changes that lead from the root to it. */
  private root(): Map<string, Entry<V>> {
    const node = this.node
    if (isRoot(node)) return node.map
    const path: Array<Ledger<V>> = []
    let at: Ledger<V> = this
    for (let n = at.node; !isRoot(n); n = at.node) {
      path.push(at)
      at = n.next
    }
    const { map } = at.node as Root<V>
    for (let i = path.length - 1; i >= 0; i--) {
      const ledger = path[i] as Ledger<V>
      const change = ledger.node as Change<V>
      const current = map.get(change.key)
      if (change.entry === undefined) map.delete(change.key)
      else map.set(change.key, change.entry)
      change.next.node = { key: change.key, entry: current, next: ledger }
      ledger.node = { map }
    }
    return map
  }
}
