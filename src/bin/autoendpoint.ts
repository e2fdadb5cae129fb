/** The endpoint node: the Web Push HTTP API. */
import "../../bin/require-node.js" // first: a Node too old for the sources stops here, before the rest loads
import { withCompileCache } from "./compileCache.ts"

const { endpointLayer, runRole } = await withCompileCache(() => import("./app.ts"))

runRole("autoendpoint", endpointLayer)
