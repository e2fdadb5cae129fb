/**
 * What a bridge registration call asks for (`registration.ts`), read and checked before storage is
 * touched: the bridge of its router type, its JSON body, the channel it asks for and the
 * credentials it presents.
 */
import { randomUUID } from "node:crypto"
import * as ByteSize from "effect/ByteSize"
import * as Effect from "effect/Effect"
import * as HttpIncomingMessage from "effect/http/HttpIncomingMessage"
import type * as HttpServerRequest from "effect/http/HttpServerRequest"
import type { Bridges } from "../bridges/Bridges.ts"
import type { BridgeRouter } from "../bridges/bridge.ts"
import { decodeVapidPublicKey } from "../crypto/endpoint.ts"
import { verifyBridgeSecret } from "../crypto/secrets.ts"
import { InvalidAuth, InvalidRequestBody, InvalidRouterType, RequestTimeout, UaidNotFound } from "../domain/errors.ts"
import { parseChannelId, parseUaid } from "../domain/ids.ts"

/** Registration bodies are small: a token, a channel id, a key, an `aps` override. */
const MAX_BODY = 8 * 1024

/** A registration call's JSON body. */
export type RegistrationJson = Record<string, unknown>

/** The bridge of a router type (any case); 400/108 when this node has none. */
export const bridgeOf = (bridges: Bridges["Service"], routerType: string): Effect.Effect<BridgeRouter, InvalidRouterType> => {
  const bridge = bridges.get(routerType)
  return bridge === undefined ? Effect.fail(new InvalidRouterType()) : Effect.succeed(bridge)
}

/**
 * The body as a JSON object, read within `timeoutMs` (408 after it); an empty body is `{}` when
 * `optional` (a new subscription may send nothing).
 */
export const readRegistrationJson = (
  request: HttpServerRequest.HttpServerRequest,
  options: { readonly optional: boolean; readonly timeoutMs: number }
): Effect.Effect<RegistrationJson, InvalidRequestBody | RequestTimeout> =>
  request.text.pipe(
    Effect.provideService(HttpIncomingMessage.MaxBodySize, ByteSize.bytes(MAX_BODY)),
    Effect.mapError(() => new InvalidRequestBody({ message: `The request body must be JSON of at most ${MAX_BODY} bytes` })),
    Effect.timeoutOrElse({ duration: options.timeoutMs, orElse: () => Effect.fail(new RequestTimeout()) }),
    Effect.flatMap((text) => {
      if (text.trim() === "" && options.optional) return Effect.succeed({})
      const value = parseJson(text)
      return typeof value === "object" && value !== null && !Array.isArray(value)
        ? Effect.succeed(value as RegistrationJson)
        : Effect.fail(new InvalidRequestBody({ message: "The request body must be a JSON object" }))
    })
  )

/** The value of JSON text; undefined (which no JSON text parses to) when it is not JSON. */
const parseJson = (text: string): unknown => {
  try {
    return JSON.parse(text)
  } catch {
    return undefined
  }
}

/** The channel a registration or subscription asks for. */
export interface RequestedChannel {
  readonly channelId: string
  /** The VAPID public key the endpoint is bound to: it then takes only messages signed with it. */
  readonly key: Uint8Array | undefined
}

/** The body's `channelID` (any UUID spelling; a new one when absent) and `key` (a VAPID public key). */
export const requestedChannel = (body: RegistrationJson): Effect.Effect<RequestedChannel, InvalidRequestBody> => {
  const given = body["channelID"]
  const channelId = given === undefined ? randomUUID() : typeof given === "string" ? parseChannelId(given) : undefined
  if (channelId === undefined) return Effect.fail(new InvalidRequestBody({ message: "Invalid channelID" }))
  const key = body["key"]
  if (key === undefined) return Effect.succeed({ channelId, key: undefined })
  const raw = typeof key === "string" ? decodeVapidPublicKey(key) : undefined
  return raw === undefined ? Effect.fail(new InvalidRequestBody({ message: "Invalid key" })) : Effect.succeed({ channelId, key: raw })
}

/**
 * The uaid of the path, once the call's `Authorization: Bearer <secret>` (or `webpush <secret>`)
 * proves it was issued to it under one of `authKeys`: 410/103 for a malformed uaid, then 401/109.
 */
export const authenticatedUaid = (
  request: HttpServerRequest.HttpServerRequest,
  pathUaid: string | undefined,
  authKeys: ReadonlyArray<string>
): Effect.Effect<string, UaidNotFound | InvalidAuth> => {
  const uaid = parseUaid(pathUaid ?? "")
  if (uaid === undefined) return Effect.fail(new UaidNotFound())
  const [scheme = "", secret = "", ...rest] = (request.headers["authorization"] ?? "").trim().split(/\s+/)
  const valid = rest.length === 0 && ["bearer", "webpush"].includes(scheme.toLowerCase()) && verifyBridgeSecret(authKeys, uaid, secret)
  return valid ? Effect.succeed(uaid) : Effect.fail(new InvalidAuth({ message: "Invalid Local Auth" }))
}
