// The console page: a push client of this server (WebSocket hello/register, keys made here,
// pushes decrypted here and acked), a form that encrypts and sends a test push to it and follows
// each push's state to its receipt, and the server's status, polled. Text from the network only
// ever goes into the page as textContent.
import { pageProblem } from "./checks.js"
import { createReceiptSubscription, describeSteps, isFinal, receiptHeaders } from "./receipts.js"
import { CONSOLE_VAPID_SUBJECT, decryptPush, makeSubscriberKeys, makeVapidKeys, maxPlaintextBytes, sendPush, vapidAuthorization } from "./webpush.js"

const $ = (id) => document.getElementById(id)
const decoder = new TextDecoder()
const STATUS_EVERY_MS = 2000
const RECONNECT_AFTER_MS = 3000
const MESSAGE_POLL_MS = 1000

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

const shellQuote = (text) => `'${text.replaceAll("'", `'\\''`)}'`

// A console opened as /?token=… (console_token) passes the token on to its JSON routes.
const token = new URLSearchParams(location.search).get("token")
const getJson = async (path) => {
  const res = await fetch(path, { cache: "no-store", headers: token === null ? {} : { Authorization: `Bearer ${token}` } })
  if (!res.ok) throw new Error(`${path}: ${res.status}`)
  return res.json()
}

// ── status panel ────────────────────────────────────────────────────────────────────────────────

const duration = (seconds) => {
  const s = Math.floor(seconds)
  const parts = [[Math.floor(s / 86400), "d"], [Math.floor((s % 86400) / 3600), "h"], [Math.floor((s % 3600) / 60), "m"], [s % 60, "s"]]
  const first = parts.findIndex(([n]) => n > 0)
  return first < 0 ? "0s" : parts.slice(first, first + 2).map(([n, unit]) => `${n}${unit}`).join(" ")
}

/** Per VAPID key (its first characters), the warnings its pushes got: `BCx4…: vapid-sub-local ×3`. */
const showSenderWarnings = (senders) => {
  const list = $("status-senders")
  if (senders.length === 0) return void (list.textContent = "none")
  list.replaceChildren(...senders.map((sender) => {
    const line = document.createElement("div")
    const who = sender.vapidKey === null ? "unsigned" : `key ${sender.vapidKey.slice(0, 12)}…`
    const what = Object.entries(sender.warnings).map(([kind, n]) => `${kind} ×${n}`).join(", ")
    line.textContent = `${who}: ${what} (last ${new Date(sender.lastSeen).toLocaleTimeString()})`
    line.title = sender.vapidKey ?? "pushes without VAPID"
    return line
  }))
}

let previous
const pollStatus = async () => {
  try {
    const status = await getJson("/console/status.json")
    const now = performance.now()
    $("status-version").textContent = status.commit === "unknown" ? status.version : `${status.version} (${status.commit.slice(0, 12)})`
    $("status-uptime").textContent = duration(status.uptime)
    $("status-clients").textContent = status.connections === null ? "— (not on this node)" : String(status.connections)
    if (previous !== undefined && now > previous.at) {
      const rate = Math.max(0, status.notifications - previous.notifications) / ((now - previous.at) / 1000)
      $("status-rate").textContent = rate.toFixed(rate < 10 ? 1 : 0)
    }
    previous = { at: now, notifications: status.notifications }
    showSenderWarnings(status.senderWarnings ?? [])
    $("live").textContent = "live"
    $("live").className = "badge on"
  } catch {
    $("live").textContent = "offline"
    $("live").className = "badge off"
  }
}

// ── the push client ─────────────────────────────────────────────────────────────────────────────

const state = { keys: undefined, uaid: undefined, channelID: undefined, subscription: undefined, socket: undefined, maxPlaintext: undefined }

const setConnection = (text, isError = false) => {
  $("connection").textContent = text
  $("connection").className = isError ? "error" : ""
}

const showSubscription = (endpoint) => {
  state.subscription = { endpoint, keys: { p256dh: state.keys.p256dh, auth: state.keys.authText } }
  const json = JSON.stringify(state.subscription)
  $("subscription").textContent = JSON.stringify(state.subscription, null, 2)
  $("send-command").textContent = `npm run push -- send --subscription ${shellQuote(json)} "hello"`
  $("send-button").disabled = false
  document.body.dataset.state = "subscribed"
}

// Topic and Urgency of the pushes this page sent, by message id (the Location of the 201, and the
// notification's version): the push service does not tell clients either. A direct delivery can
// arrive before the 201: its line is completed when the 201 comes.
const sentHere = new Map()
const shown = new Map()

const metaText = ({ at, version, rest }) => {
  const sent = sentHere.get(version)
  return [at, ...(sent === undefined ? [] : [`topic ${sent.topic ?? "—"}`, `urgency ${sent.urgency ?? "normal"}`]), rest].join(" · ")
}

const showReceived = (text, version, rest, isError) => {
  $("received-empty").hidden = true
  const item = document.createElement("li")
  const body = document.createElement("div")
  body.className = isError ? "text error" : "text"
  body.textContent = text
  const info = document.createElement("div")
  info.className = "meta"
  const meta = { at: new Date().toLocaleTimeString(), version, rest }
  info.textContent = metaText(meta)
  shown.set(version, () => void (info.textContent = metaText(meta)))
  item.append(body, info)
  $("received").prepend(item)
}

const rememberSent = (messageId, labels) => {
  sentHere.set(messageId, labels)
  shown.get(messageId)?.()
}

const onNotification = async (socket, frame) => {
  const headers = frame.headers ?? {}
  let code = 100
  if (typeof frame.data === "string" && frame.data !== "") {
    try {
      const text = decoder.decode(await decryptPush(state.keys, frame.data, headers))
      showReceived(text, frame.version, `${headers.encoding} · acked`, false)
    } catch (error) {
      code = 101
      showReceived(`(could not decrypt: ${error.message})`, frame.version, `${headers.encoding ?? "?"} · acked with code 101`, true)
    }
  } else {
    showReceived("(no payload)", frame.version, "acked", false)
  }
  socket.send(JSON.stringify({ messageType: "ack", updates: [{ channelID: frame.channelID, version: frame.version, code }] }))
}

const register = (socket) => {
  state.channelID = crypto.randomUUID()
  socket.send(JSON.stringify({ messageType: "register", channelID: state.channelID }))
}

const connect = (url) => {
  setConnection(`Connecting to ${url}…`)
  const socket = new WebSocket(url, "push-notification")
  state.socket = socket
  socket.addEventListener("open", () => {
    const hello = { messageType: "hello", use_webpush: true }
    // After a reconnect: the same uaid and channel, so the subscription stays valid.
    if (state.uaid !== undefined) Object.assign(hello, { uaid: state.uaid, channelIDs: [state.channelID] })
    socket.send(JSON.stringify(hello))
  })
  socket.addEventListener("message", (event) => {
    let frame
    try {
      frame = JSON.parse(event.data)
    } catch {
      return
    }
    switch (frame.messageType) {
      case "hello":
        if (frame.status !== 200) return setConnection(`The server refused hello (status ${frame.status}).`, true)
        if (frame.uaid !== state.uaid || state.subscription === undefined) {
          state.uaid = frame.uaid
          register(socket)
        } else {
          setConnection(`Connected to ${url}; waiting for pushes.`)
        }
        return
      case "register":
        if (frame.status !== 200) return setConnection(`The server refused to register (status ${frame.status}).`, true)
        showSubscription(frame.pushEndpoint)
        setConnection(`Connected to ${url}; waiting for pushes.`)
        return
      case "notification":
        void onNotification(socket, frame)
        return
      case "urgency":
        $("min-urgency-status").textContent = frame.status === 200
          ? ($("min-urgency").value === "very-low" ? "every push is delivered" : `less urgent pushes wait on the server until you lower it`)
          : `the server refused it (status ${frame.status})`
        return
    }
  })
  socket.addEventListener("close", (event) => {
    if (state.socket !== socket) return
    document.body.dataset.state = "disconnected"
    setConnection(`Disconnected from ${url} (${event.code}${event.reason ? ` ${event.reason}` : ""}); reconnecting…`, true)
    setTimeout(() => connect(url), RECONNECT_AFTER_MS)
  })
}

// ── what became of the pushes sent here ─────────────────────────────────────────────────────────

// Every push the form sends asks for a receipt (RFC 8030 §5.1) on the page's receipt subscription,
// whose receipts come as server-sent events. The steps before the outcome (stored, delivered) come
// from GET of the push message resource, every second until the message has an outcome. A receipt
// can come before the push's 202 is read: statuses wait by message URL for their line. A push
// waits until the subscription is made (`ready`).
const receipts = { subscription: undefined, events: undefined, ready: Promise.resolve() }
const statuses = new Map()
const sentLines = new Map()

const statusOf = (message) => statuses.get(message) ?? { state: "accepted" }

const learn = (status) => {
  // An outcome is final: a GET answered before the receipt came must not move it back.
  if (isFinal(statusOf(status.message))) return
  statuses.set(status.message, status)
  sentLines.get(status.message)?.()
}

const setReceiptsStatus = (text, isError = false) => {
  $("receipts-status").textContent = text
  $("receipts-status").className = isError ? "error" : "muted"
}

const subscribeReceipts = async (endpointUrl) => {
  try {
    const { subscription, problem } = await createReceiptSubscription(endpointUrl)
    if (subscription === undefined) return setReceiptsStatus(`Sent without receipts: ${problem}`, true)
    receipts.subscription = subscription
    const events = new EventSource(subscription)
    receipts.events = events
    events.addEventListener("receipt", (event) => learn(JSON.parse(event.data)))
    // The subscription expired or is unknown (an EventSource does not retry a 404): a new one.
    const renew = () => {
      events.close()
      if (receipts.events !== events) return
      receipts.subscription = undefined
      setReceiptsStatus("The receipt subscription is gone (expired or unknown); making a new one…")
      receipts.ready = sleep(RECONNECT_AFTER_MS).then(() => subscribeReceipts(endpointUrl))
    }
    events.addEventListener("gone", renew)
    events.addEventListener("error", () => {
      if (events.readyState === EventSource.CLOSED) renew()
    })
    setReceiptsStatus("Each push asks for a receipt: its state shows here until its outcome.")
  } catch (error) {
    setReceiptsStatus(`Sent without receipts: ${error.message}`, true)
  }
}

const showSent = (message, text) => {
  $("sent-empty").hidden = true
  const item = document.createElement("li")
  const line = document.createElement("div")
  line.className = "line"
  const label = document.createElement("span")
  label.className = "text"
  label.textContent = text
  const state = document.createElement("span")
  state.className = "badge state"
  const info = document.createElement("div")
  info.className = "meta"
  const at = new Date().toLocaleTimeString()
  const render = () => {
    const status = statusOf(message)
    state.textContent = status.state
    state.dataset.state = status.state
    info.textContent = [at, describeSteps(status)].filter((part) => part !== "").join(" · ")
  }
  sentLines.set(message, render)
  render()
  line.append(label, state)
  item.append(line, info)
  $("sent").prepend(item)
}

const follow = async (message) => {
  while (!isFinal(statusOf(message))) {
    const res = await fetch(message, { cache: "no-store" }).catch(() => undefined)
    // No status kept: its receipt was collected (its event brings the outcome).
    if (res?.status === 404) return
    const status = res?.ok ? await res.json().catch(() => undefined) : undefined
    if (status !== undefined) learn(status)
    await sleep(MESSAGE_POLL_MS)
  }
}

// ── the send form ───────────────────────────────────────────────────────────────────────────────

// The message's size against what this server accepts (max_data_bytes, once encrypted), so the
// form says "too long" before the server answers 413.
const messageBytes = () => new TextEncoder().encode($("send-text").value)
const showSize = () => {
  if (state.maxPlaintext === undefined) return
  const size = messageBytes().length
  $("send-size").textContent = `${size} of ${state.maxPlaintext} bytes`
  $("send-size").className = size > state.maxPlaintext ? "size error" : "size"
}

let vapid
const send = async (event) => {
  event.preventDefault()
  const result = $("send-result")
  if (state.subscription === undefined) return
  const text = $("send-text").value
  const plaintext = messageBytes()
  if (state.maxPlaintext !== undefined && plaintext.length > state.maxPlaintext) {
    result.className = "error"
    result.textContent = `Not sent: the message is ${plaintext.length} bytes; this server takes at most ${state.maxPlaintext} (its max_data_bytes, once encrypted)`
    return
  }
  result.className = ""
  result.textContent = "Sending…"
  try {
    await receipts.ready
    const headers = { TTL: $("send-ttl").value, ...(receipts.subscription === undefined ? {} : receiptHeaders(receipts.subscription)) }
    if ($("send-topic").value !== "") headers.Topic = $("send-topic").value
    if ($("send-urgency").value !== "") headers.Urgency = $("send-urgency").value
    if ($("send-vapid").checked) {
      vapid ??= await makeVapidKeys()
      headers.Authorization = await vapidAuthorization(vapid, state.subscription.endpoint, CONSOLE_VAPID_SUBJECT)
    }
    const { response: res, problem } = await sendPush(state.subscription, plaintext, headers)
    if (problem === undefined) {
      const location = res.headers.get("location") ?? ""
      rememberSent(location.slice(location.lastIndexOf("/m/") + 3), { topic: headers.Topic, urgency: headers.Urgency })
      const warning = res.headers.get("autopush-warning")
      // What another push service (Apple's) would refuse of this push (none of the page's own making).
      result.textContent = `${res.status} ${res.statusText || (res.status === 202 ? "Accepted" : "Created")} · Location: ${location || "—"}` +
        (warning === null ? "" : ` · Autopush-Warning: ${warning}`)
      // 202: the push asked for a receipt (201: it went without).
      if (res.status === 202 && location !== "") {
        showSent(location, text)
        void follow(location)
      }
    } else {
      result.className = "error"
      result.textContent = problem
    }
  } catch (error) {
    result.className = "error"
    result.textContent = `Not sent: ${error.message}`
  }
}

// ── start ───────────────────────────────────────────────────────────────────────────────────────

// What keeps the page from working here (no Web Crypto over plain http from another machine, a
// plain WebSocket from an https page), said at the top instead of failing on the first key.
const showProblem = (text) => {
  $("page-problem").textContent = text
  $("page-problem").hidden = false
  setConnection("Not connected: this page cannot work as it was opened (see above).", true)
  document.body.dataset.state = "unusable"
}

const start = async () => {
  $("send-form").addEventListener("submit", send)
  $("send-text").addEventListener("input", showSize)
  // RFC 8030 §5.3: the least urgent push this client wants now (kept by the server across reconnects).
  $("min-urgency").addEventListener("change", () => {
    if (state.socket?.readyState !== WebSocket.OPEN) return
    $("min-urgency-status").textContent = "asking the server…"
    state.socket.send(JSON.stringify({ messageType: "urgency", min: $("min-urgency").value }))
  })
  void pollStatus()
  setInterval(pollStatus, STATUS_EVERY_MS)
  try {
    const config = await getJson("/console/config.json")
    const problem = pageProblem(window, config.websocketUrl)
    if (problem !== undefined) return showProblem(problem)
    state.maxPlaintext = maxPlaintextBytes(config.maxDataBytes)
    showSize()
    state.keys = await makeSubscriberKeys()
    connect(config.websocketUrl)
    receipts.ready = subscribeReceipts(config.endpointUrl)
  } catch (error) {
    setConnection(`Cannot start: ${error.message}`, true)
  }
}

void start()
