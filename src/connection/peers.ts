/**
 * Messages to other connection nodes' router ports, in the background: a poke after saving a
 * disconnected client's messages, and the seed's stale-session kick. Best effort: failures are logged.
 */
import { Agent, request } from "node:http"
import type { Peers } from "../protocol/session.ts"

export const makePeers = (timeoutMs: number, log: (message: string) => void): Peers => {
  const agent = new Agent({ keepAlive: true })
  const send = (method: "PUT" | "DELETE", url: string): void => {
    const req = request(url, { method, agent, timeout: timeoutMs }, (res) => res.resume())
    req.on("timeout", () => req.destroy(new Error("timeout")))
    req.on("error", (e) => log(`${method} to peer node failed: ${e.message}`))
    req.end()
  }
  return {
    notify: (nodeId, uaid) => send("PUT", `${nodeId}/notif/${uaid}`),
    disconnect: (nodeId, uaid, connectedAt) => send("DELETE", `${nodeId}/notif/${uaid}/${connectedAt}`)
  }
}
