// Runs an entrypoint's TypeScript source on a Node.js that strips types (>= 22.19): the current one
// when it can, otherwise the project's pinned runtime (the `node` npm package), forwarding signals.
import { spawn } from "node:child_process"
import { createRequire } from "node:module"
import { fileURLToPath } from "node:url"
import { COMPILE_CACHE, enableServiceCompileCache } from "./compile-cache.js"

export const run = async (name) => {
  const source = fileURLToPath(new URL(`../src/bin/${name}.ts`, import.meta.url))
  const [major, minor] = process.versions.node.split(".").map(Number)
  if (major > 22 || (major === 22 && minor >= 19)) {
    enableServiceCompileCache()
    await import(source)
    return
  }
  const node = createRequire(import.meta.url).resolve("node/bin/node")
  const child = spawn(node, [source, ...process.argv.slice(2)], {
    stdio: "inherit",
    env: { NODE_COMPILE_CACHE: COMPILE_CACHE, ...process.env }
  })
  for (const signal of ["SIGINT", "SIGTERM"]) process.on(signal, () => child.kill(signal))
  child.on("exit", (code, signal) => process.exit(code ?? (signal === null ? 1 : 128)))
}
