/** A `node:http` server listening for a layer's lifetime, and what a port that cannot be bound says. */
import * as Effect from "effect/Effect"
import type { Server } from "node:http"
import type { AddressInfo } from "node:net"
import { StartupError } from "./startup.ts"

/** A listener that could not bind: the message names the option of its port. */
export const listenFailure = (option: string, host: string, port: number, cause: unknown): StartupError => {
  const code = (cause as { readonly code?: unknown } | undefined)?.code
  const where = `${host}:${port}`
  return new StartupError({
    message: code === "EADDRINUSE"
      ? `port ${port} is in use (option ${option}): stop what listens on ${where}, or choose another port`
      : code === "EACCES"
      ? `not allowed to listen on ${where} (option ${option}): choose a port above 1023, or run with the right to bind it`
      : code === "EADDRNOTAVAIL"
      ? `cannot listen on ${where}: no such local address (option bind_host or private_bind_host)`
      : `cannot listen on ${where} (option ${option}): ${String((cause as { readonly message?: unknown } | undefined)?.message ?? cause)}`
  })
}

/**
 * Listen until the scope closes; the bound port. A port that cannot be bound names its option.
 * `reusePort`: the port is shared with this node's other worker processes (SO_REUSEPORT: the kernel
 * spreads new connections over them).
 */
export const listen = (server: Server, port: number, host: string, option: string, reusePort = false) =>
  Effect.acquireRelease(
    Effect.callback<number, StartupError>((resume) => {
      const failed = (cause: Error) => resume(Effect.fail(listenFailure(option, host, port, cause)))
      server.once("error", failed)
      server.listen({ port, host, reusePort }, () => {
        server.off("error", failed)
        resume(Effect.succeed((server.address() as AddressInfo).port))
      })
    }),
    () =>
      Effect.callback<void>((resume) => {
        server.close(() => resume(Effect.void))
        server.closeAllConnections()
      })
  )
