/**
 * `storage`: the embedded storage (dynalite: the DynamoDB API on LevelDB, the store `npm start` runs
 * inside) as a server of its own, for connection and endpoint nodes on other processes or hosts
 * that set `storage_endpoint` to it. Its data is under `data_dir/dynalite` and survives restarts;
 * it announces itself beside the data so the maintenance tools use it while it runs. It has no
 * authentication: it listens on the loopback unless told otherwise, and belongs on a private network.
 */
import * as Console from "effect/Console"
import * as Effect from "effect/Effect"
import { HelpRequested } from "../config/index.ts"
import type { OptionName } from "../config/options.ts"
import { announceEmbedded, EmbeddedDataError, startDynalite } from "../storage/dynalite/embedded.ts"
import { intFlag, settingsHelp, splitArgs, type ToolError, ToolFailure, toolSettings, usageRow, UsageError } from "./cli.ts"
import { embeddedDataDir } from "./storage.ts"

const DEFAULT_STORAGE_PORT = 8000

const OPTIONS: ReadonlyArray<OptionName> = ["data_dir"]

const help = (): string =>
  [
    "Usage: storage [--host HOST] [--port PORT] [options]",
    "",
    "Serves the embedded storage (the DynamoDB API, on LevelDB under data_dir/dynalite) to the",
    "connection and endpoint nodes of a deployment: set their storage_endpoint to",
    "http://<this host>:PORT. It has no authentication: keep it on a private network.",
    "",
    "Options:",
    usageRow("--host HOST", "address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 for every interface)"),
    usageRow("--port PORT", `port to listen on (default ${DEFAULT_STORAGE_PORT})`),
    "",
    ...settingsHelp(OPTIONS)
  ].join("\n")

export const storageServer = (argv: ReadonlyArray<string>): Effect.Effect<void, ToolError> =>
  Effect.gen(function*() {
    const args = yield* splitArgs(argv, { "--host": "value", "--port": "value" })
    if (args.help) return yield* new HelpRequested({ text: help() })
    if (args.positional.length > 0) return yield* new UsageError({ message: `unexpected argument ${args.positional[0]}` })
    const port = yield* intFlag(args, "--port", 1, DEFAULT_STORAGE_PORT)
    if (port > 65535) return yield* new UsageError({ message: `--port ${port} is not a port (1-65535)` })
    const host = args.flags.get("--host") ?? "127.0.0.1"
    const settings = yield* toolSettings(args.config)
    const dataDir = embeddedDataDir(settings)
    yield* Effect.scoped(
      Effect.gen(function*() {
        const endpoint = yield* startDynalite(dataDir, { host, port, option: "--port" }).pipe(
          Effect.catchTag("StorageError", (error) =>
            Effect.fail(
              new ToolFailure({
                message: error.cause instanceof EmbeddedDataError && error.cause.inUse
                  ? `${error.cause.message}: stop it first (an all-in-one or another storage server on this data_dir)`
                  : `cannot serve ${dataDir} on ${host}:${port}: ${error.cause instanceof Error ? error.cause.message : String(error.cause)}`
              })
            ))
        )
        yield* announceEmbedded(dataDir, endpoint)
        yield* Console.log(`storage: the DynamoDB API on ${host}:${port} (data under ${dataDir}); nodes use it with storage_endpoint=http://<this host>:${port}`)
        if (host !== "127.0.0.1" && host !== "localhost" && host !== "::1") {
          yield* Console.log("storage: it has no authentication: let only the nodes reach this port (a private network or a firewall)")
        }
        return yield* Effect.never
      })
    )
  })
