/**
 * `npm run bench:path`: which of the service's modules a push to a connected client runs through,
 * on the all-in-one (the endpoint's router cache warm: the client was pushed to before). The node
 * runs with `path-probe.mjs` (V8 precise coverage); for each of `ROUNDS` pushes the coverage is
 * reset, the push sent, and read once the client has the notification. A module counts when it
 * ran code in every round (so a timer of the node that happened to fire in one round does not).
 * Prints the count, the folders, and the modules.
 */
import { randomBytes } from "node:crypto"
import { mkdtempSync, readFileSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { setTimeout as sleep } from "node:timers/promises"
import { startAllInOne } from "../test/e2e/servers.ts"
import { hello, push, register } from "./harness.ts"

const ROUNDS = 5

const main = async () => {
  const dir = mkdtempSync(join(tmpdir(), "autopush-bench-path-"))
  const out = join(dir, "coverage.jsonl")
  const probe = new URL("./path-probe.mjs", import.meta.url).pathname
  const deployment = await startAllInOne(["--log-level", "warn"], { env: { NODE_OPTIONS: `--import=${probe}`, PATH_PROBE_OUT: out } })
  const pid = deployment.pid() as number
  const reading = async (): Promise<ReadonlyArray<string>> => {
    const before = readLines().length
    process.kill(pid, "SIGUSR2")
    for (let waited = 0; waited < 5_000; waited += 20) {
      const lines = readLines()
      if (lines.length > before) return JSON.parse(lines[lines.length - 1] as string) as ReadonlyArray<string>
      await sleep(20)
    }
    throw new Error("the node wrote no coverage")
  }
  const readLines = (): Array<string> => {
    try {
      return readFileSync(out, "utf8").split("\n").filter((line) => line.length > 0)
    } catch {
      return []
    }
  }
  try {
    const client = await hello(deployment.wsUrl)
    const endpoint = await register(client)
    const pushAndReceive = async () => {
      const { status } = await push(endpoint, randomBytes(32))
      if (status !== 201) throw new Error(`push answered ${status}`)
      const frame = await client.next((m) => m["messageType"] === "notification", 5_000)
      return frame
    }
    // Warm: the endpoint's router cache holds the client, every module is loaded.
    for (let i = 0; i < 3; i++) {
      const frame = await pushAndReceive()
      client.send({ messageType: "ack", updates: [{ channelID: frame["channelID"], version: frame["version"] }] })
    }
    await sleep(200)
    let common: Set<string> | undefined
    for (let round = 0; round < ROUNDS; round++) {
      await reading() // reset
      const frame = await pushAndReceive()
      const ran = await reading()
      common = common === undefined ? new Set(ran) : new Set(ran.filter((m) => common!.has(m)))
      client.send({ messageType: "ack", updates: [{ channelID: frame["channelID"], version: frame["version"] }] })
      await sleep(100)
    }
    const modules = [...(common ?? [])].sort()
    const folders = [...new Set(modules.map((m) => m.split("/")[1] as string))].sort()
    console.log(`A push to a connected client (router cache warm), ${ROUNDS} rounds: ${modules.length} modules in ${folders.length} folders`)
    console.log(`folders: ${folders.join(", ")}`)
    for (const m of modules) console.log(`  ${m}`)
    await client.close()
  } finally {
    await deployment.stop()
    rmSync(dir, { recursive: true, force: true })
  }
}

await main()
