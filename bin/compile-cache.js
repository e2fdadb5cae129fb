// Node's compile cache for the service's modules (`node_modules/.cache/autopush`): modules compiled
// (and TypeScript stripped) once are read back on the next start. It must be on before the first
// `.ts` module loads, or that module starts Node's type stripper, a sizeable part of a start.
// (A namespace import: Node before 22.1 has no `enableCompileCache`, and `run.js` runs there too.)
import * as nodeModule from "node:module"

export const COMPILE_CACHE = new URL("../node_modules/.cache/autopush", import.meta.url).pathname

/** An unwritable cache directory only means no cache. */
export const enableServiceCompileCache = () => nodeModule.enableCompileCache?.(COMPILE_CACHE)
