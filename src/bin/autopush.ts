/** Everything in one process (what `npm start` runs): connection node and endpoint node. */
import "../../bin/require-node.js" // first: a Node too old for the sources stops here, before the rest loads
import { withCompileCache } from "./compileCache.ts"

const { allInOneLayer, runRole } = await withCompileCache(() => import("./app.ts"))

runRole("autopush", allInOneLayer)
