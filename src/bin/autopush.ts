/** Everything in one process (what `npm start` runs): connection node and endpoint node. */
import { allInOneLayer, runRole } from "./app.ts"

runRole("autopush", allInOneLayer)
