/**
 * The routes in front of the platform's router, on `node:http` itself: pushes to a plainly spelled
 * URL — nearly all of them — without the router and middleware (the per-notification cost), and
 * receipt subscriptions' GETs, which may be held open. They share the handlers, the error edge
 * (`edge.ts`), CORS and instrumentation with the platform's routes.
 *
 * Their fibers belong to the server: shutdown waits for pushes in flight (up to shutdown_timeout,
 * as the server closes), and whatever still runs then is interrupted before the services go.
 */
import type { IncomingMessage, ServerResponse } from "node:http"
import * as Effect from "effect/Effect"
import * as FiberSet from "effect/FiberSet"
import { Overloaded } from "../domain/errors.ts"
import type { endpointInstrumentation } from "../observability/endpoint.ts"
import { sendError } from "../platform/raw-http.ts"
import { CORS_HEADERS } from "./cors.ts"
import { failureAnswer } from "./edge.ts"
import type { Receipts } from "./receipts.ts"
import type { WebPush } from "./webpush.ts"

/**
 * `/wpush/{token}` or `/wpush/{version}/{token}` spelled plainly: nothing in it the platform's router
 * would read another way (no query, `;`, percent escape, empty or extra segment). Other spellings
 * go through the router, to the same handler.
 */
const PLAIN_PUSH_PATH = /^\/wpush\/(?:([A-Za-z0-9]+)\/)?([A-Za-z0-9_=-]+)$/

/** `GET /receipts/{id}` (a query is ignored): answered on the request itself, which it may hold open. */
const RECEIPTS_PATH = /^\/receipts\/([^/?#]*)(?:\?.*)?$/

/** Takes a request it answers itself (true), or leaves it to the platform's server (false). */
export type Front = (req: IncomingMessage, res: ServerResponse) => boolean

export const makeFront = Effect.fnUntraced(function*(
  observe: Effect.Success<typeof endpointInstrumentation>,
  maxInFlight: number,
  webpush: WebPush,
  receipts: Receipts
) {
  const pushes = yield* FiberSet.make()
  const run = yield* FiberSet.runtime(pushes)<never>()
  // Receipt subscriptions' GETs, which may be held open: their fibers end when the server stops.
  const held = yield* FiberSet.make()
  const runHeld = yield* FiberSet.runtime(held)<never>()
  const overloaded = new Overloaded()

  /** A push: the route's handler as a fiber of its own, answered on `res` directly. */
  const push: Front = (req, res) => {
    const path = req.method === "POST" && req.url !== undefined ? PLAIN_PUSH_PATH.exec(req.url) : null
    if (path === null) return false
    const start = observe.begin(maxInFlight)
    if (start === undefined) {
      sendError(res, overloaded, true, CORS_HEADERS)
      return true
    }
    const url = req.url as string
    // The push's answer, or its failure's (they have no `status`).
    const answered = Effect.catchCause(
      webpush.push(webpush.pushRequest(req), path[1], path[2] as string),
      (cause) => failureAnswer(cause, "POST", url, observe.onError)
    )
    const fiber = run(answered)
    fiber.addObserver((exit) => {
      if (exit._tag === "Failure") return observe.end(start, url, undefined) // interrupted: the client left
      const answer = exit.value
      if ("status" in answer) {
        res.writeHead(answer.status, { ...answer.headers, ...CORS_HEADERS, "content-length": 0 })
        res.end()
      } else {
        sendError(res, answer.error, false, { ...answer.headers, ...CORS_HEADERS })
      }
      observe.end(start, url, res.statusCode)
    })
    // A client that leaves before its answer interrupts the handler, as on the platform's routes.
    if (fiber.pollUnsafe() === undefined) {
      res.once("close", () => {
        if (!res.writableEnded) fiber.interruptUnsafe()
      })
    }
    return true
  }

  /** A receipt subscription's GET, held while it waits for receipts. */
  const collect: Front = (req, res) => {
    const path = req.method === "GET" && req.url !== undefined ? RECEIPTS_PATH.exec(req.url) : null
    if (path === null) return false
    // Not counted in flight: a held GET must not keep pushes out.
    const start = observe.begin(Number.POSITIVE_INFINITY) as number
    const url = req.url as string
    const fiber = runHeld(receipts.collect(path[1] as string, req, res, CORS_HEADERS).pipe(
      Effect.catchCause((cause) =>
        Effect.map(failureAnswer(cause, "GET", url, observe.onError), (error) =>
          // Storage failing once receipts are streaming: the stream ends (the client asks again).
          res.headersSent ? void res.end() : sendError(res, error.error, false, { ...error.headers, ...CORS_HEADERS })))
    ))
    fiber.addObserver(() => observe.end(start, url, res.headersSent ? res.statusCode : undefined))
    res.once("close", () => fiber.interruptUnsafe())
    return true
  }

  return ((req, res) => push(req, res) || collect(req, res)) satisfies Front
})
