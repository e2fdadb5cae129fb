/**
 * `node bench/delivery-instructions.ts DUMP MAP [N]`: where a server's instructions went during one
 * level of `bench:delivery --counter instructions --profile 1`: DUMP is callgrind's dump of the
 * level (by instruction address), MAP V8's map of the code it made (`/tmp/perf-{pid}.map`, from
 * `--perf-basic-prof`). Prints the N (40) functions with the most instructions of their own, and
 * the same summed by package (`node_modules/<pkg>`, `src/<dir>`, Node's internals, V8's builtins,
 * native code, V8 compiling), as shares of the level's instructions. Exact counts, unlike a sampling profile's
 * (nothing is charged to a caller that inlined it, though: V8's optimized code holds its inlined
 * callees, charged to the function they were inlined into).
 */
import { readFileSync } from "node:fs"

/** Code V8 made: where each piece is, from its map (`/tmp/perf-{pid}.map`); the last entry at a start wins. */
const codeMap = (mapText: string): ((address: number) => string | undefined) => {
  const code = new Map<number, { readonly size: number; readonly name: string }>()
  for (const line of mapText.split("\n")) {
    const m = /^([0-9a-f]+) ([0-9a-f]+) (.*)$/.exec(line)
    if (m !== null) code.set(parseInt(m[1] as string, 16), { size: parseInt(m[2] as string, 16), name: m[3] as string })
  }
  const starts = Float64Array.from(code.keys()).sort()
  return (address) => {
    let lo = 0
    let hi = starts.length - 1
    while (lo <= hi) {
      const mid = (lo + hi) >> 1
      if ((starts[mid] as number) <= address) lo = mid + 1
      else hi = mid - 1
    }
    if (hi < 0) return undefined
    const start = starts[hi] as number
    const entry = code.get(start)
    return entry !== undefined && address < start + entry.size ? entry.name : undefined
  }
}

/**
 * V8's code with the work it asked of V8's own builtins and runtime that do not run JavaScript:
 * property access that its inline caches did not cover, objects defined through the runtime,
 * string and map operations — charged there, under the function that called them. Not allocation:
 * a collection starts in whichever allocation finds the space full.
 */
const LEAF_BUILTIN = /^Builtins_(\w*IC\w*|StringAdd\w*|StringEqual|StringCompare\w*|Find\w*HashMapEntry|CEntry\w*|RecordWrite\w*|NumberToString|ToString|Copy\w*|Clone\w*)$/

/**
 * V8 compiling: parsing, bytecode, its three compilers, deoptimizing. A cost of the process's first
 * minutes (the code of a request is compiled, then optimized, then stays), not of a notification.
 */
export const COMPILING = /^v8::internal::(?:(?:compiler|maglev|baseline|interpreter)::|(?:Parser|PreParser|ParserBase|Scanner|Zone|Scope|DeclarationScope|AstValueFactory|Compiler|Deoptimizer|Translated\w*|OptimizingCompileDispatcher|TurbofanCompilationJob|BytecodeGenerator)\b)/

export interface Costs {
  readonly total: number
  /** Instructions of each function's own code (V8's code named from its map, when given). */
  readonly self: ReadonlyMap<string, number>
  /** V8's code with the builtins it called (`LEAF_BUILTIN`). */
  readonly withBuiltins: ReadonlyMap<string, number>
}

/**
 * Callgrind's dump: `fn=` opens a function (names compressed as `(id) name`, then `(id)`), cost
 * lines are `position cost` (positions absolute `0x…`, relative `+n`/`-n`, `*` the same, or line
 * numbers), and a `calls=` line is followed by the call's inclusive cost, which is not the
 * function's own. Code without a symbol is V8's: named from `codeAt` (by instruction address, with
 * `--dump-instr=yes`), else one "(V8's code)".
 */
export const callgrindCosts = (dumpText: string, codeAt: (address: number) => string | undefined = () => undefined): Costs => {
  const names = new Map<string, string>()
  const nameOf = (value: string): string => {
    const m = /^\((\d+)\)(?: (.*))?$/.exec(value)
    if (m === null) return value
    if (m[2] !== undefined) names.set(m[1] as string, m[2])
    return names.get(m[1] as string) ?? value
  }
  const self = new Map<string, number>()
  const withBuiltins = new Map<string, number>()
  let total = 0
  let fn = "?"
  let callee = "?"
  let position = 0
  let skipNext = false
  for (const line of dumpText.split("\n")) {
    if (line.startsWith("fn=")) {
      fn = nameOf(line.slice(3))
      continue
    }
    if (line.startsWith("cfn=")) {
      callee = nameOf(line.slice(4))
      continue
    }
    if (line.startsWith("calls=")) {
      skipNext = true
      continue
    }
    if (/^(?:cfi|cob|cfl|fl|fi|fe|ob)=/.test(line)) {
      nameOf(line.slice(line.indexOf("=") + 1))
      continue
    }
    const m = /^(0x[0-9a-f]+|[+-]\d+|\*|\d+)\s+(\d+)/.exec(line)
    if (m === null) continue
    const at = m[1] as string
    position = at === "*" ? position : at.startsWith("0x") ? parseInt(at, 16) : at.startsWith("+") || at.startsWith("-") ? position + Number(at) : Number(at)
    const cost = Number(m[2])
    const jit = fn.startsWith("0x")
    const name = jit ? (codeAt(position) ?? "(V8's code)") : `${fn} (native)`
    if (skipNext) {
      skipNext = false
      if (jit && LEAF_BUILTIN.test(callee)) withBuiltins.set(name, (withBuiltins.get(name) ?? 0) + cost)
      continue
    }
    total += cost
    self.set(name, (self.get(name) ?? 0) + cost)
    if (jit) withBuiltins.set(name, (withBuiltins.get(name) ?? 0) + cost)
  }
  return { total, self, withBuiltins }
}

/** Instructions of V8 compiling (`COMPILING`) among `costs`. */
export const compiling = (costs: Costs): number => {
  let sum = 0
  for (const [name, cost] of costs.self) if (COMPILING.test(name)) sum += cost
  return sum
}

const root = new URL("../", import.meta.url).href
const packageOf = (name: string): string => {
  if (COMPILING.test(name)) return "(V8 compiling)"
  if (name.endsWith("(native)")) return "(native)"
  if (name.startsWith("Builtin:") || name.startsWith("BytecodeHandler:") || name.startsWith("Stub:")) return "(V8 builtins)"
  if (name.includes("node:")) return "node (internals)"
  const nm = name.lastIndexOf("/node_modules/")
  if (nm >= 0) {
    const rest = name.slice(nm + "/node_modules/".length).split("/")
    return rest[0]?.startsWith("@") ? `${rest[0]}/${rest[1]}` : (rest[0] ?? name)
  }
  const at = name.indexOf(root)
  if (at >= 0) {
    const parts = name.slice(at + root.length).split(":")[0]?.split("/") ?? []
    return parts.length > 2 ? `${parts[0]}/${parts[1]}` : parts.join("/")
  }
  return name.startsWith("JS:") ? "(other JS)" : "(other)"
}

if (import.meta.main) {
  const [dumpFile, mapFile, topArg] = process.argv.slice(2)
  if (dumpFile === undefined || mapFile === undefined) {
    console.error("usage: node bench/delivery-instructions.ts DUMP MAP [N]")
    process.exit(2)
  }
  const top = Number(topArg ?? 40)
  const { total, self, withBuiltins } = callgrindCosts(readFileSync(dumpFile, "utf8"), codeMap(readFileSync(mapFile, "utf8")))
  const byPackage = new Map<string, number>()
  for (const [name, cost] of self) byPackage.set(packageOf(name), (byPackage.get(packageOf(name)) ?? 0) + cost)
  const share = (n: number) => `${(n / total * 100).toFixed(2).padStart(6)} %`
  const short = (name: string) => name.replace(root, "").replace(/file:\/\/\S*\/node_modules\//, "")
  const sorted = (m: ReadonlyMap<string, number>) => [...m].sort((a, b) => b[1] - a[1]).slice(0, top)
  console.log(`${total} instructions`)
  console.log("by package:")
  for (const [name, cost] of [...byPackage].sort((a, b) => b[1] - a[1])) console.log(`  ${share(cost)}  ${name}`)
  console.log(`top ${top} functions (own instructions, inlined callees included):`)
  for (const [name, cost] of sorted(self)) console.log(`  ${share(cost)}  ${short(name)}`)
  console.log(`top ${top} of V8's code with the builtins it called (property access, runtime calls, strings, maps):`)
  for (const [name, cost] of sorted(withBuiltins)) console.log(`  ${share(cost)}  ${short(name)}`)
}
