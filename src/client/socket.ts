/**
 * The client side of the push protocol's WebSocket (subprotocol `push-notification`): frames as
 * JSON objects in, JSON objects out. The socket lives as long as the scope; a close from the
 * server ends `next` with `ConnectionLost` naming the close code and reason.
 */
import * as Cause from "effect/Cause"
import * as Data from "effect/Data"
import * as Effect from "effect/Effect"
import * as Queue from "effect/Queue"
import type * as Scope from "effect/Scope"
import WebSocket from "ws"

/** The server could not be reached, or closed the connection: worth connecting again later. */
class ConnectionLost extends Data.TaggedError("ConnectionLost")<{ readonly message: string }> {}

export type Frame = Readonly<Record<string, unknown>>

export interface PushSocket {
  readonly send: (frame: Frame) => Effect.Effect<void>
  /** The next frame from the server. */
  readonly next: Effect.Effect<Frame, ConnectionLost>
  /** The next frame of a `messageType`, skipping others (the server may push notifications at any time). */
  readonly expect: (messageType: string) => Effect.Effect<Frame, ConnectionLost>
}

export const openPushSocket = (url: string): Effect.Effect<PushSocket, ConnectionLost, Scope.Scope> =>
  Effect.gen(function*() {
    const frames = yield* Queue.unbounded<Frame, ConnectionLost>()
    const end = (message: string) => Queue.failCauseUnsafe(frames, Cause.fail(new ConnectionLost({ message })))
    const ws = yield* Effect.acquireRelease(
      Effect.callback<WebSocket, ConnectionLost>((resume) => {
        const socket = new WebSocket(url, "push-notification")
        socket.once("open", () => resume(Effect.succeed(socket)))
        // An HTTP answer instead of a WebSocket: the URL names an HTTP port (the endpoint's, say).
        socket.once("unexpected-response", (_request, response) => {
          response.resume()
          const message = `${url} answered HTTP ${response.statusCode} instead of opening a WebSocket: ` +
            "--server takes the connection node's WebSocket URL (ws://host:8080/ by default)"
          end(message)
          socket.terminate()
          resume(Effect.fail(new ConnectionLost({ message })))
        })
        socket.on("error", (error) => {
          end(`connection to ${url} failed: ${error.message}`)
          resume(Effect.fail(new ConnectionLost({ message: `cannot connect to ${url}: ${error.message}` })))
        })
      }),
      (socket) => Effect.sync(() => socket.close(1000))
    )
    ws.on("message", (data) => {
      try {
        const frame = JSON.parse(data.toString()) as unknown
        if (typeof frame === "object" && frame !== null) Queue.offerUnsafe(frames, frame as Frame)
      } catch {
        end("the server sent a frame that is not JSON")
      }
    })
    ws.on("close", (code, reason) => end(`the server closed the connection (${code}${reason.length > 0 ? ` ${reason.toString()}` : ""})`))
    const next = Queue.take(frames)
    const expect = (messageType: string): Effect.Effect<Frame, ConnectionLost> =>
      Effect.flatMap(next, (frame) => (frame["messageType"] === messageType ? Effect.succeed(frame) : expect(messageType)))
    return {
      send: (frame) => Effect.sync(() => ws.send(JSON.stringify(frame))),
      next,
      expect
    }
  })
