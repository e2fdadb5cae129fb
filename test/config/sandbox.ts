/** Real temp directories standing in for /etc, $HOME and the working directory. */
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { dirname, isAbsolute, join } from "node:path"
import { Effect } from "effect"
import { afterAll } from "@effect/vitest"
import { loadSettings } from "../../src/config/load.ts"
import type { ConfigError, HelpRequested, LoadInput } from "../../src/config/load.ts"
import type { Role, Settings } from "../../src/config/options.ts"

const root = mkdtempSync(join(tmpdir(), "autopush-config-"))
afterAll(() => rmSync(root, { recursive: true, force: true }))

/** Two valid Fernet keys (URL-safe base64 of 32 bytes). */
export const KEY1 = "hkclU1V37Dnp-0DMF9HLe_40Nnr8kDTYVbo2yxuylzk="
export const KEY2 = Buffer.alloc(32, 7).toString("base64url") + "="
/** A key that starts with "--" (base64url writes 0xfb 0xef … so): one key that autokey makes in 4,096 does. */
export const DASHED_KEY = Buffer.concat([Buffer.from([0xfb, 0xef]), Buffer.alloc(30, 7)]).toString("base64url") + "="

export interface Sandbox {
  readonly etc: string
  readonly home: string
  readonly cwd: string
  /** Writes a file (parents created) and returns its path: an absolute one, in the sandbox's directories. */
  readonly write: (path: string, text: string) => string
  readonly load: (role: Role, options?: { argv?: ReadonlyArray<string>; env?: LoadInput["env"] }) => Effect.Effect<Settings, ConfigError | HelpRequested>
  /** The error of a load that must fail (a load that succeeds fails the test with its settings). */
  readonly fail: (role: Role, options?: { argv?: ReadonlyArray<string>; env?: LoadInput["env"] }) => Effect.Effect<ConfigError | HelpRequested, Settings>
}

export const sandbox = (): Sandbox => {
  const dir = mkdtempSync(join(root, "s-"))
  const [etc, home, cwd] = ["etc", "home", "cwd"].map((name) => {
    const path = join(dir, name)
    mkdirSync(path)
    return path
  }) as [string, string, string]
  const write = (path: string, text: string) => {
    // A relative path would land in the test process's working directory: the repository.
    if (!isAbsolute(path) || !path.startsWith(dir)) throw new Error(`sandbox.write takes a path in the sandbox (etc, home or cwd), not ${path}`)
    mkdirSync(dirname(path), { recursive: true })
    writeFileSync(path, text)
    return path
  }
  const load: Sandbox["load"] = (role, options = {}) =>
    loadSettings({ role, argv: options.argv ?? [], env: options.env ?? {}, cwd, home, etcDir: etc })
  return { etc, home, cwd, write, load, fail: (role, options) => Effect.flip(load(role, options)) }
}
