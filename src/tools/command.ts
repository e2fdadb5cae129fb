/**
 * A `maintenance` command: what its help says, whether it may create embedded data, and `prepare`,
 * which checks its arguments and returns its work (`Run`), run with the tool's settings against the
 * configured storage.
 */
import type * as Effect from "effect/Effect"
import type { Settings } from "../config/index.ts"
import type { TableCopy } from "../storage/tableCopy.ts"
import type { Storage } from "../storage/Storage.ts"
import type { SplitArgs, ToolError, ToolFailure, UsageError } from "./cli.ts"

export type Run = (settings: Settings) => Effect.Effect<void, ToolError, Storage | TableCopy>

export interface Command {
  readonly summary: string
  readonly usage: string
  readonly description: ReadonlyArray<string>
  readonly flags: ReadonlyArray<readonly [flag: string, help: string]>
  /** Embedded data may be created (create-tables, import). */
  readonly mayCreate: boolean
  /**
   * Checks the command's arguments (before any setting or storage is read; import also checks its
   * file) and returns its work.
   */
  readonly prepare: (args: SplitArgs) => Effect.Effect<Run, UsageError | ToolFailure>
}
