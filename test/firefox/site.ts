/**
 * The web app the tests drive in Firefox, on 127.0.0.1 (a secure context for service workers):
 *
 * - `/t/<scope>/` a page with `pushTest.subscribe(key?)`, `pushTest.unsubscribe()` and
 *   `pushTest.current()`; it registers `/t/<scope>/sw.js`, so every scope is its own service worker
 *   and its own push subscription (one per test, all on one Firefox profile and uaid);
 * - the service worker reports each `push` (with `event.data.text()` or null) and
 *   `pushsubscriptionchange` event by POSTing JSON to `/report`. The channel does not depend on an
 *   open page: pushes delivered right after a browser restart are reported too.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http"

export interface Report {
  readonly scope: string
  readonly type: "push" | "pushsubscriptionchange"
  /** The push payload as text, or null when the push had no data. */
  readonly data?: string | null
  readonly oldEndpoint?: string | null
  readonly newEndpoint?: string | null
  /** When the test server got it (ms since epoch). */
  readonly at: number
}

export interface Site {
  readonly origin: string
  /** The page URL of a scope. */
  readonly pageUrl: (scope: string) => string
  readonly reports: Array<Report>
  /** Reports of one scope, in arrival order. */
  readonly reportsOf: (scope: string) => Array<Report>
  /** Resolves with the reports of `scope` once `done` holds for them; rejects after `timeoutMs`. */
  readonly waitFor: (scope: string, done: (reports: ReadonlyArray<Report>) => boolean, timeoutMs?: number) => Promise<Array<Report>>
  readonly close: () => Promise<void>
}

const page = `<!doctype html>
<meta charset="utf-8">
<title>push e2e</title>
<script>
  const pushTest = {
    async registration() {
      await navigator.serviceWorker.register("sw.js")
      return navigator.serviceWorker.ready
    },
    async subscribe(key) {
      const registration = await pushTest.registration()
      // key: the VAPID public key in base64url, handed to Firefox as bytes
      const bytes = (b64url) => Uint8Array.from(atob(b64url.replace(/-/g, "+").replace(/_/g, "/")), (c) => c.charCodeAt(0))
      const options = key === undefined ? { userVisibleOnly: true } : { userVisibleOnly: true, applicationServerKey: bytes(key) }
      const subscription = await registration.pushManager.subscribe(options)
      return subscription.toJSON()
    },
    async current() {
      const registration = await pushTest.registration()
      const subscription = await registration.pushManager.getSubscription()
      return subscription === null ? null : subscription.toJSON()
    },
    async unsubscribe() {
      const registration = await pushTest.registration()
      const subscription = await registration.pushManager.getSubscription()
      return subscription === null ? "no subscription" : subscription.unsubscribe()
    }
  }
  window.pushTest = pushTest
</script>
`

const serviceWorker = `
const report = (body) =>
  fetch("/report", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ scope: new URL(self.registration.scope).pathname, ...body }) })
self.addEventListener("install", () => self.skipWaiting())
self.addEventListener("activate", (event) => event.waitUntil(self.clients.claim()))
self.addEventListener("push", (event) => {
  event.waitUntil(report({ type: "push", data: event.data === null ? null : event.data.text() }))
})
self.addEventListener("pushsubscriptionchange", (event) => {
  event.waitUntil(report({
    type: "pushsubscriptionchange",
    oldEndpoint: event.oldSubscription ? event.oldSubscription.endpoint : null,
    newEndpoint: event.newSubscription ? event.newSubscription.endpoint : null
  }))
})
`

const scopePath = (scope: string) => `/t/${scope}/`

export const startSite = async (): Promise<Site> => {
  const reports: Array<Report> = []
  const listeners = new Set<() => void>()

  const handle = (req: IncomingMessage, res: ServerResponse) => {
    const url = new URL(req.url ?? "/", "http://127.0.0.1")
    const send = (status: number, type: string, body: string) => {
      res.writeHead(status, { "content-type": type, "cache-control": "no-store" })
      res.end(body)
    }
    if (req.method === "POST" && url.pathname === "/report") {
      const chunks: Array<Buffer> = []
      req.on("data", (c: Buffer) => chunks.push(c))
      req.on("end", () => {
        try {
          reports.push({ ...(JSON.parse(Buffer.concat(chunks).toString()) as Omit<Report, "at">), at: Date.now() })
          for (const l of listeners) l()
          send(204, "text/plain", "")
        } catch {
          send(400, "text/plain", "bad report")
        }
      })
      return
    }
    if (req.method === "GET" && /^\/t\/[\w-]+\/$/.test(url.pathname)) return send(200, "text/html; charset=utf-8", page)
    if (req.method === "GET" && /^\/t\/[\w-]+\/sw\.js$/.test(url.pathname)) return send(200, "text/javascript", serviceWorker)
    send(404, "text/plain", "not found")
  }

  const server: Server = createServer(handle)
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject)
    server.listen(0, "127.0.0.1", () => resolve())
  })
  const { port } = server.address() as { port: number }
  const origin = `http://127.0.0.1:${port}`
  const reportsOf = (scope: string) => reports.filter((r) => r.scope === scopePath(scope))

  return {
    origin,
    pageUrl: (scope) => `${origin}${scopePath(scope)}`,
    reports,
    reportsOf,
    waitFor: (scope, done, timeoutMs = 15_000) =>
      new Promise((resolve, reject) => {
        const check = () => {
          const mine = reportsOf(scope)
          if (!done(mine)) return false
          cleanup()
          resolve(mine)
          return true
        }
        const timer = setTimeout(() => {
          cleanup()
          reject(new Error(`timed out after ${timeoutMs} ms waiting for the service worker of ${scope}; it reported ${JSON.stringify(reportsOf(scope))}`))
        }, timeoutMs)
        const listener = () => void check()
        const cleanup = () => {
          clearTimeout(timer)
          listeners.delete(listener)
        }
        listeners.add(listener)
        check()
      }),
    close: () =>
      new Promise((resolve) => {
        server.closeAllConnections()
        server.close(() => resolve())
      })
  }
}
