/** The connection node: WebSocket push protocol + private router port. */
import { withCompileCache } from "./compileCache.ts"

const { connectionLayer, runRole } = await withCompileCache(() => import("./app.ts"))

runRole("autoconnect", connectionLayer)
