// Loaded into a node with `--import` by `bench:path`: each SIGUSR2 writes one line to
// $PATH_PROBE_OUT, the source files of this repository that ran code since the previous SIGUSR2
// (V8's precise coverage, whose counters each reading resets).
import { appendFileSync } from "node:fs"
import { Session } from "node:inspector"

const out = process.env.PATH_PROBE_OUT
const session = new Session()
session.connect()
const post = (method, params = {}) =>
  new Promise((resolve, reject) => session.post(method, params, (error, result) => (error ? reject(error) : resolve(result))))
await post("Profiler.enable")
await post("Profiler.startPreciseCoverage", { callCount: true, detailed: false })
process.on("SIGUSR2", async () => {
  const { result } = await post("Profiler.takePreciseCoverage")
  const ran = result
    .filter((script) => script.url.includes("/src/") && script.functions.some((f) => f.ranges.some((r) => r.count > 0)))
    .map((script) => script.url.slice(script.url.indexOf("/src/") + 1))
  appendFileSync(out, JSON.stringify(ran.sort()) + "\n")
})
