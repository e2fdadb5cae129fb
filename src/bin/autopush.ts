/** Everything in one process (what `npm start` runs): connection node and endpoint node. */
import { prestartDynalite } from "../storage/dynaliteWorker.ts"
import { withCompileCache } from "./compileCache.ts"

// Embedded storage (the default) loads on the other core while this thread loads the rest; a
// worker uses its supervisor's.
const { allInOneLayer, runRole } = await withCompileCache(async () => {
  const { WORKER } = await import("../workers/worker.ts")
  if (WORKER === undefined) prestartDynalite()
  return import("./app.ts")
})

runRole("autopush", allInOneLayer)
