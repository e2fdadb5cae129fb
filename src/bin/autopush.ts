/** Everything in one process (what `npm start` runs): connection node and endpoint node. */
import { withCompileCache } from "./compileCache.ts"

const { allInOneLayer, runRole } = await withCompileCache(() => import("./app.ts"))

runRole("autopush", allInOneLayer)
