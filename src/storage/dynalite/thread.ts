/**
 * The embedded dynalite, on a thread of its own (started by `dynalite/worker.ts`, used by
 * `dynalite/embedded.ts`): LevelDB work and the DynamoDB API's JSON then never stall the node's event loop.
 * It loads dynalite at once and opens the data directory of the first `{ open: dataDir }` message;
 * it answers on 127.0.0.1 at a free port, or where the message says (`host`, `listenPort`): `{ port }`
 * is posted once it listens, `{ error }` if it cannot start (a port in use: code EADDRINUSE). A `"close"` message closes the server and the database (then `{ closed: true }`).
 * Its expression parses are reused (`dynalite/expressions.ts`).
 */
import { mkdir } from "node:fs/promises"
import { createRequire } from "node:module"
import { parentPort } from "node:worker_threads"
import dynalite from "dynalite"
import { type Compare, memoizeExpressions, type Validations } from "./expressions.ts"

interface LevelDb {
  open(options: { createIfMissing: boolean }): Promise<void>
  close(): Promise<void>
}

const port = parentPort
if (port === null) throw new Error("dynalite/thread.ts runs as a worker thread")
const { open: dataDir, host = "127.0.0.1", listenPort = 0 } = await new Promise<{ readonly open: string; readonly host?: string; readonly listenPort?: number }>(
  (resolve) => port.once("message", resolve)
)

const fail = (error: unknown) => port.postMessage({ error: error instanceof Error ? { name: error.name, message: error.message, code: (error as { code?: unknown }).code } : { message: String(error) } })

try {
  await mkdir(dataDir, { recursive: true })
  // dynalite opens LevelDB lazily (a held lock would only show on the first request): try the lock
  // first, with dynalite's own `level`, so data in use by another process is refused at start.
  const fromDynalite = createRequire(createRequire(import.meta.url).resolve("dynalite"))
  const { Level } = fromDynalite("level") as { Level: new(path: string) => LevelDb }
  const probe = new Level(dataDir)
  await probe.open({ createIfMissing: true }).catch((error: unknown) => {
    throw (error as { cause?: unknown }).cause ?? error
  })
  await probe.close()
  memoizeExpressions(fromDynalite("./validations/index.js") as Validations, (fromDynalite("./db/index.js") as { compare: Compare }).compare)
  const server = dynalite({ path: dataDir, createTableMs: 0, deleteTableMs: 0, updateTableMs: 0 })
  server.once("error", fail)
  server.listen(listenPort, host, () => {
    const address = server.address()
    port.postMessage({ port: typeof address === "object" && address !== null ? address.port : 0 })
  })
  port.on("message", (message) => {
    if (message !== "close") return
    server.close(() => {
      port.postMessage({ closed: true })
      port.close()
    })
  })
} catch (error) {
  fail(error)
}
