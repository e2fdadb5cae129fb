/**
 * The endpoint port's certificate (`endpoint_tls_cert`, `endpoint_tls_key`): PEM, or the path of a
 * PEM file, both or neither. Checked at start (read, and made into a TLS context), so that a wrong
 * file is one line naming the option, not a failure at the first connection.
 */
import { readFileSync } from "node:fs"
import { createSecureContext } from "node:tls"
import * as Effect from "effect/Effect"
import { inlineOrFile } from "../bridges/bridge.ts"
import { StartupError } from "../platform/startup.ts"
import type { EndpointOptions } from "./options.ts"

const read = (option: string, value: string): string => {
  try {
    return inlineOrFile(value, (path) => readFileSync(path, "utf8"))
  } catch {
    throw new StartupError({ message: `option ${option} is not usable: cannot read the file ${value}` })
  }
}

export const endpointTlsOf = (cert: string | undefined, key: string | undefined): Effect.Effect<EndpointOptions["tls"], StartupError> => {
  if (cert === undefined && key === undefined) return Effect.succeed(undefined)
  if (cert === undefined || key === undefined) {
    return Effect.fail(new StartupError({ message: "options endpoint_tls_cert and endpoint_tls_key go together: set both (HTTPS and HTTP/2 on the endpoint port) or neither" }))
  }
  return Effect.try({
    try: () => {
      const tls = { cert: read("endpoint_tls_cert", cert), key: read("endpoint_tls_key", key) }
      createSecureContext(tls)
      return tls
    },
    catch: (error) =>
      error instanceof StartupError ? error : new StartupError({
        message: `options endpoint_tls_cert and endpoint_tls_key are not usable: ${error instanceof Error ? error.message : String(error)} (a PEM certificate chain and its private key)`
      })
  })
}
