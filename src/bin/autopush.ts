/** Everything in one process (what `npm start` runs): connection node and endpoint node. */
import { prestartDynalite } from "../storage/dynaliteWorker.ts"
import { withCompileCache } from "./compileCache.ts"

// Embedded storage (the default) loads on the other core while this thread loads the rest.
const { allInOneLayer, runRole } = await withCompileCache(() => {
  prestartDynalite()
  return import("./app.ts")
})

runRole("autopush", allInOneLayer)
