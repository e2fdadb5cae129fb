/**
 * Node's compile cache for the entrypoints run as `node src/bin/….ts` (`bin/*.js`, what the npm
 * scripts run, turns it on before the entrypoint itself loads: see `bin/compile-cache.js`). It must
 * be on before the application's modules are loaded, so entrypoints import the application after it.
 */
import { enableServiceCompileCache } from "../../bin/compile-cache.js"

export const withCompileCache = <A>(load: () => Promise<A>): Promise<A> => {
  enableServiceCompileCache()
  return load()
}
