/**
 * The rooms that hold the most state — storage and the connection node — stay readable in one
 * sitting: no file longer than `MAX_FILE_LINES`, no function longer than `MAX_FUNCTION_LINES`. A
 * function's lines are all the lines it spans, the functions it holds included, so a constructor
 * that gathers many concerns is measured whole. Functions are found by parsing each module (the
 * TypeScript parser of rolldown, which vitest already runs on).
 */
import { readdirSync, readFileSync } from "node:fs"
import { join, relative, resolve } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { parseAst } from "rolldown/parseAst"

const MAX_FILE_LINES = 300
const MAX_FUNCTION_LINES = 100
const ROOMS = ["storage", "connection"] as const

const SRC = resolve(import.meta.dirname, "../../src")

const modules = (dir: string): ReadonlyArray<string> =>
  readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const path = join(dir, entry.name)
    if (entry.isDirectory()) return modules(path)
    return /\.ts$/.test(entry.name) && !entry.name.endsWith(".d.ts") ? [path] : []
  })

interface Node {
  readonly type: string
  readonly start: number
  readonly end: number
  readonly id?: { readonly name?: string } | null
  readonly key?: { readonly name?: string } | null
}

const FUNCTIONS = new Set(["FunctionDeclaration", "FunctionExpression", "ArrowFunctionExpression"])

/** Every function node of a parsed module, with the name of the declaration or property holding it when there is one. */
const functionsOf = (root: unknown): ReadonlyArray<{ readonly node: Node; readonly name: string }> => {
  const found: Array<{ node: Node; name: string }> = []
  const visit = (value: unknown, name: string): void => {
    if (Array.isArray(value)) {
      for (const item of value) visit(item, name)
      return
    }
    if (value === null || typeof value !== "object") return
    const node = value as Node & Record<string, unknown>
    const here = node.type === "VariableDeclarator" || node.type === "Property" || node.type === "MethodDefinition" || node.type === "PropertyDefinition"
      ? ((node.id ?? node.key)?.name ?? name)
      : name
    if (FUNCTIONS.has(node.type)) found.push({ node, name: node.id?.name ?? here })
    for (const [key, child] of Object.entries(node)) {
      if (key !== "type" && key !== "start" && key !== "end") visit(child, here)
    }
  }
  visit(root, "(anonymous)")
  return found
}

const lineOf = (source: string, offset: number): number => {
  let line = 1
  for (let i = 0; i < offset; i++) if (source.charCodeAt(i) === 10) line++
  return line
}

describe.each(ROOMS)("src/%s", (room) => {
  const files = modules(join(SRC, room))

  it("has no file over the line bound", () => {
    const long = files
      .map((path) => ({ path: relative(SRC, path), lines: readFileSync(path, "utf8").split("\n").length - 1 }))
      .filter(({ lines }) => lines > MAX_FILE_LINES)
      .map(({ lines, path }) => `src/${path}: ${lines} lines`)
    assert.deepStrictEqual(long, [], `files over ${MAX_FILE_LINES} lines`)
  })

  it("has no function over the line bound", () => {
    const long = files.flatMap((path) => {
      const source = readFileSync(path, "utf8")
      return functionsOf(parseAst(source, { lang: "ts" }, path)).flatMap(({ name, node }) => {
        const first = lineOf(source, node.start)
        const lines = lineOf(source, node.end) - first + 1
        return lines > MAX_FUNCTION_LINES ? [`src/${relative(SRC, path)}:${first} ${name}: ${lines} lines`] : []
      })
    })
    assert.deepStrictEqual(long, [], `functions over ${MAX_FUNCTION_LINES} lines`)
  })
})
