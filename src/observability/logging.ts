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

interface LoggingOptions {
  readonly human: boolean
  readonly level: "trace" | "debug" | "info" | "warn" | "error"
  /** `autopush`, `autoconnect`, `autoendpoint`: the MozLog `Type` and `Logger` prefix. */
  readonly role: string
  readonly hostname: string
  /** This process's number when the node runs as several workers: every record says which. */
  readonly worker?: number | undefined
}

/** One MozLog record: annotations become `Fields`, with the message as `Fields.msg`. */
const mozLogger = (role: string, hostname: string, worker: number | undefined) =>
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
        ...(worker === undefined ? {} : { worker }),
        ...entry.annotations,
        ...(entry.cause === undefined ? {} : { error: entry.cause })
      }
    })
  ).pipe(Logger.withConsoleLog)

/** One record as the structured formatter gives it. */
interface HumanEntry {
  readonly level: string
  readonly timestamp: string
  readonly message: unknown
  readonly cause: string | undefined
  readonly annotations: Readonly<Record<string, unknown>>
  readonly spans: Readonly<Record<string, number>>
}

const LEVEL_COLORS: Readonly<Record<string, string>> = { TRACE: "90", DEBUG: "34", INFO: "32", WARN: "33", ERROR: "31", FATAL: "41" }

/** A value on a human line: one word as it is, anything else as JSON (strings quoted, objects compact). */
const humanValue = (value: unknown): string => {
  if (typeof value === "string") return /^[^\s"=]+$/.test(value) ? value : JSON.stringify(value)
  return JSON.stringify(value) ?? String(value)
}

const clock = (timestamp: string): string => {
  const date = new Date(timestamp)
  const two = (n: number) => String(n).padStart(2, "0")
  return `${two(date.getHours())}:${two(date.getMinutes())}:${two(date.getSeconds())}.${String(date.getMilliseconds()).padStart(3, "0")}`
}

/**
 * A record for people: time, level, message and every field as `key=value`, on one line (a
 * connection's end, with its counts, is one line among the others). Only a failure's cause follows,
 * indented, on the lines after it.
 */
export const humanLine = (entry: HumanEntry, colors: boolean): string => {
  const paint = (text: string, code: string | undefined) => (colors && code !== undefined ? `\x1b[${code}m${text}\x1b[0m` : text)
  const message = typeof entry.message === "string" ? entry.message : humanValue(entry.message)
  const parts = [
    paint(`[${clock(entry.timestamp)}]`, "2"),
    paint(entry.level.padEnd(5), LEVEL_COLORS[entry.level]),
    paint(message, "1"),
    ...Object.entries(entry.spans).map(([label, ms]) => `${label}=${ms}ms`),
    ...Object.entries(entry.annotations).map(([key, value]) => `${paint(key, "36")}=${humanValue(value)}`)
  ]
  const line = parts.join(" ")
  return entry.cause === undefined ? line : `${line}\n${entry.cause.replace(/^/gm, "    ")}`
}

/** Human-readable lines on stdout, coloured on a terminal. */
export const humanLogger = (colors: boolean = process.stdout.isTTY === true, worker?: number) =>
  Logger.map(
    Logger.formatStructured,
    (entry) => humanLine(worker === undefined ? entry : { ...entry, annotations: { worker, ...entry.annotations } }, colors)
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
    Logger.layer([options.human ? humanLogger(undefined, options.worker) : mozLogger(options.role, options.hostname, options.worker)]),
    Layer.succeed(References.MinimumLogLevel, LEVELS[options.level])
  )
