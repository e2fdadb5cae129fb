/**
 * Stopping a server: SIGTERM is a clean stop (exit 0, as a service manager expects); a server whose
 * parent goes away (the `npm start` that ran it, killed) stops by itself instead of living on as an
 * orphan holding its ports and data.
 */
import { type ChildProcess, spawn } from "node:child_process"
import { mkdtempSync, rmSync } from "node:fs"
import { request } from "node:http"
import { connect } from "node:http2"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import { openClient } from "../connection/client.ts"
import { freePorts } from "./servers.ts"

const root = new URL("../../", import.meta.url).pathname
const dirs: Array<string> = []
afterAll(() => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true })
})

const args = async () => {
  const [port, router, endpoint] = await freePorts(3)
  return {
    port: port as number,
    endpoint: endpoint as number,
    flags: ["--port", String(port), "--router-port", String(router), "--endpoint-port", String(endpoint), "--bind-host", "127.0.0.1"]
  }
}

const workDir = () => {
  const dir = mkdtempSync(join(tmpdir(), "autopush-stop-"))
  dirs.push(dir)
  return dir
}

const up = async (endpointPort: number) => {
  for (const deadline = Date.now() + 20_000; Date.now() < deadline; await new Promise((r) => setTimeout(r, 100))) {
    const ok = await fetch(`http://127.0.0.1:${endpointPort}/__lbheartbeat__`).then((r) => r.ok, () => false)
    if (ok) return
  }
  throw new Error("the server did not come up")
}

const exited = (child: ChildProcess) => new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)))

const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}

describe("stopping a server", () => {
  it("SIGTERM: a clean stop, exit code 0", async () => {
    const { endpoint, flags } = await args()
    const child = spawn(process.execPath, [join(root, "src/bin/autopush.ts"), ...flags], { cwd: workDir(), stdio: "ignore" })
    const code = exited(child)
    await up(endpoint)
    child.kill("SIGTERM")
    expect(await code).toBe(0)
  }, 60_000)

  it("its parent killed: it stops by itself within seconds", async () => {
    const { endpoint, flags } = await args()
    // A parent like `npm start`'s shell: it starts the server, then is killed outright.
    const parent = spawn("sh", ["-c", `"${process.execPath}" "${join(root, "src/bin/autopush.ts")}" ${flags.join(" ")} & echo $!; wait`], {
      cwd: workDir(),
      stdio: ["ignore", "pipe", "ignore"]
    })
    const pid = await new Promise<number>((resolve) => parent.stdout.once("data", (chunk: Buffer) => resolve(Number(chunk.toString().trim()))))
    await up(endpoint)
    parent.kill("SIGKILL")
    for (const deadline = Date.now() + 15_000; alive(pid) && Date.now() < deadline; await new Promise((r) => setTimeout(r, 100)));
    const orphaned = alive(pid)
    if (orphaned) process.kill(pid, "SIGKILL")
    expect(orphaned, "the orphaned server was still running").toBe(false)
  }, 60_000)

  it.each(["HTTP/1.1", "HTTP/2"])("SIGTERM with a push in flight (%s): the push is still answered 201 and its message kept, then the server stops", async (version) => {
    const { port, endpoint, flags } = await args()
    const dir = workDir()
    const start = () => spawn(process.execPath, [join(root, "src/bin/autopush.ts"), ...flags], { cwd: dir, stdio: "ignore" })
    let child = start()
    let code = exited(child)
    await up(endpoint)
    const client = await openClient(`ws://127.0.0.1:${port}/`)
    client.send({ messageType: "hello", use_webpush: true })
    const uaid = (await client.next((f) => f["messageType"] === "hello"))["uaid"] as string
    client.send({ messageType: "register", channelID: crypto.randomUUID() })
    const pushEndpoint = new URL((await client.next((f) => f["messageType"] === "register"))["pushEndpoint"] as string)
    await client.close()

    // The push's headers and half its body, then SIGTERM while the endpoint waits for the rest.
    const body = Buffer.from("in flight")
    const headers = { ttl: "600", "content-encoding": "aes128gcm", "content-length": String(body.length) }
    const answered = new Promise<number>((resolve, reject) => {
      const rest = (end: (chunk: Buffer) => void) =>
        setTimeout(() => {
          child.kill("SIGTERM")
          setTimeout(() => end(body.subarray(4)), 1_000)
        }, 300)
      if (version === "HTTP/2") {
        const session = connect(`http://127.0.0.1:${endpoint}`)
        session.on("error", reject)
        const stream = session.request({ ":method": "POST", ":path": pushEndpoint.pathname, ...headers })
        stream.on("response", (h) => {
          resolve(Number(h[":status"]))
          session.close()
        })
        stream.on("error", reject)
        stream.write(body.subarray(0, 4))
        rest((chunk) => stream.end(chunk))
        return
      }
      const req = request({ host: "127.0.0.1", port: endpoint, method: "POST", path: pushEndpoint.pathname, headers, agent: false }, (res) => {
        res.resume()
        resolve(res.statusCode ?? 0)
      })
      req.on("error", reject)
      req.write(body.subarray(0, 4))
      rest((chunk) => req.end(chunk))
    })
    expect(await answered).toBe(201)
    expect(await code).toBe(0)

    // The message was kept: the client gets it from the restarted server.
    child = start()
    code = exited(child)
    await up(endpoint)
    const back = await openClient(`ws://127.0.0.1:${port}/`)
    back.send({ messageType: "hello", use_webpush: true, uaid })
    expect((await back.next((f) => f["messageType"] === "hello"))["uaid"]).toBe(uaid)
    const notification = await back.next((f) => f["messageType"] === "notification")
    expect(Buffer.from(notification["data"] as string, "base64url").toString()).toBe("in flight")
    await back.close()
    child.kill("SIGTERM")
    expect(await code).toBe(0)
  }, 60_000)
})
