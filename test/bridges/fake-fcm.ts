/**
 * A local FCM HTTP v1 server with its OAuth2 token endpoint, speaking the real wire protocol over
 * HTTP/1.1: `POST /token` takes the service-account JWT bearer grant and verifies the assertion
 * (RS256 signature by the account's key, `iss`, `aud`, `scope`, `exp`); `POST
 * /v1/projects/{project}/messages:send` wants a token it issued and answers as FCM does.
 *
 * What a send answers depends on the device token: `gone-*` → 404 UNREGISTERED, `invalid-*` → 400
 * INVALID_ARGUMENT, `quota-*` → 429 RESOURCE_EXHAUSTED (QUOTA_EXCEEDED), `unavailable-*` → 503
 * UNAVAILABLE, `internal-*` → 500 INTERNAL (those three with `retryAfter` as their `Retry-After`
 * header when it is set), `garbage-*` → 500 with an HTML body, `hang-*` → no answer; anything else 200.
 * Error bodies are FCM's: `{"error":{"code","message","status","details":[{"@type":"…FcmError","errorCode"}]}}`.
 */
import { closeServer, json } from "./http.ts"
import { generateKeyPairSync } from "node:crypto"
import * as http from "node:http"
import { Context, Effect, Layer, Redacted } from "effect"
import { importSPKI, jwtVerify } from "jose"
import { FCM_SCOPE, type ServiceAccount } from "../../src/bridges/fcm.ts"

export interface FcmSend {
  readonly project: string
  readonly accessToken: string
  readonly body: any
}

export interface FakeFcmService {
  readonly url: string
  readonly account: ServiceAccount
  /** A service account whose key the token endpoint does not know. */
  readonly strangerAccount: ServiceAccount
  readonly tokenRequests: Array<{ readonly verified: boolean; readonly claims?: Record<string, unknown> }>
  readonly sends: Array<FcmSend>
  /** Access tokens issued and still accepted. */
  readonly valid: Set<string>
  /** When true, every send answers 401 whatever the token. */
  rejectAll: boolean
  /** The `Retry-After` header of the 429, 503 and 500 (INTERNAL) answers; none when undefined. */
  retryAfter: string | undefined
}

const FCM_ERROR = "type.googleapis.com/google.firebase.fcm.v1.FcmError"

/** FCM's error answer: the google.rpc status JSON with an FcmError detail, and extra headers. */
const fcmError = (
  res: http.ServerResponse,
  code: number,
  status: string,
  message: string,
  errorCode: string,
  headers: Record<string, string> = {}
) => {
  res.writeHead(code, { "content-type": "application/json; charset=UTF-8", ...headers })
  res.end(JSON.stringify({ error: { code, message, status, details: [{ "@type": FCM_ERROR, errorCode }] } }))
}

const pemPair = () => {
  const { privateKey, publicKey } = generateKeyPairSync("rsa", { modulusLength: 2048 })
  return {
    privateKey: privateKey.export({ type: "pkcs8", format: "pem" }).toString(),
    publicKey: publicKey.export({ type: "spki", format: "pem" }).toString()
  }
}

const readBody = (req: http.IncomingMessage): Promise<string> =>
  new Promise((resolve) => {
    const chunks: Array<Buffer> = []
    req.on("data", (c: Buffer) => chunks.push(c))
    req.on("end", () => resolve(Buffer.concat(chunks).toString("utf8")))
  })


export class FakeFcm extends Context.Service<FakeFcm, FakeFcmService>()("test/FakeFcm") {
  static readonly layer = Layer.effect(
    FakeFcm,
    Effect.acquireRelease(
      Effect.promise(async () => {
        const trusted = pemPair()
        const stranger = pemPair()
        const publicKey = await importSPKI(trusted.publicKey, "RS256")
        let issued = 0
        const sockets = new Set<import("node:net").Socket>()
        const state = {
          tokenRequests: [] as FakeFcmService["tokenRequests"],
          sends: [] as Array<FcmSend>,
          valid: new Set<string>(),
          rejectAll: false,
          retryAfter: undefined as string | undefined
        }
        let url = ""
        const server = http.createServer(async (req, res) => {
          const body = await readBody(req)
          if (req.url === "/token") {
            const form = new URLSearchParams(body)
            try {
              if (form.get("grant_type") !== "urn:ietf:params:oauth:grant-type:jwt-bearer") throw new Error("grant")
              const { payload } = await jwtVerify(form.get("assertion") ?? "", publicKey, {
                issuer: "fcm-sender@test.iam.gserviceaccount.com",
                audience: `${url}/token`
              })
              if (payload["scope"] !== FCM_SCOPE) throw new Error("scope")
              state.tokenRequests.push({ verified: true, claims: payload as Record<string, unknown> })
              const token = `ya29.fake-${++issued}`
              state.valid.add(token)
              return json(res, 200, { access_token: token, expires_in: 3599, token_type: "Bearer" })
            } catch {
              state.tokenRequests.push({ verified: false })
              return json(res, 400, { error: "invalid_grant", error_description: "Invalid JWT Signature." })
            }
          }
          const match = /^\/v1\/projects\/([^/]+)\/messages:send$/.exec(req.url ?? "")
          if (match === null || req.method !== "POST") return json(res, 404, { error: { code: 404, status: "NOT_FOUND" } })
          const accessToken = (req.headers.authorization ?? "").replace(/^Bearer /, "")
          if (state.rejectAll || !state.valid.has(accessToken)) {
            return json(res, 401, { error: { code: 401, message: "Request had invalid authentication credentials.", status: "UNAUTHENTICATED" } })
          }
          const message = JSON.parse(body)
          state.sends.push({ project: decodeURIComponent(match[1] ?? ""), accessToken, body: message })
          const device = String(message?.message?.token ?? "")
          if (device.startsWith("gone-")) return fcmError(res, 404, "NOT_FOUND", "Requested entity was not found.", "UNREGISTERED")
          const retry: Record<string, string> = state.retryAfter !== undefined ? { "retry-after": state.retryAfter } : {}
          if (device.startsWith("quota-")) {
            return fcmError(res, 429, "RESOURCE_EXHAUSTED", "Quota exceeded for quota metric 'Messages' of service 'fcm.googleapis.com'.", "QUOTA_EXCEEDED", retry)
          }
          if (device.startsWith("unavailable-")) return fcmError(res, 503, "UNAVAILABLE", "The service is currently unavailable.", "UNAVAILABLE", retry)
          if (device.startsWith("internal-")) return fcmError(res, 500, "INTERNAL", "Internal error encountered.", "INTERNAL", retry)
          if (device.startsWith("invalid-")) return json(res, 400, { error: { code: 400, status: "INVALID_ARGUMENT" } })
          if (device.startsWith("garbage-")) {
            res.writeHead(500, { "content-type": "text/html" })
            return res.end("<html>oops</html>")
          }
          if (device.startsWith("hang-")) return
          return json(res, 200, { name: `projects/${match[1]}/messages/0:${Date.now()}` })
        })
        server.on("connection", (socket) => {
          sockets.add(socket)
          socket.on("close", () => sockets.delete(socket))
        })
        await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
        url = `http://127.0.0.1:${(server.address() as { port: number }).port}`
        const account = (privateKey: string): ServiceAccount => ({
          client_email: "fcm-sender@test.iam.gserviceaccount.com",
          private_key: Redacted.make(privateKey),
          token_uri: `${url}/token`
        })
        const service: FakeFcmService = Object.assign(state, {
          url,
          account: account(trusted.privateKey),
          strangerAccount: account(stranger.privateKey)
        })
        return { service, server, sockets }
      }),
      ({ server, sockets }) => Effect.promise(() => closeServer(server, sockets))
    ).pipe(Effect.map(({ service }) => service))
  )
}
