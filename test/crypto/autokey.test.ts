import { spawnSync } from "node:child_process"
import { fileURLToPath } from "node:url"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Result } from "effect"
import { parseFernetKey } from "../../src/crypto/fernet.ts"

const script = fileURLToPath(new URL("../../src/bin/autokey.ts", import.meta.url))
const run = (...args: ReadonlyArray<string>) =>
  spawnSync(process.execPath, [script, ...args], { encoding: "utf8", timeout: 20_000 })

describe("autokey", () => {
  it.effect("prints one new Fernet key and exits 0", () =>
    Effect.sync(() => {
      const first = run()
      assert.strictEqual(first.status, 0, first.stderr)
      assert.match(first.stdout, /^[A-Za-z0-9_-]{43}=\n$/)
      assert.isTrue(Result.isSuccess(parseFernetKey(first.stdout.trim())))
      assert.notStrictEqual(run().stdout, first.stdout)
    }))

  it.effect("--help prints usage and exits 0", () =>
    Effect.sync(() => {
      const help = run("--help")
      assert.strictEqual(help.status, 0)
      assert.include(help.stdout, "usage: autokey")
    }))

  it.effect("an unknown argument is an error", () =>
    Effect.sync(() => {
      const bad = run("--bogus")
      assert.strictEqual(bad.status, 2)
      assert.strictEqual(bad.stdout, "")
      assert.include(bad.stderr, "--bogus")
    }))
})
