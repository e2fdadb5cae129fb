/**
 * Which Node runs the sources, and what a too-old one says. The launchers (`bin/NAME.js`) run an
 * entrypoint on the Node they were given when it is 22.19 or later, else on the project's pinned
 * Node 24; an entrypoint run directly (`node src/bin/NAME.ts`) on a Node that loads `.ts` but is
 * older stops with one line naming its launcher, before its other modules load. An older Node is
 * played by a Node whose `process.versions.node` is rewritten before anything loads.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { execFile } from "node:child_process"
import { existsSync, readdirSync, readFileSync } from "node:fs"
import { join } from "node:path"
import { runsSources, tooOldNode } from "../../bin/node-version.js"

const root = new URL("../../", import.meta.url).pathname

/** The entrypoints of src/bin/ (the modules that are not the application or its helpers). */
const entrypoints = readdirSync(join(root, "src/bin")).filter((f) => f.endsWith(".ts") && !["app.ts", "compileCache.ts"].includes(f)).map((f) => f.slice(0, -3))

/** `node [--import <Node claiming to be version>] args…` from the repository, to completion. */
const runNode = (claimed: string | undefined, args: ReadonlyArray<string>) =>
  Effect.promise(() =>
    new Promise<{ readonly code: number; readonly stdout: string; readonly stderr: string }>((resolve) => {
      const pretend = claimed === undefined ? [] : ["--import", `data:text/javascript,Object.defineProperty(process.versions, "node", { value: "${claimed}" })`]
      execFile(process.execPath, [...pretend, ...args], { cwd: root, timeout: 30_000 }, (error, stdout, stderr) =>
        resolve({ code: error === null ? 0 : typeof error.code === "number" ? error.code : 1, stdout, stderr }))
    })
  )

describe("the Node that runs the sources", () => {
  it("22.19 and later run them; 20, 22.18 and earlier do not", () => {
    assert.deepStrictEqual(
      ["20.20.2", "22.6.0", "22.18.0", "22.19.0", "22.20.1", "23.0.0", "24.21.0"].map(runsSources),
      [false, false, false, true, true, true, true]
    )
  })

  it("too old: the entrypoint, both versions, and the launcher to run instead", () => {
    assert.strictEqual(
      tooOldNode("/srv/autopush-ts/src/bin/push.ts", "22.18.0"),
      "push.ts needs Node.js 22.19 or later, and this is Node 22.18.0. Run it as node bin/push.js (or through npm: npm start, npm run …), " +
        "which runs it on the project's own Node 24 (installed by npm install) when this one is older; or install Node 22.19+."
    )
    assert.isUndefined(tooOldNode("src/bin/push.ts", "24.21.0"))
  })

  it("every entrypoint has its launcher, and checks the Node first, before any other import", () => {
    assert.includeMembers(entrypoints, ["autopush", "autoconnect", "autoendpoint", "autokey", "push"])
    for (const name of entrypoints) {
      assert.isTrue(existsSync(join(root, "bin", `${name}.js`)), `bin/${name}.js`)
      const firstImport = readFileSync(join(root, "src/bin", `${name}.ts`), "utf8").split("\n").find((line) => line.startsWith("import "))
      assert.match(firstImport ?? "", /^import "\.\.\/\.\.\/bin\/require-node\.js"/, name)
    }
  })

  it.effect("node src/bin/autokey.ts on a Node too old: that one line, exit 1, nothing of the tool run", () =>
    Effect.gen(function*() {
      const old = yield* runNode("22.18.0", ["src/bin/autokey.ts"])
      assert.deepStrictEqual([old.code, old.stdout], [1, ""])
      assert.strictEqual(old.stderr, `${tooOldNode("src/bin/autokey.ts", "22.18.0")}\n`)
    }))

  it.effect("node bin/autokey.js on a Node too old (20): runs on the pinned Node and prints its key", () =>
    Effect.gen(function*() {
      const launched = yield* runNode("20.20.2", ["bin/autokey.js"])
      assert.strictEqual(launched.code, 0, launched.stderr)
      assert.match(launched.stdout, /^[A-Za-z0-9_-]{43}=\n$/)
    }))
})
