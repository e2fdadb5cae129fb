/** The connection node: WebSocket push protocol + private router port. */
import "../../bin/require-node.js" // first: a Node too old for the sources stops here, before the rest loads
import { withCompileCache } from "./compileCache.ts"

const { connectionLayer, runRole } = await withCompileCache(() => import("./app.ts"))

runRole("autoconnect", connectionLayer)
