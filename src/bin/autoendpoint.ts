/** The endpoint node: the Web Push HTTP API. */
import { endpointLayer, runRole } from "./app.ts"

runRole("autoendpoint", endpointLayer)
