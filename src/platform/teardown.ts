import * as Cause from "effect/Cause"
import * as Exit from "effect/Exit"
import * as Runtime from "effect/Runtime"

/**
 * A stop on a signal is a clean stop: exit 0 (a service manager would mark 130 a failure). Failures
 * keep the default codes.
 */
export const stopTeardown: Runtime.Teardown = (exit, onExit) =>
  Exit.isFailure(exit) && Cause.hasInterruptsOnly(exit.cause) ? onExit(0) : Runtime.defaultTeardown(exit, onExit)
