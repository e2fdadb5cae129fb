/**
 * `examples/receipts.mjs` (docs/receipts.md) as a reader runs it: against the all-in-one, with the
 * project's push client (`push listen`) as the user agent that acks what it receives. The example
 * must print the acknowledged receipt, over HTTP/2 server push and over the JSON long poll, and an
 * expired one for a TTL 0 push to a client that is not connected.
 */
import { type ChildProcess, spawn } from "node:child_process"
import { join } from "node:path"
import { afterEach, assert, describe, it } from "vitest"
import { deploymentFor, startAllInOne } from "./servers.ts"

const root = new URL("../../", import.meta.url).pathname

interface Run {
  readonly code: number | null
  readonly stdout: string
  readonly stderr: string
}

/** `node examples/receipts.mjs args…` to completion. */
const runExample = (args: ReadonlyArray<string>): Promise<Run> =>
  new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [join(root, "examples/receipts.mjs"), ...args], { cwd: root, stdio: ["ignore", "pipe", "pipe"] })
    let stdout = ""
    let stderr = ""
    child.stdout.on("data", (chunk: Buffer) => (stdout += chunk.toString()))
    child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()))
    const timer = setTimeout(() => child.kill("SIGKILL"), 20_000)
    child.on("error", reject)
    child.on("exit", (code) => {
      clearTimeout(timer)
      resolve({ code, stdout, stderr })
    })
  })

/** `push listen` on the deployment: its subscription JSON (the first line it prints), and what it printed since. */
const listeners: Array<ChildProcess> = []
const listen = (wsUrl: string): Promise<{ readonly subscription: string; readonly output: () => string; readonly child: ChildProcess }> =>
  new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [join(root, "src/bin/push.ts"), "listen", "--server", wsUrl], { cwd: root, stdio: ["ignore", "pipe", "pipe"] })
    listeners.push(child)
    let stdout = ""
    let stderr = ""
    child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()))
    child.stdout.on("data", (chunk: Buffer) => {
      stdout += chunk.toString()
      const line = stdout.split("\n")[0] as string
      if (stdout.includes("\n")) resolve({ subscription: line, output: () => stdout + stderr, child })
    })
    child.on("exit", (code) => reject(new Error(`push listen exited (${code}): ${stderr}`)))
  })

const stopped = (child: ChildProcess): Promise<void> =>
  new Promise((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) return resolve()
    child.once("exit", () => resolve())
    child.kill("SIGTERM")
  })

afterEach(async () => {
  await Promise.all(listeners.splice(0).map(stopped))
})

describe("examples/receipts.mjs against the all-in-one", () => {
  const deployment = deploymentFor(() => startAllInOne())

  const check = (run: Run) => `exit ${run.code}\n--- stdout ---\n${run.stdout}\n--- stderr ---\n${run.stderr}`

  it("HTTP/2 server push: an encrypted push the listener decrypts and acks → the acknowledged receipt (410)", async () => {
    const listener = await listen(deployment().wsUrl)
    const run = await runExample(["--text", "hello from the example", listener.subscription])
    assert.strictEqual(run.code, 0, check(run))
    assert.match(run.stdout, /^push: 202 Accepted$/m, check(run))
    assert.match(run.stdout, /^server push: GET \/m\/\S+ → 410 \(acknowledged\)$/m, check(run))
    assert.match(run.stdout, /^receipt: acknowledged \(410\)$/m, check(run))
    const document = JSON.parse(run.stdout.slice(run.stdout.indexOf("\n{") + 1)) as Record<string, unknown>
    assert.strictEqual(document["state"], "acknowledged")
    assert.strictEqual(document["code"], 100)
    assert.match(String(document["message"]), new RegExp(`^${deployment().endpointUrl}/m/`))
    assert.include(listener.output(), "hello from the example")
  })

  it("--poll with a bare endpoint (an empty push) → the acknowledged receipt over the JSON long poll", async () => {
    const listener = await listen(deployment().wsUrl)
    const endpoint = (JSON.parse(listener.subscription) as { readonly endpoint: string }).endpoint
    const run = await runExample(["--poll", endpoint])
    assert.strictEqual(run.code, 0, check(run))
    assert.match(run.stdout, /^long poll: 1 receipt\(s\)$/m, check(run))
    assert.match(run.stdout, /^receipt: acknowledged \(410\)$/m, check(run))
  })

  it("TTL 0 to a client that is not connected → expired (200) at once", async () => {
    const listener = await listen(deployment().wsUrl)
    const endpoint = (JSON.parse(listener.subscription) as { readonly endpoint: string }).endpoint
    await stopped(listener.child)
    const run = await runExample(["--ttl", "0", endpoint])
    assert.strictEqual(run.code, 0, check(run))
    assert.match(run.stdout, /^receipt: expired \(200\)$/m, check(run))
  })

  it("a receipt subscription the service does not know: the example says why and exits 1", async () => {
    const listener = await listen(deployment().wsUrl)
    const endpoint = (JSON.parse(listener.subscription) as { readonly endpoint: string }).endpoint
    const run = await runExample(["--receipts", `${deployment().endpointUrl}/nowhere`, endpoint])
    assert.strictEqual(run.code, 1, check(run))
    assert.match(run.stderr, /POST \S+\/nowhere answered 404/, check(run))
  })
})
