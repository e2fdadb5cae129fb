/**
 * `node bench/memory-snapshots.ts A.heapsnapshot B.heapsnapshot [connectionsA connectionsB]`: what
 * the connections added between two heap snapshots (from `bench/memory-idle.ts`, MEMORY_SNAPSHOTS)
 * hold, per connection: self sizes grouped by constructor (or node type), B less A, and the average
 * retained size (dominator tree) of the per-connection objects named in MEMORY_CLASSES.
 * The connection counts default to the numbers in the file names.
 */
import { readFileSync } from "node:fs"

interface Snapshot {
  readonly nodeTypes: ReadonlyArray<string>
  readonly edgeTypes: ReadonlyArray<string>
  readonly nodeFields: number
  readonly edgeFields: number
  readonly nodes: Uint32Array
  readonly edges: Uint32Array
  readonly strings: ReadonlyArray<string>
  readonly nodeCount: number
  /** First edge index of each node. */
  readonly firstEdge: Uint32Array
}

const load = (path: string): Snapshot => {
  const raw = JSON.parse(readFileSync(path, "utf8")) as {
    snapshot: { meta: { node_fields: Array<string>; node_types: [Array<string>]; edge_fields: Array<string>; edge_types: [Array<string>] } }
    nodes: Array<number>
    edges: Array<number>
    strings: Array<string>
  }
  const meta = raw.snapshot.meta
  const nodeFields = meta.node_fields.length
  const edgeFields = meta.edge_fields.length
  const nodes = Uint32Array.from(raw.nodes)
  const edges = Uint32Array.from(raw.edges)
  const nodeCount = nodes.length / nodeFields
  const firstEdge = new Uint32Array(nodeCount + 1)
  const edgeCountField = meta.node_fields.indexOf("edge_count")
  for (let i = 0, e = 0; i < nodeCount; i++) {
    firstEdge[i] = e
    e += nodes[i * nodeFields + edgeCountField]! * edgeFields
  }
  firstEdge[nodeCount] = edges.length
  return { nodeTypes: meta.node_types[0], edgeTypes: meta.edge_types[0], nodeFields, edgeFields, nodes, edges, strings: raw.strings, nodeCount, firstEdge }
}

// node fields: type, name, id, self_size, edge_count, trace_node_id, detachedness; edge: type, name_or_index, to_node
const typeOf = (s: Snapshot, i: number) => s.nodeTypes[s.nodes[i * s.nodeFields]!]!
const nameOf = (s: Snapshot, i: number) => s.strings[s.nodes[i * s.nodeFields + 1]!]!
const selfOf = (s: Snapshot, i: number) => s.nodes[i * s.nodeFields + 3]!

const groupOf = (s: Snapshot, i: number): string => {
  const type = typeOf(s, i)
  const name = nameOf(s, i)
  switch (type) {
    case "object":
    case "native":
      return name
    case "closure":
      return `closure ${name || "(anonymous)"}`
    case "string":
    case "concatenated string":
    case "sliced string":
      return "(string)"
    default:
      return `(${type}) ${type === "hidden" || type === "code" || type === "array" || type === "object shape" ? name.slice(0, 40) : ""}`
  }
}

const groups = (s: Snapshot) => {
  const out = new Map<string, { size: number; count: number }>()
  for (let i = 0; i < s.nodeCount; i++) {
    const g = groupOf(s, i)
    const entry = out.get(g) ?? { size: 0, count: 0 }
    entry.size += selfOf(s, i)
    entry.count++
    out.set(g, entry)
  }
  return out
}

/** Immediate dominators (Cooper, Harvey, Kennedy), from node 0 (the root), weak edges left out. */
const dominators = (s: Snapshot): { idom: Int32Array; retained: Float64Array; post: ReadonlyArray<number> } => {
  const n = s.nodeCount
  const weak = s.edgeTypes.indexOf("weak")
  const shortcut = s.edgeTypes.indexOf("shortcut")
  const order = new Int32Array(n).fill(-1)
  const post: Array<number> = []
  // Iterative DFS for a postorder.
  const stack: Array<number> = [0]
  const cursor = new Uint32Array(n)
  const visited = new Uint8Array(n)
  visited[0] = 1
  for (let i = 0; i < n; i++) cursor[i] = s.firstEdge[i]!
  while (stack.length > 0) {
    const v = stack[stack.length - 1]!
    let pushed = false
    while (cursor[v]! < s.firstEdge[v + 1]!) {
      const e = cursor[v]!
      cursor[v] = e + s.edgeFields
      const type = s.edges[e]!
      if (type === weak || type === shortcut) continue
      const w = s.edges[e + 2]! / s.nodeFields
      if (visited[w] === 0) {
        visited[w] = 1
        stack.push(w)
        pushed = true
        break
      }
    }
    if (!pushed) {
      stack.pop()
      order[v] = post.length
      post.push(v)
    }
  }
  // Predecessors.
  const predCount = new Uint32Array(n + 1)
  for (let v = 0; v < n; v++) {
    if (visited[v] === 0) continue
    for (let e = s.firstEdge[v]!; e < s.firstEdge[v + 1]!; e += s.edgeFields) {
      const type = s.edges[e]!
      if (type === weak || type === shortcut) continue
      predCount[s.edges[e + 2]! / s.nodeFields + 1]!++
    }
  }
  for (let i = 0; i < n; i++) predCount[i + 1]! += predCount[i]!
  const preds = new Int32Array(predCount[n]!)
  const fill = predCount.slice()
  for (let v = 0; v < n; v++) {
    if (visited[v] === 0) continue
    for (let e = s.firstEdge[v]!; e < s.firstEdge[v + 1]!; e += s.edgeFields) {
      const type = s.edges[e]!
      if (type === weak || type === shortcut) continue
      const w = s.edges[e + 2]! / s.nodeFields
      preds[fill[w]!++] = v
    }
  }
  const idom = new Int32Array(n).fill(-1)
  idom[0] = 0
  const intersect = (a: number, b: number) => {
    while (a !== b) {
      while (order[a]! < order[b]!) a = idom[a]!
      while (order[b]! < order[a]!) b = idom[b]!
    }
    return a
  }
  let changed = true
  while (changed) {
    changed = false
    for (let k = post.length - 2; k >= 0; k--) {
      const v = post[k]!
      let dom = -1
      for (let p = predCount[v]!; p < predCount[v + 1]!; p++) {
        const u = preds[p]!
        if (idom[u] === -1) continue
        dom = dom === -1 ? u : intersect(u, dom)
      }
      if (dom !== -1 && idom[v] !== dom) {
        idom[v] = dom
        changed = true
      }
    }
  }
  const retained = new Float64Array(n)
  for (const v of post) retained[v]! += selfOf(s, v)
  for (const v of post) if (v !== 0 && idom[v]! >= 0) retained[idom[v]!]! += retained[v]!
  return { idom, retained, post }
}

/**
 * Self sizes by the nearest dominating object of an `owners` class (and the object's group): what
 * each per-connection object holds alone; `(shared) X`: held by no such object, under group X.
 */
const byOwner = (s: Snapshot, owners: ReadonlySet<string>) => {
  const { idom, post } = dominators(s)
  const owner: Array<string> = new Array(s.nodeCount)
  owner[0] = "(root)"
  const out = new Map<string, number>()
  for (let k = post.length - 1; k >= 0; k--) {
    const v = post[k]!
    if (v === 0) continue
    const d = idom[v]!
    const name = nameOf(s, v)
    const mine = owners.has(name) && (typeOf(s, v) === "object" || typeOf(s, v) === "native")
    owner[v] = mine ? name : owner[d] === "(root)" || owner[d] === undefined ? `(shared) ${groupOf(s, v)}` : owner[d]!
    const key = `${owner[v]} :: ${groupOf(s, v)}`
    out.set(key, (out.get(key) ?? 0) + selfOf(s, v))
  }
  return out
}

const [pathA, pathB] = [process.argv[2]!, process.argv[3]!]
const countIn = (path: string) => Number(/(\d+)\.heapsnapshot$/.exec(path)?.[1] ?? NaN)
const connA = Number(process.argv[4] ?? countIn(pathA))
const connB = Number(process.argv[5] ?? countIn(pathB))
const added = connB - connA
const a = load(pathA)
const ga = groups(a)
const b = load(pathB)
const gb = groups(b)
const rows = [...new Set([...ga.keys(), ...gb.keys()])].map((g) => {
  const x = ga.get(g) ?? { size: 0, count: 0 }
  const y = gb.get(g) ?? { size: 0, count: 0 }
  return { g, size: (y.size - x.size) / added, count: (y.count - x.count) / added }
}).sort((p, q) => q.size - p.size)
const total = rows.reduce((sum, r) => sum + r.size, 0)
console.log(`${added} connections added: ${total.toFixed(0)} bytes of self size each`)
console.log(`${"bytes".padStart(8)} ${"objects".padStart(8)}  group`)
for (const r of rows.filter((r) => Math.abs(r.size) >= 4)) console.log(`${r.size.toFixed(0).padStart(8)} ${r.count.toFixed(2).padStart(8)}  ${r.g}`)

const owners = new Set((process.env["MEMORY_OWNERS"] ?? "PushSocket,SessionRunner,SessionHandle,Mailbox,FiberImpl,Socket").split(","))
const oa = byOwner(a, owners)
const ob = byOwner(b, owners)
const ownerRows = [...new Set([...oa.keys(), ...ob.keys()])]
  .map((k) => ({ k, size: ((ob.get(k) ?? 0) - (oa.get(k) ?? 0)) / added }))
  .sort((p, q) => q.size - p.size)
const perOwner = new Map<string, number>()
for (const r of ownerRows) perOwner.set(r.k.split(" :: ")[0]!, (perOwner.get(r.k.split(" :: ")[0]!) ?? 0) + r.size)
console.log(`\nby dominating owner, per connection`)
for (const [o, size] of [...perOwner].sort((p, q) => q[1] - p[1]).filter(([, size]) => Math.abs(size) >= 4)) console.log(`${size.toFixed(0).padStart(8)}  ${o}`)
console.log(`\nby owner and group, per connection`)
for (const r of ownerRows.filter((r) => Math.abs(r.size) >= 4)) console.log(`${r.size.toFixed(0).padStart(8)}  ${r.k}`)

const classes = (process.env["MEMORY_CLASSES"] ?? "PushSocket,SessionRunner,SessionHandle,Mailbox,Socket,FiberImpl,Receiver,Sender,TCP").split(",")
const { retained } = dominators(b)
console.log(`\naverage retained size (in ${pathB})`)
for (const c of classes) {
  let count = 0
  let sum = 0
  for (let i = 0; i < b.nodeCount; i++) {
    if (nameOf(b, i) !== c || (typeOf(b, i) !== "object" && typeOf(b, i) !== "native")) continue
    count++
    sum += retained[i]!
  }
  if (count > 0) console.log(`${c.padEnd(16)} ${String(count).padStart(7)} × ${(sum / count).toFixed(0)} bytes`)
}

/** MEMORY_TREE=Class: the dominator subtree of one instance of Class in B, with the edges that hold each object. */
const tree = process.env["MEMORY_TREE"]
if (tree !== undefined) {
  const { idom } = dominators(b)
  const children = new Map<number, Array<number>>()
  for (let v = 1; v < b.nodeCount; v++) {
    const d = idom[v]!
    if (d < 0) continue
    let list = children.get(d)
    if (list === undefined) children.set(d, list = [])
    list.push(v)
  }
  const edgeName = (from: number, to: number) => {
    for (let e = b.firstEdge[from]!; e < b.firstEdge[from + 1]!; e += b.edgeFields) {
      if (b.edges[e + 2]! / b.nodeFields !== to) continue
      const type = b.edgeTypes[b.edges[e]!]!
      const nameOrIndex = b.edges[e + 1]!
      return type === "element" || type === "hidden" ? `[${nameOrIndex}]` : b.strings[nameOrIndex]!
    }
    return "?"
  }
  const start = Number(process.env["MEMORY_TREE_INDEX"] ?? 100)
  let seen = 0
  let root = -1
  for (let i = 0; i < b.nodeCount; i++) if (nameOf(b, i) === tree && typeOf(b, i) === "object" && seen++ === start) root = i
  const show = (v: number, depth: number, via: string) => {
    const label = typeOf(b, v) === "string" ? JSON.stringify(nameOf(b, v).slice(0, 40)) : groupOf(b, v)
    console.log(`${"  ".repeat(depth)}${via} → ${label} self ${selfOf(b, v)} retained ${retained[v]}`)
    for (const c of (children.get(v) ?? []).sort((p, q) => retained[q]! - retained[p]!)) show(c, depth + 1, edgeName(v, c))
  }
  if (root >= 0) show(root, 0, tree)
}
