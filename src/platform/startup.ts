/**
 * A node cannot start (a port in use, storage out of reach, data in use by another process…): one
 * line for the operator, naming the option to change. The entrypoint prints it and exits 1.
 */
import * as Data from "effect/Data"

export class StartupError extends Data.TaggedError("StartupError")<{ readonly message: string }> {}
