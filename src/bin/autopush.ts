/** Everything in one process (what `npm start` runs): connection node and endpoint node. */
import { Layer } from "effect"
import { connectionLayer, endpointLayer, runRole } from "./app.ts"

runRole("autopush", (settings) => Layer.mergeAll(connectionLayer(settings), endpointLayer(settings)))
