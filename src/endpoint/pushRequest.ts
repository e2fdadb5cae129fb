/**
 * What a push reads of its HTTP request (`PushRequest`), and how it is read off `node:http`: the
 * body from the start, its outcome looked at only by rule #10 (`acceptPush.ts`).
 */
import type { IncomingMessage } from "node:http"
import * as Effect from "effect/Effect"
import { PayloadTooLarge } from "../domain/errors.ts"
import { type Body, type BodyLimits, type BodyRefusal, readBody } from "../platform/raw-http.ts"
import { isHpkeMessage, type RequestHeaders } from "./headers.ts"
import { peerOf } from "./http2.ts"
import { clientRequestTimeoutOf, type EndpointOptions } from "./options.ts"

/** What a push reads of its request: the headers, and at rule #10 the body. */
export interface PushRequest {
  readonly headers: RequestHeaders
  readonly body: Effect.Effect<Buffer, BodyRefusal>
  /** The connection's peer address (the sender, or a proxy in front of it). */
  readonly peer: string | undefined
}

/**
 * What an HPKE message (`isHpkeMessage`) may carry beyond `max_data_bytes`: the draft asks push
 * services for 1 kB more, its overhead being about 1 kB more than aes128gcm's (it has no padding to
 * give up instead). Every part of the route to a connected or stored client carries it; the bridges
 * keep their platforms' own limits (`checkBridgeSize`).
 */
export const HPKE_EXTRA_BYTES = 1024

/** Push requests over `node:http`, with the body limits of `options`. */
export const makePushRequests = (options: EndpointOptions) => {
  const limitsOf = (maxBytes: number): BodyLimits => ({
    maxBytes,
    tooLarge: new PayloadTooLarge({ message: `Data payload must be smaller than ${maxBytes} bytes` }),
    // A client that stops sending its body gets 408 (and the connection closed), not a socket held.
    idleMs: clientRequestTimeoutOf(options)
  })
  const bodyLimits = limitsOf(options.maxDataBytes)
  const hpkeLimits = limitsOf(options.maxDataBytes + HPKE_EXTRA_BYTES)

  /**
   * A push request over `node:http`. Its body is read from the start (at most `max_data_bytes`, or
   * `HPKE_EXTRA_BYTES` more for an HPKE message) and its outcome looked at by rule #10 only, so a
   * request wrong in an earlier way gets that error.
   */
  return (req: IncomingMessage): PushRequest => {
    let read: Body | undefined
    let waiting: ((body: Body) => void) | undefined
    readBody(req, isHpkeMessage(req.headers as RequestHeaders) ? hpkeLimits : bodyLimits, (body) => {
      read = body
      waiting?.(body)
    })
    const outcome = (body: Body) => body._tag === "Body" ? Effect.succeed(body.bytes) : Effect.fail(body.error)
    return {
      headers: req.headers as RequestHeaders,
      peer: peerOf(req),
      body: Effect.suspend(() =>
        read !== undefined ? outcome(read) : Effect.callback<Buffer, BodyRefusal>((resume) => {
          waiting = (body) => resume(outcome(body))
        })
      )
    }
  }
}
