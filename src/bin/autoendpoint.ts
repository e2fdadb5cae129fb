/** The endpoint node: the Web Push HTTP API. */
import { withCompileCache } from "./compileCache.ts"

const { endpointLayer, runRole } = await withCompileCache(() => import("./app.ts"))

runRole("autoendpoint", endpointLayer)
