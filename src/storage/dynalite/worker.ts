/**
 * The embedded dynalite's thread (`dynalite/thread.ts`), for dynalite data of an earlier version and
 * the benches. Kept out of `dynalite/embedded.ts` so that starting it loads nothing else.
 */
import { getCompileCacheDir } from "node:module"
import { Worker } from "node:worker_threads"

/** A new thread, with the process's compile cache if it has one: a thread does not share it otherwise (~40 ms of its start). */
export const dynaliteWorker = (): Worker => {
  const cache = getCompileCacheDir()
  return new Worker(new URL("./thread.ts", import.meta.url), cache === undefined ? {} : { env: { ...process.env, NODE_COMPILE_CACHE: cache } })
}
