/**
 * The all-in-one with the endpoint's own TLS (`endpoint_tls_cert`): the endpoint port speaks HTTPS,
 * the WebSocket port stays plain, and both the ready line and the console's config.json advertise
 * the `ws://` URL that really answers (a client given it connects and says hello).
 */
import { type ChildProcess, spawn } from "node:child_process"
import { mkdtempSync, rmSync, writeFileSync } from "node:fs"
import * as https from "node:https"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "vitest"
import WebSocket from "ws"
import { selfSigned } from "../bridges/fake-apns.ts"
import { allInOneFlags, freePorts } from "./servers.ts"

const root = new URL("../../", import.meta.url).pathname

/** GET over HTTPS, trusting the test's self-signed certificate. */
const getJson = (url: string): Promise<unknown> =>
  new Promise((resolve, reject) => {
    https.get(url, { rejectUnauthorized: false }, (res) => {
      let body = ""
      res.on("data", (chunk: Buffer) => (body += chunk.toString()))
      res.on("end", () => {
        try {
          resolve(JSON.parse(body))
        } catch (error) {
          reject(new Error(`${url}: ${res.statusCode} ${body} (${String(error)})`))
        }
      })
    }).on("error", reject)
  })

/** Opens `url` as a push client and says hello: the status of the server's answer. */
const hello = (url: string): Promise<number> =>
  new Promise((resolve, reject) => {
    const socket = new WebSocket(url, "push-notification")
    socket.on("open", () => socket.send(JSON.stringify({ messageType: "hello", use_webpush: true })))
    socket.on("message", (data: Buffer) => {
      socket.close()
      resolve((JSON.parse(data.toString()) as { status: number }).status)
    })
    socket.on("error", reject)
  })

describe("endpoint TLS of its own", () => {
  it("the ready line and the console advertise ws:// (what the WebSocket port speaks), and it answers", async () => {
    const cwd = mkdtempSync(join(tmpdir(), "autopush-tls-"))
    const { cert, key } = selfSigned("localhost")
    writeFileSync(join(cwd, "cert.pem"), cert)
    writeFileSync(join(cwd, "key.pem"), key, { mode: 0o600 })
    const [ws, router, endpoint] = (await freePorts(3)) as [number, number, number]
    const output: Array<string> = []
    const child: ChildProcess = spawn(process.execPath, [
      join(root, "src/bin/autopush.ts"),
      ...allInOneFlags({ ws, router, endpoint }),
      "--endpoint-scheme", "https",
      "--endpoint-tls-cert", "cert.pem",
      "--endpoint-tls-key", "key.pem"
    ], { cwd, stdio: ["ignore", "pipe", "pipe"] })
    const collect = (chunk: Buffer) => output.push(...chunk.toString().split("\n").filter((line) => line !== ""))
    child.stdout?.on("data", collect)
    child.stderr?.on("data", collect)
    const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()))
    try {
      const ready = await new Promise<string>((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`no ready line; output:\n${output.join("\n")}`)), 30_000)
        const check = () => {
          const line = output.map((l) => (l.startsWith("{") ? (JSON.parse(l) as { Fields: { msg: string } }).Fields.msg : l)).find((m) => m.startsWith("ready: "))
          if (line === undefined) return
          clearTimeout(timer)
          resolve(line)
        }
        child.stdout?.on("data", check)
        child.once("exit", () => reject(new Error(`the server exited; output:\n${output.join("\n")}`)))
      })
      const advertised = `ws://127.0.0.1:${ws}/`
      assert.include(ready, `WebSocket ${advertised} · Web Push API https://127.0.0.1:${endpoint}/wpush/…`)
      const config = (await getJson(`https://127.0.0.1:${endpoint}/console/config.json`)) as { websocketUrl: string; endpointUrl: string }
      assert.strictEqual(config.websocketUrl, advertised)
      assert.strictEqual(config.endpointUrl, `https://127.0.0.1:${endpoint}`)
      assert.strictEqual(await hello(config.websocketUrl), 200)
    } finally {
      child.kill("SIGTERM")
      await exited
      rmSync(cwd, { recursive: true, force: true })
    }
  }, 60_000)
})
