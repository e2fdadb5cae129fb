/**
 * A local APNs provider API over HTTP/2 and TLS (a self-signed certificate made with openssl at
 * start), speaking the real wire protocol: `POST /3/device/{token}` with `apns-*` headers; token
 * auth (`authorization: bearer <ES256 JWT>`, verified against the team's key, `kid` and `iss`) or
 * certificate auth (the client certificate on the TLS connection, by fingerprint); errors as APNs
 * sends them (`{"reason": …}`).
 *
 * By device token: `gone*` → 410 Unregistered, `bad*` → 400 BadDeviceToken, `hang*` → no answer,
 * `goaway*` → 200 and then a GOAWAY on the session; anything else 200 with an `apns-id`.
 */
import { execFileSync } from "node:child_process"
import { generateKeyPairSync, randomUUID, X509Certificate } from "node:crypto"
import { mkdtempSync, readFileSync, rmSync } from "node:fs"
import * as http2 from "node:http2"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Context, Effect, Layer } from "effect"
import { decodeProtectedHeader, importSPKI, jwtVerify } from "jose"

export const TEAM_ID = "TEAM123456"
export const KEY_ID = "KEY7654321"

export interface ApnsRequest {
  readonly path: string
  readonly headers: Readonly<Record<string, string>>
  readonly body: any
  readonly auth: "token" | "certificate"
}

export interface FakeApnsService {
  readonly url: string
  /** The server's certificate: what the client must trust. */
  readonly ca: string
  /** The p8 signing key of token auth. */
  readonly signingKey: string
  readonly clientCert: string
  readonly clientKey: string
  readonly requests: Array<ApnsRequest>
  /** TLS sessions opened so far. */
  readonly sessions: () => number
  /** Provider JWTs refused as expired (the next request with one of them gets 403 ExpiredProviderToken). */
  expireNextToken: boolean
  /** Drop every open session (connection loss). */
  readonly dropSessions: () => void
}

/** A self-signed certificate and its key, PEM (openssl, in a temp dir removed at once). */
export const selfSigned = (subject: string): { readonly cert: string; readonly key: string } => {
  const dir = mkdtempSync(join(tmpdir(), "apns-cert-"))
  try {
    execFileSync("openssl", [
      "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
      "-keyout", join(dir, "key.pem"), "-out", join(dir, "cert.pem"), "-days", "1",
      "-subj", `/CN=${subject}`, "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"
    ], { stdio: "ignore" })
    return { cert: readFileSync(join(dir, "cert.pem"), "utf8"), key: readFileSync(join(dir, "key.pem"), "utf8") }
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
}

export class FakeApns extends Context.Service<FakeApns, FakeApnsService>()("test/FakeApns") {
  static readonly layer = Layer.effect(
    FakeApns,
    Effect.acquireRelease(
      Effect.promise(async () => {
        const server = selfSigned("localhost")
        const client = selfSigned("apns-client")
        const clientFingerprint = new X509Certificate(client.cert).fingerprint256
        const { privateKey, publicKey } = generateKeyPairSync("ec", { namedCurve: "P-256" })
        const verifyKey = await importSPKI(publicKey.export({ type: "spki", format: "pem" }).toString(), "ES256")
        const expired = new Set<string>()
        const open = new Set<http2.ServerHttp2Session>()
        let opened = 0
        const state = { requests: [] as Array<ApnsRequest>, expireNextToken: false }
        const h2 = http2.createSecureServer({ cert: server.cert, key: server.key, requestCert: true, rejectUnauthorized: false })
        h2.on("session", (session) => {
          opened++
          open.add(session)
          session.on("close", () => open.delete(session))
        })
        h2.on("stream", (stream, headers) => {
          const chunks: Array<Buffer> = []
          stream.on("data", (c: Buffer) => chunks.push(c))
          stream.on("end", async () => {
            const reply = (status: number, body?: unknown) => {
              if (stream.closed) return
              stream.respond({ ":status": status, "apns-id": randomUUID() })
              stream.end(body === undefined ? undefined : JSON.stringify(body))
            }
            const path = String(headers[":path"] ?? "")
            const match = /^\/3\/device\/([^/]+)$/.exec(path)
            if (headers[":method"] !== "POST" || match === null) return reply(404, { reason: "BadPath" })
            const authorization = String(headers["authorization"] ?? "")
            let auth: ApnsRequest["auth"]
            if (authorization !== "") {
              const jwt = authorization.replace(/^bearer /, "")
              try {
                if (decodeProtectedHeader(jwt).kid !== KEY_ID) throw new Error("kid")
                await jwtVerify(jwt, verifyKey, { issuer: TEAM_ID })
              } catch {
                return reply(403, { reason: "InvalidProviderToken" })
              }
              if (state.expireNextToken || expired.has(jwt)) {
                state.expireNextToken = false
                expired.add(jwt)
                return reply(403, { reason: "ExpiredProviderToken" })
              }
              auth = "token"
            } else {
              const socket = stream.session?.socket as import("node:tls").TLSSocket | undefined
              if (socket?.getPeerCertificate().fingerprint256 !== clientFingerprint) {
                return reply(403, { reason: "MissingProviderToken" })
              }
              auth = "certificate"
            }
            const plain: Record<string, string> = {}
            for (const [k, v] of Object.entries(headers)) if (!k.startsWith(":") && typeof v === "string") plain[k] = v
            const device = decodeURIComponent(match[1] ?? "")
            state.requests.push({ path, headers: plain, body: JSON.parse(Buffer.concat(chunks).toString("utf8")), auth })
            if (device.startsWith("gone")) return reply(410, { reason: "Unregistered", timestamp: Date.now() })
            if (device.startsWith("bad")) return reply(400, { reason: "BadDeviceToken" })
            if (device.startsWith("hang")) return
            reply(200)
            if (device.startsWith("goaway")) stream.session?.goaway()
          })
        })
        await new Promise<void>((resolve) => h2.listen(0, "127.0.0.1", resolve))
        const service: FakeApnsService = Object.assign(state, {
          url: `https://127.0.0.1:${(h2.address() as { port: number }).port}`,
          ca: server.cert,
          signingKey: privateKey.export({ type: "pkcs8", format: "pem" }).toString(),
          clientCert: client.cert,
          clientKey: client.key,
          sessions: () => opened,
          dropSessions: () => {
            for (const session of open) session.destroy()
          }
        })
        return { service, h2, open }
      }),
      ({ h2, open }) =>
        Effect.promise(() =>
          new Promise<void>((resolve) => {
            for (const session of open) session.destroy()
            h2.close(() => resolve())
          })
        )
    ).pipe(Effect.map(({ service }) => service))
  )
}
