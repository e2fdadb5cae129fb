// Runs an entrypoint's TypeScript source on a Node.js that strips types (>= 22.19): the current one
// when it can, otherwise the project's pinned runtime (the `node` npm package), forwarding signals.
import { spawn } from "node:child_process"
import { createRequire } from "node:module"
import { fileURLToPath } from "node:url"
import { COMPILE_CACHE, enableServiceCompileCache } from "./compile-cache.js"
import { MINIMUM_NODE, runsSources } from "./node-version.js"

/** The pinned runtime's binary, or a line saying why there is none (npm install not run). */
const pinnedNode = () => {
  try {
    return createRequire(import.meta.url).resolve("node/bin/node")
  } catch {
    process.stderr.write(
      `${process.argv[1]}: this is Node ${process.versions.node}, and the project needs ${MINIMUM_NODE} or later; its own ` +
        `Node 24 (the npm package "node") is not installed here: run npm install first, or use Node ${MINIMUM_NODE}+.\n`
    )
    process.exit(1)
  }
}

export const run = async (name) => {
  const source = fileURLToPath(new URL(`../src/bin/${name}.ts`, import.meta.url))
  if (runsSources(process.versions.node)) {
    enableServiceCompileCache()
    await import(source)
    return
  }
  const node = pinnedNode()
  const child = spawn(node, [source, ...process.argv.slice(2)], {
    stdio: "inherit",
    env: { NODE_COMPILE_CACHE: COMPILE_CACHE, ...process.env }
  })
  for (const signal of ["SIGINT", "SIGTERM"]) process.on(signal, () => child.kill(signal))
  child.on("exit", (code, signal) => process.exit(code ?? (signal === null ? 1 : 128)))
}
