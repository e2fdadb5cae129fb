import { readFileSync } from "node:fs"
import { join } from "node:path"
import { Effect } from "effect"
import { assert, describe, it } from "@effect/vitest"
import { sampleIni } from "../../src/config/docs.ts"
import { iniFile, optionsOf, scopeNames } from "../../src/config/options.ts"
import { sandbox } from "./sandbox.ts"

const sample = (scope: (typeof scopeNames)[number]) => readFileSync(new URL(`../../config/${iniFile[scope]}`, import.meta.url), "utf8")

describe("sample ini files in config/", () => {
  for (const scope of scopeNames) {
    it(`${iniFile[scope]} is what the table generates (node src/config/write-samples.ts)`, () => {
      assert.strictEqual(sample(scope), sampleIni(scope))
    })

    it(`${iniFile[scope]} lists every ${scope} option, each once, and nothing else`, () => {
      const listed = [...sample(scope).matchAll(/^;([a-z_]+) =/gm)].map((m) => m[1])
      assert.deepStrictEqual(listed, [...optionsOf([scope])])
    })

    it.effect(`${iniFile[scope]} parses when every option is uncommented`, () =>
      Effect.gen(function*() {
        const box = sandbox()
        const path = box.write(join(box.cwd, iniFile[scope]), sample(scope).replace(/^;/gm, ""))
        const settings = yield* box.load("autopush", { argv: [`--config-${scope}`, path] })
        assert.strictEqual(settings.port, 8080)
      }))
  }
})
