/**
 * Logs: MozLog JSON on stdout by default (one object per line, as Mozilla's services log), human-readable
 * lines with `human_logs`, and the minimum level from `log_level`.
 */
import * as Layer from "effect/Layer"
import * as Logger from "effect/Logger"
import * as References from "effect/References"
import type { LogLevel } from "effect/LogLevel"
import { VERSION } from "./version.ts"

const SEVERITY: Readonly<Record<string, number>> = {
  Fatal: 2,
  Error: 3,
  Warn: 4,
  Info: 6,
  Debug: 7,
  Trace: 7,
  All: 7,
  None: 7
}

export interface LoggingOptions {
  readonly human: boolean
  readonly level: "trace" | "debug" | "info" | "warn" | "error"
  /** `autopush`, `autoconnect`, `autoendpoint`: the MozLog `Type` and `Logger` prefix. */
  readonly role: string
  readonly hostname: string
}

/** One MozLog record: annotations become `Fields`, with the message as `Fields.msg`. */
export const mozLogger = (role: string, hostname: string) =>
  Logger.map(Logger.formatStructured, (entry) =>
    JSON.stringify({
      Timestamp: Date.parse(entry.timestamp) * 1_000_000,
      Type: `${role}:log`,
      Logger: `${role}-${VERSION}`,
      Hostname: hostname,
      EnvVersion: "2.0",
      Severity: SEVERITY[entry.level.charAt(0) + entry.level.slice(1).toLowerCase()] ?? 6,
      Pid: process.pid,
      Fields: {
        msg: entry.message,
        ...entry.annotations,
        ...(entry.cause === undefined ? {} : { error: entry.cause })
      }
    })
  ).pipe(Logger.withConsoleLog)

const LEVELS: Readonly<Record<LoggingOptions["level"], LogLevel>> = {
  trace: "Trace",
  debug: "Debug",
  info: "Info",
  warn: "Warn",
  error: "Error"
}

export const loggingLayer = (options: LoggingOptions) =>
  Layer.mergeAll(
    Logger.layer([options.human ? Logger.consolePretty() : mozLogger(options.role, options.hostname)]),
    Layer.succeed(References.MinimumLogLevel, LEVELS[options.level])
  )
