/**
 * Node's compile cache for the entrypoints: modules compiled once are read back from
 * `node_modules/.cache/autopush` on the next start (about a sixth of the start-up CPU). It must be
 * on before the application's modules are loaded, so entrypoints import the application after it.
 * An unwritable cache directory only means no cache.
 */
import { enableCompileCache } from "node:module"

export const withCompileCache = <A>(load: () => Promise<A>): Promise<A> => {
  enableCompileCache(new URL("../../node_modules/.cache/autopush", import.meta.url).pathname)
  return load()
}
