/**
 * The browser check (/console/demo/) where a browser will not subscribe: the page says what the
 * check is for before anything fails, and a refusal is explained in words (Chromium and Safari,
 * whose push service cannot be this server; blocked notifications; Firefox's push service not
 * answering), with the browser's own message kept. The page's script (src/console/static/demo.js)
 * runs here in Node against a small stand-in for the DOM and the browser's Push API.
 */
import { readFileSync } from "node:fs"
import { afterEach, assert, describe, it, vi } from "vitest"
import { subscribeProblem } from "../../src/console/static/checks.js"

const CHROMIUM = "Registration failed - missing applicationServerKey, and manifest empty or missing"

describe("subscribeProblem", () => {
  it("Chromium and Safari (an application server key wanted): their maker's push service, what the check is for, where to go instead", () => {
    for (const error of [new DOMException(CHROMIUM, "AbortError"), new TypeError("Subscribing for push requires an applicationServerKey")]) {
      const problem = subscribeProblem(error)
      assert.include(problem, "This browser subscribes only through its maker's push service")
      assert.include(problem, "This check is for a browser whose push service is this server: Firefox with dom.push.serverURL")
      assert.include(problem, "use the console at / instead")
      assert.include(problem, `(the browser said: ${error.message})`)
    }
  })

  it("notifications blocked: says where to allow them", () => {
    const problem = subscribeProblem(new DOMException("The request is not allowed by the user agent or the platform in the current context.", "NotAllowedError"))
    assert.match(problem, /^The browser does not allow this page to subscribe: notifications are blocked for this site\. Allow them/)
    assert.include(subscribeProblem(new DOMException("Registration failed - permission denied", "NotAllowedError")), "notifications are blocked")
  })

  it("Firefox whose push service does not answer: names dom.push.serverURL and the WebSocket", () => {
    const problem = subscribeProblem(new DOMException("Error retrieving push subscription.", "AbortError"))
    assert.include(problem, "The browser's push service did not give a subscription")
    assert.include(problem, "dom.push.serverURL names this server's WebSocket (ws://<host>:8080/ by default)")
  })

  it("anything else: the browser's words, and what the check needs", () => {
    const problem = subscribeProblem("something odd")
    assert.strictEqual(problem.split(" (the browser said: something odd). ").length, 2, problem)
    assert.include(problem, "This check needs a browser whose push service is this server")
  })
})

/** A DOM element as far as demo.js uses one. */
class Element {
  textContent = ""
  className = ""
  hidden = false
  disabled = false
  value = ""
  readonly dataset: Record<string, string> = {}
  readonly listeners = new Map<string, (event: unknown) => unknown>()
  addEventListener(type: string, listener: (event: unknown) => unknown) {
    this.listeners.set(type, listener)
  }
  prepend() {}
}

const globalsSet = ["document", "window", "location", "isSecureContext", "navigator", "PushManager"] as const
const saved = new Map(globalsSet.map((name) => [name, Object.getOwnPropertyDescriptor(globalThis, name)]))

afterEach(() => {
  for (const [name, descriptor] of saved) {
    if (descriptor === undefined) delete (globalThis as Record<string, unknown>)[name]
    else Object.defineProperty(globalThis, name, descriptor)
  }
})

/** Runs demo.js on http://localhost:8082/console/demo/ in a browser whose `subscribe` rejects with `refusal`, until it has started. */
const openDemo = async (refusal: unknown) => {
  const elements = new Map<string, Element>()
  const element = (id: string) => elements.get(id) ?? elements.set(id, new Element()).get(id)!
  const body = new Element()
  const define = (name: string, value: unknown) => Object.defineProperty(globalThis, name, { value, configurable: true, writable: true })
  const registration = { pushManager: { getSubscription: async () => null, subscribe: () => Promise.reject(refusal) } }
  define("document", { getElementById: element, createElement: () => new Element(), body })
  define("location", new URL("http://localhost:8082/console/demo/"))
  define("isSecureContext", true)
  define("window", globalThis)
  define("PushManager", class {})
  define("navigator", { serviceWorker: { register: async () => registration, ready: Promise.resolve(registration), addEventListener() {} } })
  vi.resetModules()
  await import(new URL("../../src/console/static/demo.js", import.meta.url).href)
  for (let i = 0; i < 200 && body.dataset["state"] !== "ready"; i++) await new Promise((resolve) => setTimeout(resolve, 10))
  return { element, body }
}

describe("the browser check's script", () => {
  it("before subscribing, says a subscription comes from the browser's push service; a Chromium refusal is explained in words", async () => {
    const page = await openDemo(new DOMException(CHROMIUM, "AbortError"))
    assert.strictEqual(page.body.dataset["state"], "ready", page.element("demo-verdict").textContent)
    assert.match(page.element("demo-verdict").textContent, /^Not subscribed yet\. Subscribing asks the browser's push service/)
    await page.element("demo-subscribe").listeners.get("click")!({})
    const verdict = page.element("demo-verdict")
    assert.strictEqual(verdict.className, "error")
    assert.include(verdict.textContent, "This browser subscribes only through its maker's push service")
    assert.include(verdict.textContent, `(the browser said: ${CHROMIUM})`)
    assert.isFalse(page.element("demo-subscribe").disabled, "it may be tried again")
  })

  it("the page itself says, first, which browsers the check is for", () => {
    const html = readFileSync(new URL("../../src/console/static/demo.html", import.meta.url), "utf8")
    const intro = html.slice(html.indexOf("<header>"), html.indexOf("</header>"))
    assert.include(intro, "<strong>This check is for a browser whose push service is this server</strong>")
    assert.include(intro, "Chrome, Edge, other Chromium")
    assert.isBelow(intro.indexOf("This check is for"), intro.indexOf("pushManager.subscribe"), "before how it works")
  })
})
