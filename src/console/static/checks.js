// What keeps the console page from working where it was opened, in words the page shows: browsers
// give Web Crypto (crypto.subtle, which makes the page's keys and decrypts its pushes) only to
// secure contexts (https, or http from localhost), and refuse a plain ws:// WebSocket from an https
// page unless it goes to this machine. No DOM here: a test runs it in Node.

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
