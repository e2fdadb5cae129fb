// What keeps the console pages from working where they were opened, in words the page shows: browsers
// give Web Crypto (crypto.subtle, which makes the page's keys and decrypts its pushes) only to
// secure contexts (https, or http from localhost), and refuse a plain ws:// WebSocket from an https
// page unless it goes to this machine; and why a browser refused the browser check's subscription.
// No DOM here: a test runs it in Node.

const LOOPBACK = new Set(["localhost", "127.0.0.1", "[::1]"])

/** @param {string} hostname */
const isLoopback = (hostname) => LOOPBACK.has(hostname) || hostname.endsWith(".localhost") || /^127\./.test(hostname)

/**
 * Why the page cannot work as it was opened, or undefined when it can.
 * @param {{ readonly isSecureContext?: boolean, readonly crypto?: { readonly subtle?: unknown }, readonly location: { readonly href: string } }} page the window
 * @param {string | undefined} websocketUrl the WebSocket the page would connect to (config.json)
 * @returns {string | undefined}
 */
export const pageProblem = (page, websocketUrl) => {
  const here = new URL(page.location.href)
  const socket = websocketUrl === undefined ? undefined : new URL(websocketUrl)
  if (page.isSecureContext !== true || page.crypto?.subtle === undefined) {
    const port = here.port || (here.protocol === "https:" ? "443" : "80")
    // The derived WebSocket URL is on the page's host: opened as localhost, it needs its port forwarded too.
    const ports = socket !== undefined && socket.hostname === here.hostname && socket.port !== "" && socket.port !== port ? [port, socket.port] : [port]
    const host = here.hostname.replace(/^\[(.*)\]$/, "$1")
    const tunnel = `ssh ${ports.map((p) => `-L ${p}:${here.hostname}:${p}`).join(" ")} ${host}`
    return `This page needs the browser's Web Crypto (crypto.subtle) to make its keys and decrypt pushes, and browsers give it ` +
      `only to pages opened over https or from localhost; this one was opened as ${here.origin}. Open it as ` +
      `http://localhost:${port}/ through an SSH tunnel (${tunnel}), or serve it over https ` +
      `(endpoint_tls_cert and endpoint_tls_key, or a TLS proxy in front of port ${port}).`
  }
  if (socket !== undefined && here.protocol === "https:" && socket.protocol === "ws:" && !isLoopback(socket.hostname)) {
    return `This page was opened over https, and browsers refuse a plain WebSocket (${websocketUrl}) from it: the ` +
      `connection port speaks ws:// only. Put a TLS proxy in front of port ${socket.port || "80"} and set websocket_url ` +
      `to its wss:// URL (docs/tls.md).`
  }
  return undefined
}

/** Where to try this server from a browser whose push service is not this server. */
const ELSEWHERE = "To try this server from this browser, use the console at / instead: it is a push client in the page, with no push service in between."

/**
 * Why the browser refused the browser check's `pushManager.subscribe` (the page asks without an
 * application server key, as a site using Firefox's push service may), in words; the browser's own
 * message in parentheses.
 * @param {unknown} error what `subscribe` rejected with
 * @returns {string}
 */
export const subscribeProblem = (error) => {
  const name = typeof error === "object" && error !== null && "name" in error ? String(error.name) : "Error"
  const message = typeof error === "object" && error !== null && "message" in error ? String(error.message) : String(error)
  const own = `(the browser said: ${message})`
  // Chromium: "Registration failed - missing applicationServerKey, and manifest empty or missing";
  // Safari: "Subscribing for push requires an applicationServerKey".
  if (/applicationServerKey/i.test(message)) {
    return `This browser subscribes only through its maker's push service (Chrome, Edge and other Chromium browsers: Google's; ` +
      `Safari: Apple's), which wants an application server key and cannot be replaced by this server. This check is for a ` +
      `browser whose push service is this server: Firefox with dom.push.serverURL set to this server's WebSocket. ${ELSEWHERE} ${own}`
  }
  if (name === "NotAllowedError" || /permission/i.test(message)) {
    return `The browser does not allow this page to subscribe: notifications are blocked for this site. Allow them in the ` +
      `site's settings (the icon left of the address) and subscribe again. ${own}`
  }
  // Firefox when its push service (dom.push.serverURL) does not answer: "Error retrieving push subscription."
  if (name === "AbortError" || /push service|retrieving push subscription/i.test(message)) {
    return `The browser's push service did not give a subscription. For Firefox pointed at this server: check that ` +
      `dom.push.serverURL names this server's WebSocket (ws://<host>:8080/ by default) and that it is reachable from this ` +
      `browser (about:serviceworkers and the Browser Console say more). ${own}`
  }
  return `The browser refused to subscribe ${own}. This check needs a browser whose push service is this server ` +
    `(Firefox with dom.push.serverURL set to it). ${ELSEWHERE}`
}
