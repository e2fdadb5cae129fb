/** The connection node: WebSocket push protocol + private router port. */
import { connectionLayer, runRole } from "./app.ts"

runRole("autoconnect", connectionLayer)
