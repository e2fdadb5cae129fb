/**
 * The web console in real Firefox (headless, no browser setup beyond what every test profile has):
 * the page at GET / on the endpoint's port connects to the WebSocket, registers, makes its keys with
 * WebCrypto and shows its subscription; its form encrypts (aes128gcm) and sends a push with VAPID,
 * which arrives, is decrypted and acked in the page; an aesgcm push from `web-push` is decrypted
 * too; the status panel is live. Each push from the form asks for a receipt, and its state is shown
 * as it changes (stored while a minimum urgency holds it, then acknowledged; expired when TTL 0). The page loads nothing from elsewhere, and its Content-Security-
 * Policy blocks inline script. Opened over plain http from another address than localhost (no Web
 * Crypto there), it says why and what to do. The browser check page subscribes with Firefox's own push service.
 *
 * Run: `npm run test:e2e` (needs `firefox-esr` on the PATH, or FIREFOX_BIN).
 */
import { afterAll, assert, beforeAll, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { execFileSync } from "node:child_process"
import { mkdtempSync, rmSync } from "node:fs"
import { networkInterfaces, tmpdir } from "node:os"
import { join } from "node:path"
import type { Page } from "puppeteer-core"
import webpush from "web-push"
import { expireReceiptSubscriptions } from "../e2e/receiptStore.ts"
import { type Deployment, startAllInOne } from "../e2e/servers.ts"
import { type Firefox, launchFirefox } from "./firefox.ts"

interface SubscriptionJSON {
  readonly endpoint: string
  readonly keys: { readonly p256dh: string; readonly auth: string }
}

const text = (page: Page, selector: string) => page.$eval(selector, (e) => e.textContent ?? "")

/** The texts of the received list, newest first. */
const received = (page: Page) => page.$$eval("#received li .text", (items) => items.map((e) => e.textContent ?? ""))

/** Until the push sent from the form with `message` shows `state` in the sent list. */
const sentState = (page: Page, message: string, state: string) =>
  page.waitForFunction(
    `[...document.querySelectorAll("#sent li")].some((li) => li.querySelector(".text")?.textContent === ${JSON.stringify(message)} && li.querySelector(".state")?.textContent === ${JSON.stringify(state)})`,
    { timeout: 15_000 }
  )

describe("web console", () => {
  let deployment: Deployment
  let firefox: Firefox
  let profileDir: string
  const log: Array<string> = []

  beforeAll(async () => {
    deployment = await startAllInOne()
    profileDir = mkdtempSync(join(tmpdir(), "autopush-firefox-console-"))
    firefox = await launchFirefox({ profileDir, pushUrl: deployment.wsUrl, log })
  }, 90_000)
  afterAll(async () => {
    await firefox?.close()
    await deployment?.stop()
    if (profileDir !== undefined) rmSync(profileDir, { recursive: true, force: true })
  }, 60_000)

  const live = (title: string, body: () => Promise<void>) =>
    it.live(title, () =>
      Effect.tryPromise({
        try: body,
        catch: (e) => new Error(`${e instanceof Error ? (e.stack ?? e.message) : String(e)}\n--- server output (last 40 lines) ---\n${deployment.output.slice(-40).join("\n")}\n--- Firefox (last 20 lines) ---\n${log.slice(-20).join("\n")}`)
      }), 60_000)

  live("subscribes, sends a VAPID-signed aes128gcm push from its form, decrypts and acks it; decrypts an aesgcm push from web-push; shows live status", async () => {
    const page = await firefox.browser.newPage()
    const requested: Array<string> = []
    page.on("request", (request) => void requested.push(request.url()))
    try {
      await page.goto(`${deployment.endpointUrl}/`)
      await page.waitForSelector('body[data-state="subscribed"]', { timeout: 15_000 })
      const subscription = JSON.parse(await text(page, "#subscription")) as SubscriptionJSON
      assert.match(subscription.endpoint, new RegExp(`^${deployment.endpointUrl}/wpush/v1/`))
      assert.strictEqual(Buffer.from(subscription.keys.p256dh, "base64url").length, 65)
      assert.strictEqual(Buffer.from(subscription.keys.auth, "base64url").length, 16)
      assert.include(await text(page, "#send-command"), `npm run push -- send --subscription '${JSON.stringify(subscription)}'`)

      // The form: message, TTL, Topic, Urgency, VAPID.
      const message = "Hello from Firefox's console ✓"
      await page.evaluate(`document.querySelector("#send-text").value = ""`)
      await page.type("#send-text", message)
      await page.type("#send-topic", "greeting")
      await page.select("#send-urgency", "high")
      await page.click("#send-vapid")
      await page.click("#send-button")
      await page.waitForFunction(`[...document.querySelectorAll("#received li .text")].some((e) => e.textContent === ${JSON.stringify(message)})`, { timeout: 15_000 })
      assert.match(await text(page, "#send-result"), new RegExp(`^202 .*Location: ${deployment.endpointUrl}/m/`))
      assert.notInclude(await text(page, "#send-result"), "Autopush-Warning", "the console's own VAPID contact draws no warning")
      assert.include(await text(page, "#received li .meta"), "topic greeting · urgency high · aes128gcm · acked")
      // Its receipt: the page's own client acked it.
      await sentState(page, message, "acknowledged")
      assert.match(await text(page, "#sent li .meta"), /delivered \d+ ms, acknowledged \d+ ms after the push \(code 100\)$/)
      assert.isTrue(requested.some((url) => new URL(url).pathname.startsWith("/receipts/")), "the page listens on its receipt subscription")

      // From an application server: aesgcm, with web-push.
      const details = webpush.generateRequestDetails(subscription, "aesgcm from web-push", { TTL: 60, contentEncoding: "aesgcm" })
      const headers = Object.fromEntries(Object.entries(details.headers).map(([k, v]) => [k, String(v)]))
      const res = await fetch(details.endpoint, { method: "POST", headers, body: details.body! })
      assert.strictEqual(res.status, 201)
      await page.waitForFunction(`document.querySelector("#received li .text")?.textContent === "aesgcm from web-push"`, { timeout: 15_000 })
      assert.deepStrictEqual(await received(page), ["aesgcm from web-push", message])
      // The connection node got the page's acks (its debug log has the client's frames).
      await new Promise((resolve) => setTimeout(resolve, 300))
      assert.isAtLeast(deployment.output.filter((line) => line.includes('"messageType":"ack"')).length, 2)

      // Status: live, this server's version, this page among the clients, a rate.
      await page.waitForFunction(`document.querySelector("#live")?.textContent === "live" && /^\\d/.test(document.querySelector("#status-rate")?.textContent ?? "")`, { timeout: 10_000 })
      const commit = execFileSync("git", ["rev-parse", "HEAD"], { cwd: new URL("../../", import.meta.url).pathname, encoding: "utf8" }).trim()
      assert.strictEqual(await text(page, "#status-version"), `0.1.0 (${commit.slice(0, 12)})`)
      assert.isAtLeast(Number(await text(page, "#status-clients")), 1)
      assert.match(await text(page, "#status-uptime"), /^\d+[smhd]/)

      // Nothing from elsewhere; inline script is refused by the Content-Security-Policy.
      // (The WebSocket handshake is reported as an http:// request to the WebSocket's host and port.)
      const allowed = [deployment.endpointUrl, new URL(deployment.wsUrl.replace(/^ws/, "http")).origin]
      const elsewhere = requested.filter((url) => !allowed.includes(new URL(url).origin))
      assert.deepStrictEqual(elsewhere, [], `requests outside ${allowed.join(", ")}`)
      const inlineRan = await page.evaluate(`(() => {
        const script = document.createElement("script")
        script.textContent = "document.body.dataset.inline = 'ran'"
        document.body.append(script)
        return document.body.dataset.inline === "ran"
      })()`)
      assert.isFalse(inlineRan)
    } finally {
      await page.close()
    }
  })

  live("a message too large for max_data_bytes is refused in the page, the largest that fits is accepted; the send form and its sent list fit their card at 400, 800 and 1280 px", async () => {
    const page = await firefox.browser.newPage()
    try {
      await page.goto(`${deployment.endpointUrl}/`)
      await page.waitForSelector('body[data-state="subscribed"]', { timeout: 15_000 })
      // The all-in-one's max_data_bytes is 4096: 3993 bytes of message, encrypted, are 4096.
      const fill = async (bytes: number) => {
        await page.evaluate(`(() => {
          const text = document.querySelector("#send-text")
          text.value = "x".repeat(${bytes})
          text.dispatchEvent(new Event("input"))
        })()`)
      }
      await fill(3994)
      assert.strictEqual(await text(page, "#send-size"), "3994 of 3993 bytes")
      await page.click("#send-button")
      await page.waitForFunction(`document.querySelector("#send-result").textContent.startsWith("Not sent")`, { timeout: 5_000 })
      assert.strictEqual(
        await text(page, "#send-result"),
        "Not sent: the message is 3994 bytes; this server takes at most 3993 (its max_data_bytes, once encrypted)"
      )
      await fill(3993)
      assert.strictEqual(await text(page, "#send-size"), "3993 of 3993 bytes")
      await page.click("#send-button")
      await page.waitForFunction(`document.querySelector("#send-result").textContent.startsWith("202")`, { timeout: 15_000 })
      await page.waitForFunction(`document.querySelector("#received li .text")?.textContent === "x".repeat(3993)`, { timeout: 15_000 })
      await sentState(page, "x".repeat(3993), "acknowledged")

      for (const width of [400, 800, 1280]) {
        await page.setViewport({ width, height: 900 })
        const overflow = await page.evaluate(`(() => {
          const card = document.querySelector("#send-panel").getBoundingClientRect()
          const wider = [...document.querySelectorAll("#send-panel *")].filter((e) => e.getBoundingClientRect().right > card.right + 0.5)
          return { wider: wider.map((e) => e.id || e.className || e.tagName), page: document.documentElement.scrollWidth - window.innerWidth }
        })()`) as { wider: Array<string>; page: number }
        assert.deepStrictEqual(overflow.wider, [], `wider than the send card at ${width} px`)
        assert.isAtMost(overflow.page, 0, `the page scrolls sideways at ${width} px`)
      }
    } finally {
      await page.close()
    }
  })

  live("laid out for the screen: at 1280×900 the cards fill the width with no empty column beside any, and Received starts above the fold; at 400 px they stack in one column", async () => {
    const page = await firefox.browser.newPage()
    try {
      await page.setViewport({ width: 1280, height: 900 })
      await page.goto(`${deployment.endpointUrl}/`)
      await page.waitForSelector('body[data-state="subscribed"]', { timeout: 15_000 })
      // The cards' boxes (page coordinates, scrolled to the top), and the content box of the page's main.
      const layout = () =>
        page.evaluate(`(() => {
          window.scrollTo(0, 0)
          const main = document.querySelector("main")
          const box = main.getBoundingClientRect()
          const style = getComputedStyle(main)
          const cards = [...main.querySelectorAll(":scope > section")].map((e) => {
            const r = e.getBoundingClientRect()
            return { id: e.id, left: r.left, right: r.right, top: r.top, bottom: r.bottom }
          })
          return {
            page: document.documentElement.clientWidth,
            main: { left: box.left, right: box.right },
            content: { left: box.left + parseFloat(style.paddingLeft), right: box.right - parseFloat(style.paddingRight) },
            cards,
            received: document.querySelector("#received").getBoundingClientRect().top
          }
        })()`) as Promise<{
          page: number
          main: { left: number; right: number }
          content: { left: number; right: number }
          cards: Array<{ id: string; left: number; right: number; top: number; bottom: number }>
          received: number
        }>

      const wide = await layout()
      assert.isBelow(wide.received, 900, "the Received list starts above the fold at 1280×900")
      assert.isAtMost(wide.main.left, 0.5, "no empty margin beside the cards")
      assert.isAtLeast(wide.main.right, wide.page - 0.5, "no empty margin beside the cards")
      for (const card of wide.cards) {
        assert.isAtMost(card.right, wide.content.right + 0.5, `#${card.id} within the content`)
        // Short of the right edge, another card is beside it: no empty column to its right.
        const beside = wide.cards.some((other) => other.left >= card.right && other.top < card.bottom && other.bottom > card.top)
        assert.isTrue(card.right >= wide.content.right - 1 || beside, `an empty column beside #${card.id}: ${JSON.stringify(wide)}`)
      }
      assert.isAtLeast(new Set(wide.cards.map((card) => Math.round(card.left))).size, 3, "three columns at 1280 px")

      await page.setViewport({ width: 400, height: 800 })
      const narrow = await layout()
      const [first, ...rest] = narrow.cards
      for (const [i, card] of rest.entries()) {
        assert.approximately(card.left, first!.left, 0.5, `#${card.id} in the one column at 400 px`)
        assert.approximately(card.right, first!.right, 0.5, `#${card.id} in the one column at 400 px`)
        assert.isAtLeast(card.top, narrow.cards[i]!.bottom, `#${card.id} below #${narrow.cards[i]!.id} at 400 px`)
      }
      assert.isAtLeast(first!.right - first!.left, narrow.content.right - narrow.content.left - 0.5, "the cards take the width at 400 px")
    } finally {
      await page.close()
    }
  })

  live("a minimum urgency (RFC 8030 §5.3) holds less urgent pushes on the server until it is lowered: stored, then acknowledged; a held TTL 0 push expires", async () => {
    const page = await firefox.browser.newPage()
    try {
      await page.goto(`${deployment.endpointUrl}/`)
      await page.waitForSelector('body[data-state="subscribed"]', { timeout: 15_000 })
      await page.select("#min-urgency", "high")
      await page.waitForFunction(`document.querySelector("#min-urgency-status").textContent.startsWith("less urgent pushes wait")`, { timeout: 5_000 })
      await page.evaluate(`document.querySelector("#send-text").value = "held back"`)
      await page.select("#send-urgency", "normal")
      await page.click("#send-button")
      await page.waitForFunction(`document.querySelector("#send-result").textContent.startsWith("202")`, { timeout: 15_000 })
      await sentState(page, "held back", "stored")
      await page.evaluate(`document.querySelector("#send-text").value = "held back, TTL 0"`)
      await page.evaluate(`document.querySelector("#send-ttl").value = "0"`)
      await page.click("#send-button")
      await sentState(page, "held back, TTL 0", "expired")
      assert.include(await text(page, "#sent li .meta"), "never delivered")
      assert.notInclude(await received(page), "held back")
      await page.select("#min-urgency", "very-low")
      await page.waitForFunction(`document.querySelector("#received li .text")?.textContent === "held back"`, { timeout: 15_000 })
      assert.include(await text(page, "#received li .meta"), "urgency normal")
      assert.strictEqual(await text(page, "#min-urgency-status"), "every push is delivered")
      await sentState(page, "held back", "acknowledged")
      assert.notInclude(await received(page), "held back, TTL 0")
    } finally {
      await page.close()
    }
  })

  live("opened over plain http from another address than localhost (no Web Crypto there): says why and what to do, makes no keys", async () => {
    const address = Object.values(networkInterfaces()).flat().find((i) => i !== undefined && i.family === "IPv4" && !i.internal)?.address
    if (address === undefined) return console.log("skipped: this machine has no address but the loopback")
    const remote = await startAllInOne(["--bind-host", "0.0.0.0"])
    const page = await firefox.browser.newPage()
    try {
      const port = new URL(remote.endpointUrl).port
      const wsPort = new URL(remote.wsUrl).port
      await page.goto(`http://${address}:${port}/`)
      await page.waitForSelector('body[data-state="unusable"]', { timeout: 15_000 })
      const problem = await text(page, "#page-problem")
      assert.include(problem, `browsers give it only to pages opened over https or from localhost; this one was opened as http://${address}:${port}`)
      assert.include(problem, `http://localhost:${port}/ through an SSH tunnel (ssh -L ${port}:${address}:${port} -L ${wsPort}:${address}:${wsPort} ${address})`)
      assert.isFalse(await page.evaluate(`document.querySelector("#page-problem").hidden`))
      assert.notInclude(await text(page, "#connection"), "generateKey")
    } finally {
      await page.close()
      await remote.stop()
    }
  })

  live("the browser check: Firefox's own push service (pointed at this server) subscribes, and a push sent from the page reaches its service worker", async () => {
    const page = await firefox.browser.newPage()
    try {
      await page.goto(`${deployment.endpointUrl}/console/demo/`)
      await page.waitForSelector('body[data-state="ready"]', { timeout: 15_000 })
      await page.click("#demo-subscribe")
      await page.waitForSelector('body[data-state="subscribed"]', { timeout: 15_000 })
      assert.strictEqual(await text(page, "#demo-verdict"), `This browser's push service is this server: its endpoint is on ${deployment.endpointUrl}.`)
      const subscription = JSON.parse(await text(page, "#demo-subscription")) as SubscriptionJSON
      assert.match(subscription.endpoint, new RegExp(`^${deployment.endpointUrl}/wpush/v1/`))
      await page.evaluate(`document.querySelector("#demo-text").value = "through Firefox's push service"`)
      await page.click("#demo-send")
      await page.waitForFunction(`[...document.querySelectorAll("#demo-received li")].some((e) => e.textContent === "through Firefox's push service")`, { timeout: 15_000 })
      assert.match(await text(page, "#demo-result"), /^201 · sent/)
      await page.evaluate(`(async () => (await (await navigator.serviceWorker.ready).pushManager.getSubscription())?.unsubscribe())()`)
    } finally {
      await page.close()
    }
  })

  live("a receipt subscription that expires is replaced: the page says so, makes a new one, and its pushes still get their receipts", async () => {
    // Listening renews a subscription: it is made to expire in storage, as its idle time running out would.
    const short = await startAllInOne()
    const page = await firefox.browser.newPage()
    try {
      await page.goto(`${short.endpointUrl}/`)
      await page.waitForSelector('body[data-state="subscribed"]', { timeout: 15_000 })
      await page.waitForFunction(`document.querySelector("#receipts-status").textContent.startsWith("Each push asks for a receipt")`, { timeout: 15_000 })
      assert.isAtLeast(await expireReceiptSubscriptions(short), 1)
      await page.waitForFunction(`document.querySelector("#receipts-status").textContent.startsWith("The receipt subscription is gone")`, { timeout: 15_000 })
      await page.waitForFunction(`document.querySelector("#receipts-status").textContent.startsWith("Each push asks for a receipt")`, { timeout: 15_000 })
      await page.click("#send-button")
      await sentState(page, "Hello from the console", "acknowledged")
    } finally {
      await page.close()
      await short.stop()
    }
  })

  live("with console_token: refused without it; opened as /?token=…, the page passes it on (subscribes, status live); receipts need no token", async () => {
    const guarded = await startAllInOne(["--console-token", "console-token-for-firefox"])
    const page = await firefox.browser.newPage()
    try {
      const refused = await page.goto(`${guarded.endpointUrl}/`)
      assert.strictEqual(refused?.status(), 401)
      assert.include(await page.evaluate("document.body.textContent"), "Invalid console token")
      await page.goto(`${guarded.endpointUrl}/?token=console-token-for-firefox`)
      await page.waitForSelector('body[data-state="subscribed"]', { timeout: 15_000 })
      await page.waitForFunction(`document.querySelector("#live")?.textContent === "live"`, { timeout: 10_000 })
      assert.strictEqual(await text(page, "#send-size"), `${"Hello from the console".length} of 3993 bytes`)
      await page.click("#send-button")
      await sentState(page, "Hello from the console", "acknowledged")
      assert.isFalse(guarded.output.some((line) => line.includes("console-token-for-firefox")), "the token is not logged")
    } finally {
      await page.close()
      await guarded.stop()
    }
  })
})
