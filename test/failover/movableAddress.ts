/**
 * The address operators move at a failover (a virtual IP, a DNS name, a proxy), as a TCP proxy on
 * 127.0.0.1: every connection to it is passed to the server it points at now. Moving it cuts the
 * connections passed to the old server, as a moved virtual IP leaves them dead; while it points at
 * a server that is down, connections to it are refused (closed at once).
 */
import { connect, createServer, type Socket } from "node:net"

export interface MovableAddress {
  readonly port: number
  /** Point at the server on `port` from now on. */
  readonly moveTo: (port: number) => void
  readonly close: () => Promise<void>
}

export const movableAddress = async (targetPort: number): Promise<MovableAddress> => {
  let target = targetPort
  const open = new Set<Socket>()
  const server = createServer((incoming) => {
    const outgoing = connect(target, "127.0.0.1")
    const pair = [incoming, outgoing]
    for (const socket of pair) {
      open.add(socket)
      socket.on("error", () => {})
      socket.on("close", () => {
        open.delete(socket)
        for (const other of pair) other.destroy()
      })
    }
    incoming.pipe(outgoing)
    outgoing.pipe(incoming)
  })
  const port = await new Promise<number>((resolve, reject) => {
    server.once("error", reject)
    server.listen(0, "127.0.0.1", () => resolve((server.address() as { port: number }).port))
  })
  return {
    port,
    moveTo: (to) => {
      target = to
      for (const socket of open) socket.destroy()
    },
    close: () => {
      for (const socket of open) socket.destroy()
      return new Promise((resolve) => server.close(() => resolve()))
    }
  }
}
