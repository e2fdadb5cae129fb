/**
 * The tools as an operator runs them: child processes of `src/bin/*.ts` against a dynalite server
 * this test process starts, with settings only from flags (a clean environment, an empty working
 * directory and home, so no ini file or AUTO*__ variable of the machine leaks in).
 */
import { spawn } from "node:child_process"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect, Exit, Scope } from "effect"
import { layerDynamo } from "../../src/storage/dynamo/layer.ts"
import { startDynalite } from "../../src/storage/dynalite/embedded.ts"
import type { Storage, StorageError } from "../../src/storage/Storage.ts"

export const root = new URL("../../", import.meta.url).pathname

export interface ToolRun {
  readonly code: number | null
  readonly stdout: string
  readonly stderr: string
}

/** The environment without anything that configures autopush or AWS. */
const cleanEnv = (): NodeJS.ProcessEnv =>
  Object.fromEntries(
    Object.entries(process.env).filter(([key]) =>
      !/^(AUTOPUSH__|AUTOCONNECT__|AUTOEND__|AWS_)/.test(key) && key !== "CRYPTO_KEY"
    )
  )

export const scratch = (name: string): string => mkdtempSync(join(tmpdir(), `autopush-tools-${name}-`))

/** Run `src/bin/{tool}.ts args…` to completion. */
export const runTool = (
  tool: "maintenance" | "endpoint-diagnostic",
  args: ReadonlyArray<string>,
  options: { readonly cwd?: string; readonly env?: Readonly<Record<string, string>> } = {}
): Promise<ToolRun> =>
  new Promise((resolve, reject) => {
    const cwd = options.cwd ?? scratch("cwd")
    const child = spawn(process.execPath, [join(root, "src/bin", `${tool}.ts`), ...args], {
      cwd,
      env: { ...cleanEnv(), HOME: cwd, ...options.env },
      stdio: ["ignore", "pipe", "pipe"]
    })
    let stdout = ""
    let stderr = ""
    child.stdout.on("data", (chunk: Buffer) => (stdout += chunk.toString()))
    child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()))
    const timer = setTimeout(() => child.kill("SIGKILL"), 60_000)
    child.on("error", reject)
    child.on("exit", (code) => {
      clearTimeout(timer)
      resolve({ code, stdout, stderr })
    })
  })

/** A dynalite server in this process (tables are ACTIVE at once); `close` stops it. */
export const startServer = async (dataDir = join(scratch("dynalite"), "db")) => {
  const scope = Effect.runSync(Scope.make())
  const endpoint = await Effect.runPromise(Scope.provide(startDynalite(dataDir), scope))
  return { endpoint, close: () => Effect.runPromise(Scope.close(scope, Exit.void)) }
}

export interface Tables {
  readonly routerTable: string
  readonly messageTablePrefix: string
  readonly noTableRotation: boolean
}

/** Table names of one test, so tests sharing a server do not see each other's tables. */
let counter = 0
export const tablesFor = (noTableRotation = false): Tables => {
  counter++
  const id = `${process.pid}_${counter}`
  return { routerTable: `router_${id}`, messageTablePrefix: `message_${id}`, noTableRotation }
}

/** The flags that point a tool at `endpoint` with these tables. */
export const storageFlags = (endpoint: string, tables: Tables): Array<string> => [
  "--storage-endpoint", endpoint,
  "--router-tablename", tables.routerTable,
  "--message-tablename", tables.messageTablePrefix,
  ...(tables.noTableRotation ? ["--no-table-rotation"] : [])
]

/** Run a Storage program against the server, as the test's own view of the data. */
export const withStorage = <A>(
  endpoint: string,
  tables: Tables,
  program: Effect.Effect<A, StorageError, Storage>
): Promise<A> => Effect.runPromise(program.pipe(Effect.provide(layerDynamo({ ...tables, endpoint, region: "local" }))))
