/**
 * A local Amazon Device Messaging server, HTTP/1.1, with its token endpoint: `POST /auth/O2/token`
 * (client-credentials grant, scope `messaging:push`, the one client id and secret it knows) and
 * `POST /messaging/registrations/{id}/messages` (bearer token it issued; ADM's type headers).
 *
 * By registration id: `unregistered*` → 410 Unregistered, `invalid*` → 400 InvalidRegistrationId,
 * `toolarge*` → 413 MessageTooLarge, `hang*` → no answer; anything else 200 `{"registrationID": …}`.
 */
import { closeServer, json } from "./http.ts"
import * as http from "node:http"
import type { Socket } from "node:net"
import { Context, Effect, Layer } from "effect"

export const ADM_CLIENT_ID = "amzn1.application-oa2-client.test"
export const ADM_CLIENT_SECRET = "adm-client-secret"

export interface AdmSend {
  readonly registrationId: string
  readonly headers: http.IncomingHttpHeaders
  readonly body: any
}

export interface FakeAdmService {
  readonly url: string
  readonly tokenRequests: Array<{ readonly ok: boolean }>
  readonly sends: Array<AdmSend>
  readonly valid: Set<string>
}


export class FakeAdm extends Context.Service<FakeAdm, FakeAdmService>()("test/FakeAdm") {
  static readonly layer = Layer.effect(
    FakeAdm,
    Effect.acquireRelease(
      Effect.promise(async () => {
        const state = { tokenRequests: [] as Array<{ ok: boolean }>, sends: [] as Array<AdmSend>, valid: new Set<string>() }
        const sockets = new Set<Socket>()
        let issued = 0
        const server = http.createServer((req, res) => {
          const chunks: Array<Buffer> = []
          req.on("data", (c: Buffer) => chunks.push(c))
          req.on("end", () => {
            const body = Buffer.concat(chunks).toString("utf8")
            if (req.url === "/auth/O2/token" && req.method === "POST") {
              const form = new URLSearchParams(body)
              const ok = form.get("grant_type") === "client_credentials" && form.get("scope") === "messaging:push" &&
                form.get("client_id") === ADM_CLIENT_ID && form.get("client_secret") === ADM_CLIENT_SECRET
              state.tokenRequests.push({ ok })
              if (!ok) return json(res, 401, { error: "invalid_client", error_description: "Client authentication failed" })
              const token = `Atc|adm-${++issued}`
              state.valid.add(token)
              return json(res, 200, { access_token: token, expires_in: 3600, scope: "messaging:push", token_type: "bearer" })
            }
            const match = /^\/messaging\/registrations\/([^/]+)\/messages$/.exec(req.url ?? "")
            if (match === null || req.method !== "POST") return json(res, 404, { reason: "NotFound" })
            if (req.headers["x-amzn-type-version"] !== "com.amazon.device.messaging.ADMMessage@1.0") {
              return json(res, 400, { reason: "InvalidType" })
            }
            if (!state.valid.has((req.headers.authorization ?? "").replace(/^Bearer /, ""))) {
              return json(res, 401, { reason: "AccessTokenExpired" })
            }
            const registrationId = decodeURIComponent(match[1] ?? "")
            state.sends.push({ registrationId, headers: req.headers, body: JSON.parse(body) })
            if (registrationId.startsWith("unregistered")) return json(res, 410, { reason: "Unregistered" })
            if (registrationId.startsWith("invalid")) return json(res, 400, { reason: "InvalidRegistrationId" })
            if (registrationId.startsWith("toolarge")) return json(res, 413, { reason: "MessageTooLarge" })
            if (registrationId.startsWith("hang")) return
            return json(res, 200, { registrationID: registrationId })
          })
        })
        server.on("connection", (socket) => {
          sockets.add(socket)
          socket.on("close", () => sockets.delete(socket))
        })
        await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
        const service: FakeAdmService = Object.assign(state, { url: `http://127.0.0.1:${(server.address() as { port: number }).port}` })
        return { service, server, sockets }
      }),
      ({ server, sockets }) => Effect.promise(() => closeServer(server, sockets))
    ).pipe(Effect.map(({ service }) => service))
  )
}
