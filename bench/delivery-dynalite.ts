/**
 * The shared dynalite server of `bench:delivery` scenario (b), run as a child process:
 * `node delivery-dynalite.ts PORT DATA_DIR`. LevelDB on disk under DATA_DIR, as the e2e tests and
 * the embedded storage run it. Every request is counted by its DynamoDB operation (the
 * `X-Amz-Target` header, e.g. `DynamoDB_20120810.GetItem` → `GetItem`) with its service time; the
 * IPC request `{ cmd: "counts" }` answers `{ counts: { op: { n, ms } } }` and resets them.
 */
import "./delivery-probe.ts"
import { mkdir } from "node:fs/promises"
import dynalite from "dynalite"

const [port, dataDir] = [Number(process.argv[2]), process.argv[3] as string]
process.on("SIGTERM", () => process.exit(0))
process.on("SIGINT", () => process.exit(0))

let counts = new Map<string, { n: number; ms: number }>()

await mkdir(dataDir, { recursive: true })
const server = dynalite({ path: dataDir, createTableMs: 0, deleteTableMs: 0, updateTableMs: 0 })
server.prependListener("request", (req, res) => {
  const target = String(req.headers["x-amz-target"] ?? "(none)")
  const op = target.slice(target.indexOf(".") + 1)
  const started = performance.now()
  res.once("finish", () => {
    const entry = counts.get(op) ?? { n: 0, ms: 0 }
    entry.n++
    entry.ms += performance.now() - started
    counts.set(op, entry)
  })
})
process.on("message", (m) => {
  if (typeof m === "object" && m !== null && (m as { cmd?: unknown }).cmd === "counts") {
    process.send?.({ counts: Object.fromEntries(counts) })
    counts = new Map()
  }
})
server.listen(port, "127.0.0.1", () => process.send?.({ ready: true }))
