/**
 * A node as one of several worker processes: what a worker is told by the process that started it
 * (its number, and the store to use when that process runs the embedded one), and what it says back
 * (ready, or why it cannot start). Loaded before anything else by the entrypoints, so it imports
 * nothing heavy.
 */
import { availableParallelism } from "node:os"
import type { Role, Settings } from "../config/options.ts"

/** The environment variable that makes a process a worker, and carries its `WorkerContext` as JSON. */
export const WORKER_ENV = "AUTOPUSH_WORKER"

export interface WorkerContext {
  /** 0 … count − 1: its private ports are the configured ones + index. */
  readonly index: number
  readonly count: number
  /** The embedded store the supervisor runs, when it runs one (the worker's settings have no storage_endpoint then). */
  readonly storageEndpoint?: string | undefined
}

/** What a worker sends its supervisor. */
export type WorkerMessage =
  | { readonly type: "ready" }
  | { readonly type: "failed"; readonly line: string }

/** This process's worker context, when it was started as a worker. */
export const workerContextOf = (env: NodeJS.ProcessEnv): WorkerContext | undefined => {
  const raw = env[WORKER_ENV]
  if (raw === undefined || raw === "") return undefined
  const parsed = JSON.parse(raw) as WorkerContext
  return Number.isInteger(parsed.index) && Number.isInteger(parsed.count) ? parsed : undefined
}

/** This process's worker context (read once: the environment it was started with). */
export const WORKER: WorkerContext | undefined = workerContextOf(process.env)

/** How many processes `workers` asks for: `auto` is the cores this process may use (its CPU affinity). */
export const workerCountOf = (workers: Settings["workers"]): number => workers === "auto" ? availableParallelism() : workers

/**
 * The private port of each of `count` workers: a connection node's router port (an endpoint node's
 * metrics port) and the next ports up, skipping the node's public ports (with the defaults, the
 * all-in-one's second worker would otherwise take `endpoint_port`, 8082).
 */
export const workerPorts = (role: Role, settings: Settings, count: number): ReadonlyArray<number> => {
  const first = role === "autoendpoint" ? settings.metricsPort : settings.routerPort
  const taken = new Set([...(role === "autoendpoint" ? [] : [settings.port]), ...(role === "autoconnect" ? [] : [settings.endpointPort])])
  const ports: Array<number> = []
  for (let port = first; ports.length < count; port++) if (!taken.has(port)) ports.push(port)
  return ports
}

/** The option a worker's private port is given by. */
export const workerPortOption = (role: Role): "router_port" | "metrics_port" => role === "autoendpoint" ? "metrics_port" : "router_port"

/**
 * The flags worker `index` of `count` gets after the node's own: its private port (`workerPorts`)
 * and its share of `max_connections`.
 */
export const workerFlags = (role: Role, settings: Settings, index: number, count: number): ReadonlyArray<string> => [
  `--${workerPortOption(role).replace("_", "-")}`,
  String(workerPorts(role, settings, count)[index]),
  ...(role === "autoendpoint" ? [] : ["--max-connections", String(Math.ceil(settings.maxConnections / count))])
]

/** Tell the supervisor something; false when there is none to tell (it is gone). */
export const tellSupervisor = (message: WorkerMessage): boolean => {
  if (process.send === undefined || !process.connected) return false
  process.send(message)
  return true
}
