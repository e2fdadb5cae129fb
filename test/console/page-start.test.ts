/**
 * The console page where it cannot work, said on the page: opened over plain http from another
 * machine (browsers give Web Crypto only to https and localhost), or over https with a plain ws://
 * WebSocket (browsers refuse it). The page's own script (src/console/static/app.js) runs here in
 * Node against a small stand-in for the DOM, the window and the network.
 */
import { readFileSync } from "node:fs"
import { afterEach, assert, describe, it, vi } from "vitest"
import { pageProblem } from "../../src/console/static/checks.js"

describe("pageProblem", () => {
  const subtle = {}
  it("plain http from another machine: no Web Crypto; says why and how (tunnel with both ports, or https)", () => {
    const problem = pageProblem({ isSecureContext: false, crypto: {}, location: { href: "http://10.0.0.5:8082/" } }, "ws://10.0.0.5:8080/")
    assert.isString(problem)
    assert.include(problem, "Web Crypto (crypto.subtle)")
    assert.include(problem, "only to pages opened over https or from localhost; this one was opened as http://10.0.0.5:8082")
    assert.include(problem, "http://localhost:8082/ through an SSH tunnel (ssh -L 8082:10.0.0.5:8082 -L 8080:10.0.0.5:8080 10.0.0.5)")
    assert.include(problem, "endpoint_tls_cert and endpoint_tls_key, or a TLS proxy in front of port 8082")
    // A configured websocket_url elsewhere needs no forwarding; a secure context whose crypto lacks subtle is no better.
    assert.include(pageProblem({ isSecureContext: false, location: { href: "http://push.lan/" } }, "wss://push.example.com/"), "(ssh -L 80:push.lan:80 push.lan)")
    assert.isString(pageProblem({ isSecureContext: true, crypto: {}, location: { href: "http://[fd00::5]:8082/" } }, undefined))
  })

  it("https with a plain ws:// WebSocket elsewhere: refused by browsers; says to proxy it and set websocket_url", () => {
    const problem = pageProblem({ isSecureContext: true, crypto: { subtle }, location: { href: "https://push.example.com:8082/" } }, "ws://push.example.com:8080/")
    assert.include(problem, "browsers refuse a plain WebSocket (ws://push.example.com:8080/)")
    assert.include(problem, "TLS proxy in front of port 8080 and set websocket_url to its wss:// URL")
  })

  it("https or localhost, with a WebSocket the browser allows: no problem", () => {
    for (const [href, ws] of [
      ["http://localhost:8082/", "ws://localhost:8080/"],
      ["http://127.0.0.1:8082/", "ws://127.0.0.1:8080/"],
      ["https://push.example.com/", "wss://push.example.com/"],
      ["https://localhost:8082/", "ws://localhost:8080/"]
    ] as const) {
      assert.isUndefined(pageProblem({ isSecureContext: true, crypto: { subtle }, location: { href } }, ws), href)
    }
  })
})

const html = readFileSync(new URL("../../src/console/static/index.html", import.meta.url), "utf8")

/** A DOM element as far as app.js uses one; hidden as index.html has it. */
class Element {
  textContent = ""
  className = ""
  hidden: boolean
  constructor(id = "") {
    this.hidden = id !== "" && new RegExp(`id="${id}"[^>]*\\shidden[\\s>]`).test(html)
  }
  disabled = false
  value = ""
  readonly dataset: Record<string, string> = {}
  addEventListener() {}
  prepend() {}
  append() {}
}

interface Page {
  readonly element: (id: string) => Element
  readonly sockets: ReadonlyArray<string>
  readonly body: Element
}

const realCrypto = globalThis.crypto
const globalsSet = ["document", "window", "location", "isSecureContext", "fetch", "WebSocket", "crypto"] as const
const saved = new Map(globalsSet.map((name) => [name, Object.getOwnPropertyDescriptor(globalThis, name)]))

afterEach(() => {
  for (const [name, descriptor] of saved) {
    if (descriptor === undefined) delete (globalThis as Record<string, unknown>)[name]
    else Object.defineProperty(globalThis, name, descriptor)
  }
  vi.useRealTimers()
})

/** Runs app.js as a browser would on `href`, with Web Crypto or without (`secure`), until it has started. */
const openPage = async (href: string, secure: boolean, websocketUrl: string): Promise<Page> => {
  const elements = new Map<string, Element>()
  const element = (id: string) => elements.get(id) ?? elements.set(id, new Element(id)).get(id)!
  const body = new Element()
  const sockets: Array<string> = []
  const define = (name: string, value: unknown) => Object.defineProperty(globalThis, name, { value, configurable: true, writable: true })
  define("document", { getElementById: element, createElement: () => new Element(), body })
  define("location", new URL(href))
  define("isSecureContext", secure)
  define("window", globalThis)
  // Outside a secure context the browser's crypto has no `subtle` (nor randomUUID).
  if (!secure) define("crypto", { getRandomValues: realCrypto.getRandomValues.bind(realCrypto) })
  define("WebSocket", class {
    static readonly OPEN = 1
    constructor(url: string) {
      sockets.push(url)
    }
    addEventListener() {}
    send() {}
  })
  define("fetch", async (path: string) => {
    const json = path === "/console/config.json"
      ? { websocketUrl, endpointUrl: new URL(href).origin, maxDataBytes: 4096 }
      : path === "/console/status.json"
      ? { version: "test", commit: "unknown", uptime: 1, connections: 0, notifications: 0 }
      : undefined
    if (json === undefined) throw new Error(`unexpected fetch ${path}`)
    return new Response(JSON.stringify(json), { headers: { "content-type": "application/json" } })
  })
  vi.useFakeTimers({ toFake: ["setInterval"] })
  vi.resetModules()
  await import(new URL("../../src/console/static/app.js", import.meta.url).href)
  for (let i = 0; i < 200 && sockets.length === 0 && element("connection").className !== "error"; i++) {
    await new Promise((resolve) => setTimeout(resolve, 10))
  }
  return { element, sockets, body }
}

describe("the console page's script", () => {
  it("opened as http://10.0.0.5:8082/ (no Web Crypto): shows why and what to do, and does not connect", async () => {
    const page = await openPage("http://10.0.0.5:8082/", false, "ws://10.0.0.5:8080/")
    const problem = page.element("page-problem")
    assert.isFalse(problem.hidden, `the page says: ${page.element("connection").textContent}`)
    assert.include(problem.textContent, "browsers give it only to pages opened over https or from localhost")
    assert.include(problem.textContent, "ssh -L 8082:10.0.0.5:8082 -L 8080:10.0.0.5:8080 10.0.0.5")
    assert.notInclude(page.element("connection").textContent, "generateKey")
    assert.strictEqual(page.element("connection").className, "error")
    assert.strictEqual(page.body.dataset["state"], "unusable")
    assert.deepStrictEqual(page.sockets, [])
  })

  it("opened over https with a plain ws:// WebSocket on another host: shows why, does not connect", async () => {
    const page = await openPage("https://push.example.com:8082/", true, "ws://push.example.com:8080/")
    assert.isFalse(page.element("page-problem").hidden)
    assert.include(page.element("page-problem").textContent, "set websocket_url to its wss:// URL")
    assert.deepStrictEqual(page.sockets, [])
  })

  it("opened as http://localhost:8082/: no problem shown, makes its keys and connects", async () => {
    const page = await openPage("http://localhost:8082/", true, "ws://localhost:8080/")
    assert.deepStrictEqual(page.sockets, ["ws://localhost:8080/"], page.element("connection").textContent)
    assert.isTrue(page.element("page-problem").hidden)
    assert.strictEqual(page.element("page-problem").textContent, "")
  })
})
