/**
 * The embedded storage's thread (`dynaliteThread.ts`). The all-in-one starts it first thing, so that
 * the thread loads dynalite on the other core while the main thread loads the service: start-up
 * waits for the longer of the two, not their sum. Kept out of `embedded.ts` so that starting it
 * loads nothing else. A thread started but never used is ended by `dropPrestartedDynalite`, and
 * does not keep the process alive meanwhile.
 */
import { getCompileCacheDir } from "node:module"
import { Worker } from "node:worker_threads"

let prestarted: Worker | undefined

/** With the process's compile cache, if it has one: a thread does not share it otherwise (~40 ms of its start). */
const start = () => {
  const cache = getCompileCacheDir()
  return new Worker(new URL("./dynaliteThread.ts", import.meta.url), cache === undefined ? {} : { env: { ...process.env, NODE_COMPILE_CACHE: cache } })
}

export const prestartDynalite = (): void => {
  if (prestarted !== undefined) return
  prestarted = start()
  prestarted.unref()
}

/** The prestarted thread, or a new one. */
export const dynaliteWorker = (): Worker => {
  const worker = prestarted ?? start()
  prestarted = undefined
  worker.ref()
  return worker
}

/** End the prestarted thread: storage is elsewhere. */
export const dropPrestartedDynalite = (): void => {
  void prestarted?.terminate()
  prestarted = undefined
}
