#!/usr/bin/env node
// Push receipts (RFC 8030 §5.1, §6.2), end to end, from an application server's side:
//
//   1. make a receipt subscription      POST {service}/receipts        → 201, Location: …/receipts/{id}
//   2. start collecting its receipts    GET  …/receipts/{id}           over HTTP/2: receipts come as server pushes
//   3. push with Push-Receipt           POST {push endpoint}           → 202, Location: …/m/{message id}
//   4. wait for that message's receipt  a pushed GET /m/{message id}   410 = acknowledged, 200 = another outcome
//
// With --poll, step 2 is a JSON long poll instead (GET with Accept: application/json, Prefer: wait=N),
// which works over HTTP/1.1 and through any proxy.
//
// Usage:
//   node examples/receipts.mjs [--poll] [--text TEXT] [--ttl N] [--timeout S] [--vapid FILE] [--receipts URL] ENDPOINT|SUBSCRIPTION
//
// ENDPOINT is a push endpoint URL (an empty push is sent); SUBSCRIPTION is the subscription JSON of a
// browser or of `npm run push -- listen` (`{"endpoint", "keys": {"p256dh", "auth"}}`): TEXT is then
// encrypted for it with the `web-push` package. --vapid signs the push with a key file of
// `npm run push -- vapid-keys` (needed for v2 endpoints). The receipt subscribe resource is found
// from the endpoint (the part before /wpush/, plus /receipts) unless --receipts gives it.
//
// Exit code: 0 once the message's receipt came (whatever its outcome), 1 on an error or timeout,
// 2 on bad arguments. Plain Node ≥ 22; `web-push` is only loaded for a subscription or --vapid.
import { readFileSync } from "node:fs"
import * as http2 from "node:http2"

const usage = "usage: node examples/receipts.mjs [--poll] [--text TEXT] [--ttl N] [--timeout S] [--vapid FILE] [--receipts URL] ENDPOINT|SUBSCRIPTION"

const parseArgs = (argv) => {
  const args = { poll: false, text: "hello, with a receipt", ttl: 60, timeout: undefined, vapid: undefined, receipts: undefined, target: undefined }
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]
    const value = () => {
      if (i + 1 >= argv.length) throw new Error(`${arg} needs a value`)
      return argv[++i]
    }
    if (arg === "--poll") args.poll = true
    else if (arg === "--text") args.text = value()
    else if (arg === "--ttl") args.ttl = Number(value())
    else if (arg === "--timeout") args.timeout = Number(value())
    else if (arg === "--vapid") args.vapid = value()
    else if (arg === "--receipts") args.receipts = value()
    else if (arg === "-h" || arg === "--help") throw new Error("")
    else if (arg.startsWith("--")) throw new Error(`unknown option ${arg}`)
    else if (args.target === undefined) args.target = arg
    else throw new Error("one ENDPOINT or SUBSCRIPTION only")
  }
  if (args.target === undefined) throw new Error("a push endpoint URL or a subscription JSON is needed")
  if (!Number.isInteger(args.ttl) || args.ttl < 0) throw new Error("--ttl must be a whole number of seconds")
  // An unacknowledged message's receipt (expired) comes once its TTL ran out, 60 s later if it was delivered.
  args.timeout ??= args.ttl + 90
  return args
}

/** The push request: an empty push to an endpoint, or TEXT encrypted for a subscription (web-push). */
const pushRequest = async (args) => {
  const subscription = args.target.trimStart().startsWith("{") ? JSON.parse(args.target) : { endpoint: args.target }
  if (subscription.keys === undefined && args.vapid === undefined) {
    return { endpoint: subscription.endpoint, headers: { TTL: String(args.ttl) }, body: undefined }
  }
  const { default: webpush } = await import("web-push")
  const vapid = args.vapid === undefined ? undefined : JSON.parse(readFileSync(args.vapid, "utf8"))
  const details = webpush.generateRequestDetails(subscription, subscription.keys === undefined ? null : args.text, {
    TTL: args.ttl,
    contentEncoding: "aes128gcm",
    ...(vapid === undefined ? {} : {
      vapidDetails: { subject: vapid.subject ?? "mailto:admin@localhost", publicKey: vapid.publicKey, privateKey: vapid.privateKey }
    })
  })
  const headers = Object.fromEntries(Object.entries(details.headers).map(([name, value]) => [name, String(value)]))
  return { endpoint: details.endpoint, headers, body: details.body ?? undefined }
}

/** The receipt subscribe resource of the service that issued `endpoint`. */
const subscribeResourceOf = (endpoint) => {
  const at = endpoint.indexOf("/wpush/")
  if (at < 0) throw new Error(`${endpoint} is not a push endpoint of this service (no /wpush/); give --receipts`)
  return `${endpoint.slice(0, at)}/receipts`
}

/** Step 1: a new receipt subscription; its URL. */
const subscribeReceipts = async (url) => {
  const res = await fetch(url, { method: "POST" })
  await res.arrayBuffer()
  const location = res.headers.get("location")
  if (res.status !== 201 || location === null) throw new Error(`POST ${url} answered ${res.status}`)
  return location
}

/** Step 3: the push, naming the receipt subscription; the push message resource (its Location). */
const push = async (request, receiptSubscription) => {
  const res = await fetch(request.endpoint, {
    method: "POST",
    headers: { ...request.headers, "Push-Receipt": receiptSubscription, Prefer: "respond-async" },
    body: request.body
  })
  const text = await res.text()
  console.log(`push: ${res.status} ${res.statusText}`)
  if (res.status !== 202) throw new Error(`the push was not accepted with a receipt (${res.status}): ${text}`)
  console.log(`message: ${res.headers.get("location")}`)
  return res.headers.get("location")
}

/**
 * Step 2 and 4, the RFC's way: a GET of the receipt subscription over HTTP/2 (h2c with prior
 * knowledge for http://, h2 by ALPN for https://), which the service never answers while it lives;
 * each receipt is a server push: a promised GET of the message's push message resource, its status
 * 410 for an acknowledged message (200 otherwise), its body the status document. `start` runs once
 * the GET is on its way; the promise ends with the receipt of the message `start` resolves to.
 */
const viaServerPush = (receiptSubscription, timeoutMs, start) =>
  new Promise((resolve, reject) => {
    const url = new URL(receiptSubscription)
    const session = http2.connect(url.origin)
    const pushed = new Map() // path → { status, document }, for pushes that came before the message was known
    let wanted
    const finish = (error, receipt) => {
      clearTimeout(timer)
      session.destroy()
      if (error !== undefined) reject(error)
      else resolve(receipt)
    }
    const timer = setTimeout(() => finish(new Error(`no receipt within ${timeoutMs / 1000} s`)), timeoutMs)
    session.on("error", (error) => finish(new Error(`HTTP/2 to ${url.origin} failed (${error.message}); try --poll`)))
    session.on("stream", (stream, requestHeaders) => {
      const path = String(requestHeaders[":path"])
      let status = 0
      let body = ""
      stream.on("push", (headers) => void (status = Number(headers[":status"])))
      stream.setEncoding("utf8")
      stream.on("data", (chunk) => void (body += chunk))
      stream.on("end", () => {
        const receipt = { path, status, document: JSON.parse(body) }
        console.log(`server push: GET ${shorten(path)} → ${status} (${receipt.document.outcome})`)
        pushed.set(path, receipt)
        if (wanted !== undefined && pushed.has(wanted)) finish(undefined, pushed.get(wanted))
      })
    })
    const get = session.request({ ":method": "GET", ":path": url.pathname })
    get.on("response", (headers) => {
      // Only an error, or the end of the subscription (204), is ever answered.
      const status = headers[":status"]
      finish(new Error(status === 204 ? "the receipt subscription ended (204)" : `GET ${url.pathname} answered ${status}`))
    })
    get.on("error", () => {})
    get.end()
    start().then((message) => {
      wanted = new URL(message).pathname
      if (pushed.has(wanted)) finish(undefined, pushed.get(wanted))
    }, (error) => finish(error))
  })

/** Step 2 and 4 with a JSON long poll: GETs that wait up to `Prefer: wait=N` s for receipts. */
const viaLongPoll = async (receiptSubscription, timeoutMs, start) => {
  const message = await start()
  const deadline = Date.now() + timeoutMs
  while (Date.now() < deadline) {
    const wait = Math.max(1, Math.min(30, Math.ceil((deadline - Date.now()) / 1000)))
    const res = await fetch(receiptSubscription, { headers: { Accept: "application/json", Prefer: `wait=${wait}` } })
    const text = await res.text()
    if (res.status !== 200) throw new Error(`GET ${receiptSubscription} answered ${res.status}: ${text}`)
    const { receipts } = JSON.parse(text)
    console.log(`long poll: ${receipts.length} receipt(s)`)
    // Each receipt is handed out once: the others (of earlier pushes) are gone from the service now too.
    const mine = receipts.find((receipt) => receipt.message === message)
    if (mine !== undefined) return { path: new URL(message).pathname, status: mine.status, document: mine }
  }
  throw new Error(`no receipt within ${timeoutMs / 1000} s`)
}

const shorten = (text) => (text.length > 60 ? `${text.slice(0, 40)}…${text.slice(-8)}` : text)

const main = async () => {
  let args
  try {
    args = parseArgs(process.argv.slice(2))
  } catch (error) {
    if (error.message !== "") console.error(`receipts.mjs: ${error.message}`)
    console.error(usage)
    return 2
  }
  const request = await pushRequest(args)
  const receiptSubscription = await subscribeReceipts(args.receipts ?? subscribeResourceOf(request.endpoint))
  console.log(`receipt subscription: ${receiptSubscription}`)
  const collect = args.poll ? viaLongPoll : viaServerPush
  console.log(`waiting for the receipt (${args.poll ? "JSON long poll" : "HTTP/2 server push"}, at most ${args.timeout} s)`)
  const receipt = await collect(receiptSubscription, args.timeout * 1000, () => push(request, receiptSubscription))
  console.log(`receipt: ${receipt.document.outcome} (${receipt.status})`)
  console.log(JSON.stringify(receipt.document, null, 2))
  return 0
}

main().then((code) => (process.exitCode = code), (error) => {
  console.error(`receipts.mjs: ${error.message}`)
  process.exitCode = 1
})
