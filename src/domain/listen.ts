/** A `node:http` server listening for a layer's lifetime. */
import * as Effect from "effect/Effect"
import type { Server } from "node:http"
import type { AddressInfo } from "node:net"
import { listenFailure, type StartupError } from "./errors.ts"

/** Listen until the scope closes; the bound port. A port that cannot be bound names its option. */
export const listen = (server: Server, port: number, host: string, option: string) =>
  Effect.acquireRelease(
    Effect.callback<number, StartupError>((resume) => {
      const failed = (cause: Error) => resume(Effect.fail(listenFailure(option, host, port, cause)))
      server.once("error", failed)
      server.listen(port, host, () => {
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
