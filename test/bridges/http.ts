/** What the fake platform servers share: a JSON answer. */
import type * as http from "node:http"

export const json = (res: http.ServerResponse, status: number, body: unknown) => {
  res.writeHead(status, { "content-type": "application/json" })
  res.end(JSON.stringify(body))
}
