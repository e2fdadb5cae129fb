/**
 * Start-up time is module loading: the sources import single modules of effect, the platform and
 * jose, never their indexes (which load hundreds of unused modules, a Redis client among them).
 */
import { readdirSync, readFileSync } from "node:fs"
import { join } from "node:path"
import { describe, expect, it } from "vitest"

const src = new URL("../../src/", import.meta.url).pathname
const files = (dir: string): Array<string> =>
  readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? files(join(dir, e.name)) : e.name.endsWith(".ts") ? [join(dir, e.name)] : []
  )

describe("imports", () => {
  it("src imports no package index that loads what it does not use", () => {
    const index = /from "(effect|effect\/http|effect\/observability|@effect\/platform-node|jose)"/
    const offenders = files(src).filter((f) => index.test(readFileSync(f, "utf8"))).map((f) => f.slice(src.length))
    expect(offenders).toEqual([])
  })
})
