/** The part of dynalite 4 (CommonJS, untyped) that `dynalite/embedded.ts` uses. */
declare module "dynalite" {
  import type { Server } from "node:http"

  interface DynaliteOptions {
    /** LevelDB directory; in memory when absent. */
    readonly path?: string
    readonly createTableMs?: number
    readonly deleteTableMs?: number
    readonly updateTableMs?: number
    readonly maxItemSizeKb?: number
  }

  /** A Node HTTP server speaking the DynamoDB API; `close` also closes the LevelDB store. */
  export default function dynalite(options?: DynaliteOptions): Server
}
