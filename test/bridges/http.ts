/** What the fake platform servers share: a JSON answer, and closing with their connections. */
import type * as http from "node:http"
import type { Socket } from "node:net"

export const json = (res: http.ServerResponse, status: number, body: unknown) => {
  res.writeHead(status, { "content-type": "application/json" })
  res.end(JSON.stringify(body))
}

/** Close the server, its open connections first (keep-alive clients would hold it open). */
export const closeServer = (server: http.Server, sockets: ReadonlySet<Socket>): Promise<void> =>
  new Promise((resolve) => {
    for (const socket of sockets) socket.destroy()
    server.close(() => resolve())
  })
