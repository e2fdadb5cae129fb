/**
 * Clients for `bench:connections`, run as a child process: opens `count` WebSockets from
 * `localAddress` to the server, sends hello on each, and reports `{ identified }` once every hello
 * was answered. Holds them open until the parent disconnects.
 */
import WebSocket from "ws"

const [port, count, localAddress] = [Number(process.argv[2]), Number(process.argv[3]), process.argv[4] ?? "127.0.0.1"]
/** With BENCH_BROADCASTS=1 every client follows a broadcast, as Firefox follows Remote Settings'. */
const HELLO = JSON.stringify({
  messageType: "hello",
  use_webpush: true,
  ...(process.env["BENCH_BROADCASTS"] === "1" ? { broadcasts: { "remote-settings/monitor_changes": "\"1600000000000\"" } } : {})
})
const sockets: Array<WebSocket> = []
let identified = 0
let failed = 0
let next = 0

const openOne = () => {
  if (next >= count) return
  next++
  const ws = new WebSocket(`ws://127.0.0.1:${port}/`, { localAddress, perMessageDeflate: false })
  sockets.push(ws)
  ws.once("open", () => ws.send(HELLO))
  ws.once("message", () => {
    identified++
    if (identified + failed === count) process.send?.({ identified, failed })
    openOne()
  })
  ws.once("error", () => {
    failed++
    if (identified + failed === count) process.send?.({ identified, failed })
    openOne()
  })
}
// A bounded number of handshakes in flight at once.
for (let i = 0; i < 200; i++) openOne()
process.on("disconnect", () => process.exit(0))
