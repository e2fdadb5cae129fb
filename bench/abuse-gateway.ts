/**
 * The Matrix push gateway's abuser of `bench:abuse`, a child process as those of `abuse-client.ts`
 * (it sends `"ready"` once under way; on `"stop"` it reports `{ note }` and exits):
 *
 *   <endpointUrl> <concurrency>   POST /_matrix/push/v1/notify one after the other (`concurrency` at a
 *                                 time), cycling through bodies of 64 KiB built for the most work:
 *                                 thousands of small fields, nesting as deep as the body allows,
 *                                 the most devices with long pushkeys not of this server, one long
 *                                 run of one character. Counted: requests, their statuses, and the
 *                                 time of each from sending to its whole answer (the worst and the
 *                                 p99: the node's time per notify, measured from outside).
 *
 * `gatewayCases` is the case `abuse.ts` runs it as.
 */
import { request } from "node:http"

const NOTIFY_PATH = "/_matrix/push/v1/notify"
const LIMIT = 64 * 1024

/** The case of `bench:abuse` that runs this abuser against the node at `endpointUrl`. */
export const gatewayCases = (endpointUrl: string) => [
  { name: "matrix notify", args: [endpointUrl, "1"], script: new URL(import.meta.url).pathname }
]

/** Parts joined by commas, as many as fit in 64 KiB with `open` and `close` around them. */
const filled = (open: string, close: string, part: (i: number) => string): string => {
  const parts: Array<string> = []
  let size = open.length + close.length
  for (let i = 0; size + part(i).length + 1 <= LIMIT; i++) {
    parts.push(part(i))
    size += part(i).length + 1
  }
  return `${open}${parts.join(",")}${close}`
}

const bodies: ReadonlyArray<readonly [string, string]> = [
  ["many fields", filled("{\"notification\":{\"devices\":[],\"event_id\":\"$e\",", "}}", (i) => `"f${i}":1`)],
  ["deep nesting", `{"notification":{"devices":[],"content":{"x":${"[".repeat(32_000)}${"]".repeat(32_000)}}}}`],
  [
    "most devices",
    JSON.stringify({ notification: { devices: Array.from({ length: 64 }, (_, i) => ({ app_id: "a", pushkey: `https://h${i}.example/wpush/v1/${"b".repeat(900)}` })) } })
  ],
  ["long run", `{"notification":{"devices":[],"content":{"body":"${"a".repeat(LIMIT - 80)}"}}}`]
]

const main = () => {
  const [endpointUrl = "http://127.0.0.1:8082", concurrencyArg = "4"] = process.argv.slice(2)
  const url = new URL(NOTIFY_PATH, endpointUrl)
  const times: Array<number> = []
  const worst: Record<string, number> = {}
  const statuses: Record<string, number> = {}
  let stopping = false
  let next = 0

  const one = (): Promise<void> =>
    new Promise((resolve) => {
      const [name, body] = bodies[next++ % bodies.length]!
      const started = performance.now()
      const req = request(url, { method: "POST", headers: { "content-type": "application/json", "content-length": Buffer.byteLength(body) } }, (res) => {
        res.resume()
        res.on("end", () => {
          const ms = performance.now() - started
          times.push(ms)
          worst[name] = Math.max(worst[name] ?? 0, ms)
          statuses[String(res.statusCode)] = (statuses[String(res.statusCode)] ?? 0) + 1
          resolve()
        })
      })
      req.on("error", () => {
        statuses["error"] = (statuses["error"] ?? 0) + 1
        resolve()
      })
      req.end(body)
    })

  const loop = async () => {
    while (!stopping) await one()
  }
  for (let i = 0; i < Number(concurrencyArg); i++) void loop()
  setTimeout(() => process.send?.("ready"), 200)

  process.on("message", (message) => {
    if (message !== "stop") return
    stopping = true
    const sorted = [...times].sort((a, b) => a - b)
    const p99 = sorted[Math.min(sorted.length - 1, Math.floor(sorted.length * 0.99))] ?? Number.NaN
    const note = `${times.length} notifies (${Object.entries(statuses).map(([s, n]) => `${s}: ${n}`).join(", ")}), time per notify p99 ${p99.toFixed(1)} ms, worst ${
      Object.entries(worst).map(([name, ms]) => `${name} ${ms.toFixed(1)} ms`).join(", ")
    }`
    process.send?.({ note }, () => process.exit(0))
    setTimeout(() => process.exit(0), 1_000).unref()
  })
  process.on("disconnect", () => process.exit(0))
}

if (process.argv[1] === new URL(import.meta.url).pathname) main()
