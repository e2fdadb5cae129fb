// The browser check: subscribe with the browser's own Push API, show whose push service made the
// endpoint, and send the subscription a push (encrypted here, as an application server would).
import { subscribeProblem } from "./checks.js"
import { sendPush } from "./webpush.js"

const $ = (id) => document.getElementById(id)
const SCOPE = "/console/demo/"
let subscription

const verdict = (text, isError = false) => {
  $("demo-verdict").textContent = text
  $("demo-verdict").className = isError ? "error" : ""
}

const show = (json) => {
  subscription = json
  $("demo-subscription").textContent = JSON.stringify(json, null, 2)
  const origin = new URL(json.endpoint).origin
  if (origin === location.origin) {
    verdict(`This browser's push service is this server: its endpoint is on ${origin}.`)
    $("demo-send").disabled = false
  } else {
    verdict(`This browser uses another push service (its endpoint is on ${origin}), so this check cannot go further. Point it at this server first (Firefox: dom.push.serverURL), or use the console at / instead: it is a push client in the page.`, true)
  }
  document.body.dataset.state = "subscribed"
}

const subscribe = async () => {
  $("demo-subscribe").disabled = true
  try {
    const registration = await navigator.serviceWorker.ready
    const existing = await registration.pushManager.getSubscription()
    show((existing ?? (await registration.pushManager.subscribe({ userVisibleOnly: true }))).toJSON())
  } catch (error) {
    verdict(subscribeProblem(error), true)
    $("demo-subscribe").disabled = false
  }
}

const send = async (event) => {
  event.preventDefault()
  if (subscription === undefined) return
  const result = $("demo-result")
  try {
    const { response, problem } = await sendPush(subscription, new TextEncoder().encode($("demo-text").value), { TTL: "60" })
    result.className = problem === undefined ? "" : "error"
    result.textContent = problem ?? `${response.status} · sent; the service worker shows it below when it arrives`
  } catch (error) {
    result.className = "error"
    result.textContent = `Not sent: ${error.message}`
  }
}

const start = async () => {
  $("demo-form").addEventListener("submit", send)
  $("demo-subscribe").addEventListener("click", subscribe)
  if (!window.isSecureContext || !("serviceWorker" in navigator) || !("PushManager" in window)) {
    return verdict("This browser cannot use the Push API on this page: it needs https:// (or http://localhost) and a browser with service workers and push.", true)
  }
  navigator.serviceWorker.addEventListener("message", (event) => {
    if (typeof event.data?.push !== "string") return
    $("demo-received-empty").hidden = true
    const item = document.createElement("li")
    item.className = "text"
    item.textContent = event.data.push
    $("demo-received").prepend(item)
  })
  await navigator.serviceWorker.register("/console/demo-sw.js", { scope: SCOPE })
  const registration = await navigator.serviceWorker.ready
  const existing = await registration.pushManager.getSubscription()
  if (existing !== null) return show(existing.toJSON())
  verdict("Not subscribed yet. Subscribing asks the browser's push service for an endpoint: on this server only when the browser is pointed at it (see above).")
  $("demo-subscribe").disabled = false
  document.body.dataset.state = "ready"
}

void start().catch((error) => verdict(`Cannot start: ${error.message}`, true))
