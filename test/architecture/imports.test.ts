/**
 * The rooms of `src/` stay without cycles. Every folder of `src/` is a room with one job, and the
 * rooms are in an order, lowest first (`ROOMS`): a room imports only from itself and from rooms
 * below it, never from one above. Every relative specifier of every module counts — static imports
 * (type-only ones too), re-exports (`export … from`) and dynamic `import("…")` — so that:
 *
 * - no file imports itself through others (no cycle of files);
 * - no room imports itself through others (no cycle of rooms);
 * - no import goes up the order; a folder of `src/` missing from `ROOMS` fails, so a new room must
 *   be given its place.
 *
 * Specifiers are read by a small scanner that skips comments, strings, template literals and
 * regular expressions, so that text about imports is not taken for one.
 */
import { existsSync, readdirSync, readFileSync } from "node:fs"
import { dirname, join, relative, resolve, sep } from "node:path"
import { assert, describe, it } from "@effect/vitest"

/** The rooms, lowest first: a room may import only from the rooms before it in this list. */
const ROOMS = [
  "types", //          declarations of untyped packages (ambient, imported by no one)
  "domain", //         ids, notification, router record, receipts, API errors, events, the router-port codec
  "platform", //       Node plumbing: listening, raw HTTP answers, socket bounds, addresses, private files, bounded maps, start-up failures, exit codes
  "crypto", //         Fernet keys, endpoint tokens, message ids, bridge secrets
  "storage", //        the Storage service: its core, and one sub-room per backend (`STORAGE_BACKENDS`)
  "observability", //  metrics, logging, tracing, the event log and its projections
  "protocol", //       the connection state machine and the session fiber
  "receipts", //       push receipts: the book and the recorder
  "routers", //        where an accepted message goes: a connection node, or storage
  "bridges", //        FCM, APNs, ADM
  "broadcast", //      the broadcast set a connection node serves
  "connection", //     the connection node: ws server, sessions, router port
  "console", //        the web console, mounted by the endpoint
  "gateway", //        the Matrix push gateway, mounted by the endpoint (its messages go through the endpoint's push path)
  "endpoint", //       the endpoint node's public HTTP API
  "config", //         the option table and loading, read by the tools and the entrypoints only
  "workers", //        a node as several processes sharing its public ports: the supervisor and what a worker is told
  "tools", //          operator tools
  "client", //         the command-line push client
  "bin" //             entrypoints
] as const

/**
 * The backends of `src/storage/`, each a sub-room beside the core (the files directly in
 * `src/storage/`: the contract, the row model, tables, deadlines, the export format). The core
 * imports no backend; a backend imports the core and the sub-rooms listed here for it, never
 * another sibling — so a backend is changed or added without reading the others.
 */
const STORAGE_BACKENDS: Readonly<Record<string, ReadonlyArray<string>>> = {
  memory: [],
  sql: [], //          the SQL stores' operations, written once for both dialects
  sqlite: ["sql"],
  postgres: ["sql"],
  dynamo: [],
  dynalite: ["dynamo"] // a DynamoDB-API server on LevelDB, served to through the DynamoDB backend
}

const SRC = resolve(import.meta.dirname, "../../src")

/** Every module of `src/`: TypeScript (declarations included) and the console's plain JavaScript. */
const modules = (dir: string): ReadonlyArray<string> =>
  readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const path = join(dir, entry.name)
    if (entry.isDirectory()) return modules(path)
    return /\.(ts|js)$/.test(entry.name) ? [path] : []
  })

const KEYWORDS_BEFORE_EXPRESSION = new Set(["return", "typeof", "case", "do", "else", "in", "of", "new", "delete", "void", "throw", "instanceof", "yield", "await"])

/**
 * The source with comments, regular expressions and template literals blanked, and each plain
 * string literal replaced by `"#n"`, `n` its index in `literals`: what the import patterns run on.
 */
const skeleton = (source: string): { readonly code: string; readonly literals: ReadonlyArray<string> } => {
  const literals: Array<string> = []
  let code = ""
  let i = 0
  /** Open `${` of template literals being scanned, and the brace depth inside each. */
  const templates: Array<number> = []
  let depth = 0
  const previousSignificant = (): string => {
    const trimmed = code.trimEnd()
    const word = /[A-Za-z_$][\w$]*$/.exec(trimmed)?.[0]
    if (word !== undefined) return KEYWORDS_BEFORE_EXPRESSION.has(word) ? "(" : "a"
    return trimmed.at(-1) ?? "("
  }
  /** Scans a template literal's text from `i` (after a backtick or a `}`) up to its end or its next `${`. */
  const templateText = (): void => {
    while (i < source.length) {
      const c = source[i]
      if (c === "\\") {
        i += 2
      } else if (c === "`") {
        i++
        code += "`"
        return
      } else if (c === "$" && source[i + 1] === "{") {
        i += 2
        code += "${"
        templates.push(depth)
        depth = 0
        return
      } else {
        i++
      }
    }
  }
  while (i < source.length) {
    const c = source[i] as string
    const next = source[i + 1]
    if (c === "/" && next === "/") {
      while (i < source.length && source[i] !== "\n") i++
    } else if (c === "/" && next === "*") {
      const end = source.indexOf("*/", i + 2)
      i = end < 0 ? source.length : end + 2
      code += " "
    } else if (c === "\"" || c === "'") {
      let value = ""
      i++
      while (i < source.length && source[i] !== c && source[i] !== "\n") {
        if (source[i] === "\\") i++
        value += source[i] ?? ""
        i++
      }
      i++
      code += `"#${literals.length}"`
      literals.push(value)
    } else if (c === "`") {
      i++
      code += "`"
      templateText()
    } else if (c === "/" && /[(,=:[!&|?{};+\-*%<>~^]/.test(previousSignificant())) {
      // A regular expression: up to its closing `/` outside a character class, then its flags.
      let inClass = false
      i++
      while (i < source.length && (inClass || source[i] !== "/") && source[i] !== "\n") {
        if (source[i] === "\\") i++
        else if (source[i] === "[") inClass = true
        else if (source[i] === "]") inClass = false
        i++
      }
      i++
      while (i < source.length && /[a-z]/i.test(source[i] as string)) i++
      code += "/re/"
    } else if (c === "{") {
      depth++
      code += c
      i++
    } else if (c === "}" && depth === 0 && templates.length > 0) {
      // The end of a template literal's `${…}`: its text goes on.
      depth = templates.pop() as number
      i++
      code += "}"
      templateText()
    } else {
      if (c === "}") depth--
      code += c
      i++
    }
  }
  return { code, literals }
}

/** The specifiers a module names: `import … from`, `import "…"`, `export … from`, `import("…")`. */
const specifiersOf = (source: string): ReadonlyArray<string> => {
  const { code, literals } = skeleton(source)
  const found = new Set<string>()
  const patterns = [
    /^[ \t]*(?:import|export)\b[^"`]*?\bfrom\s*"#(\d+)"/gm,
    /^[ \t]*import\s*"#(\d+)"/gm,
    /\bimport\s*\(\s*"#(\d+)"\s*[,)]/g
  ]
  for (const pattern of patterns) {
    for (const match of code.matchAll(pattern)) found.add(literals[Number(match[1])] as string)
  }
  return [...found]
}

interface Import {
  readonly from: string
  readonly to: string
  readonly specifier: string
}

const show = (path: string): string => `src/${relative(SRC, path).split(sep).join("/")}`

const roomOf = (path: string): string => {
  const parts = relative(SRC, path).split(sep)
  return parts.length > 1 ? parts[0] as string : "(src itself)"
}

const files = modules(SRC)
const imports: ReadonlyArray<Import> = files.flatMap((from) =>
  specifiersOf(readFileSync(from, "utf8"))
    .filter((specifier) => specifier.startsWith("."))
    .map((specifier) => ({ from, to: resolve(dirname(from), specifier), specifier }))
    // What lies outside src/ (the npm bin/ scripts) is in no room.
    .filter(({ to }) => !relative(SRC, to).startsWith(".."))
)

/** A cycle through `start` in `edges`, as the nodes met (`start` first), or undefined when there is none. */
const cycleThrough = (start: string, edges: ReadonlyMap<string, ReadonlySet<string>>): ReadonlyArray<string> | undefined => {
  const seen = new Set<string>()
  const path: Array<string> = []
  const visit = (node: string): boolean => {
    for (const next of edges.get(node) ?? []) {
      if (next === start) return true
      if (seen.has(next)) continue
      seen.add(next)
      path.push(next)
      if (visit(next)) return true
      path.pop()
    }
    return false
  }
  return visit(start) ? [start, ...path] : undefined
}

/** Every distinct cycle of `edges`, one per set of nodes, each as `a → b → … → a`. */
const cyclesOf = (edges: ReadonlyMap<string, ReadonlySet<string>>): ReadonlyArray<string> => {
  const reported = new Set<string>()
  const cycles: Array<string> = []
  for (const node of [...edges.keys()].sort()) {
    const cycle = cycleThrough(node, edges)
    if (cycle === undefined) continue
    const key = [...cycle].sort().join("\n")
    if (reported.has(key)) continue
    reported.add(key)
    cycles.push([...cycle, node].join(" → "))
  }
  return cycles
}

const graphOf = (pairs: ReadonlyArray<readonly [string, string]>): ReadonlyMap<string, ReadonlySet<string>> => {
  const edges = new Map<string, Set<string>>()
  for (const [from, to] of pairs) {
    const targets = edges.get(from) ?? new Set<string>()
    targets.add(to)
    edges.set(from, targets)
  }
  return edges
}

describe("imports of src/", () => {
  it("are read: static, type-only, re-exports and dynamic, not text in comments or strings", () => {
    const source = [
      "import * as A from \"./a.ts\"",
      "import type { B } from \"../b.ts\"",
      "import {",
      "  c,",
      "  type C",
      "} from \"./c.ts\"",
      "import \"./d.ts\"",
      "export { e } from \"./e.ts\"",
      "export type * from \"./f.ts\"",
      "const g = await import(\"./g.ts\")",
      "// import { h } from \"./h.ts\"",
      "/** import(\"./i.ts\") */",
      "const j = \"import k from './k.ts'\"",
      "const l = /[\"']import(\"\\.\\/l\")/g",
      "const m = `${import(\"./m.ts\")} import(\"./n.ts\")`",
      "const o = x / 2 // import(\"./o.ts\")"
    ].join("\n")
    assert.deepStrictEqual(
      [...specifiersOf(source)].sort(),
      ["../b.ts", "./a.ts", "./c.ts", "./d.ts", "./e.ts", "./f.ts", "./g.ts", "./m.ts"]
    )
  })

  it("name files that exist", () => {
    const known = new Set(files)
    const missing = imports.filter(({ to }) => !known.has(to) && !existsSync(to))
    assert.deepStrictEqual(missing.map(({ from, specifier }) => `${show(from)} imports ${specifier}`), [])
  })

  it("make no cycle of files", () => {
    const cycles = cyclesOf(graphOf(imports.map(({ from, to }) => [show(from), show(to)])))
    assert.deepStrictEqual(cycles, [], `files that import themselves through others:\n${cycles.join("\n")}`)
  })

  it("make no cycle of rooms", () => {
    const between = imports.filter(({ from, to }) => roomOf(from) !== roomOf(to))
    const cycles = cyclesOf(graphOf(between.map(({ from, to }) => [roomOf(from), roomOf(to)])))
    const witnesses = (cycle: string): ReadonlyArray<string> => {
      const rooms = cycle.split(" → ")
      return rooms.slice(1).map((to, k) => {
        const from = rooms[k] as string
        const one = between.find((i) => roomOf(i.from) === from && roomOf(i.to) === to) as Import
        return `  ${show(one.from)} imports ${one.specifier}`
      })
    }
    assert.deepStrictEqual(
      cycles,
      [],
      `rooms that import themselves through others:\n${cycles.map((c) => `${c}\n${witnesses(c).join("\n")}`).join("\n")}`
    )
  })

  it("every room of src/ has its place in the order", () => {
    const rooms = readdirSync(SRC, { withFileTypes: true }).filter((entry) => entry.isDirectory()).map((entry) => entry.name)
    const listed: ReadonlySet<string> = new Set(ROOMS)
    const unplaced = rooms.filter((room) => !listed.has(room))
    assert.deepStrictEqual(unplaced, [], "rooms missing from ROOMS (test/architecture/imports.test.ts): give each its place")
    const gone = ROOMS.filter((room) => !rooms.includes(room))
    assert.deepStrictEqual(gone, [], "rooms in ROOMS that src/ no longer has: remove them")
    const loose = files.filter((path) => roomOf(path) === "(src itself)").map(show)
    assert.deepStrictEqual(loose, [], "modules directly in src/, in no room: move each into its room")
  })

  it("go only down the order of rooms", () => {
    const rank = (room: string): number => (ROOMS as ReadonlyArray<string>).indexOf(room)
    const upward = imports
      .filter(({ from, to }) => roomOf(from) !== roomOf(to))
      .flatMap(({ from, to, specifier }) => {
        const source = roomOf(from)
        const target = roomOf(to)
        // A room not in ROOMS fails the test above, which names it.
        return rank(source) >= 0 && rank(target) > rank(source)
          ? [`${show(from)} imports ${specifier}: room ${source} may not import from ${target}, which is above it in ROOMS`]
          : []
      })
    assert.deepStrictEqual(
      upward,
      [],
      `imports up the order of rooms (lowest first: ${ROOMS.join(" → ")}); move what is shared down to the room below:\n` +
        upward.join("\n")
    )
  })

  it("of storage backends reach the core and their own sub-rooms only", () => {
    const STORAGE = join(SRC, "storage")
    /** The sub-room of `src/storage/` a path is in, "core" for its files, undefined outside storage. */
    const subRoomOf = (path: string): string | undefined => {
      const parts = relative(STORAGE, path).split(sep)
      if (parts[0] === ".." || relative(STORAGE, path).startsWith("..")) return undefined
      return parts.length > 1 ? parts[0] : "core"
    }
    const present = readdirSync(STORAGE, { withFileTypes: true }).filter((entry) => entry.isDirectory()).map((entry) => entry.name)
    assert.deepStrictEqual(present.filter((room) => !(room in STORAGE_BACKENDS)), [], "sub-rooms of src/storage missing from STORAGE_BACKENDS")
    const wrong = imports.flatMap(({ from, to, specifier }) => {
      const source = subRoomOf(from)
      const target = subRoomOf(to)
      if (source === undefined || target === undefined || source === target || target === "core") return []
      if (source !== "core" && (STORAGE_BACKENDS[source] ?? []).includes(target)) return []
      return [`${show(from)} imports ${specifier}: storage/${source} may not import storage/${target}`]
    })
    assert.deepStrictEqual(wrong, [], `storage imports across backends; move what is shared to the core:\n${wrong.join("\n")}`)
  })
})
