/**
 * The real entrypoints as child processes, for end-to-end tests: the all-in-one `autopush` on
 * embedded storage (its SQLite database), or `autoconnect` + `autoendpoint` sharing a dynalite server, the SQLite database of one host or PostgreSQL. Every process of a
 * deployment (the storage server's too) can be given the same extra environment, e.g. a faked clock.
 */
import { type ChildProcess, spawn } from "node:child_process"
import { mkdtempSync, rmSync } from "node:fs"
import { connect, createServer } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll } from "vitest"
import { generateFernetKey } from "../../src/crypto/fernet.ts"
import type { Layer } from "effect"
import { layerDynamo } from "../../src/storage/dynamo/layer.ts"
import pg from "pg"
import { layerPostgres } from "../../src/storage/postgres/layer.ts"
import { layerSqlite } from "../../src/storage/sqlite/layer.ts"
import type { Storage, StorageError } from "../../src/storage/Storage.ts"

/**
 * The checkout whose servers are started: this one, or the one `AUTOPUSH_SERVER_ROOT` names (a
 * benchmark runs an earlier commit's servers beside this one's, to compare them in one run).
 */
const root = process.env["AUTOPUSH_SERVER_ROOT"] ?? new URL("../../", import.meta.url).pathname

/** The storage a deployment's nodes use, opened by the test (the default tables). */
export const storageOf = (deployment: Deployment, timeoutMs?: number): Layer.Layer<Storage, StorageError> => {
  const tables = { routerTable: "router", messageTablePrefix: "message", noTableRotation: false, timeoutMs }
  if (deployment.storageFile !== undefined) return layerSqlite({ ...tables, path: deployment.storageFile })
  if (deployment.storageDsn !== undefined) return layerPostgres({ ...tables, dsn: deployment.storageDsn })
  if (deployment.storageEndpoint === undefined) throw new Error("a deployment has a storage file or a storage endpoint")
  return layerDynamo({ ...tables, endpoint: deployment.storageEndpoint(), region: "local" })
}

export interface Deployment {
  readonly wsUrl: string
  readonly endpointUrl: string
  readonly routerUrl: string
  /** Every line the processes printed, for failure reports. */
  readonly output: Array<string>
  readonly restart: () => Promise<void>
  /** SIGTERM the process holding the connection node (and wait for it to exit), then start it again. */
  readonly restartConnection: (between?: () => Promise<void>) => Promise<void>
  /** Separate processes only: kill the storage (dynalite) process, and start it again after `downMs`. */
  readonly storageOutage?: (downMs: number) => Promise<void>
  /** Separate processes only: stop the storage process (SIGSTOP: connections are accepted, never answered), until `resume`. */
  readonly storageFreeze?: () => { readonly resume: () => void }
  /** Separate processes only: the DynamoDB endpoint of the storage server the nodes share. */
  readonly storageEndpoint?: () => string
  /** The all-in-one only: its embedded SQLite database (the test may open it beside the process). */
  readonly storageFile?: string
  /** Nodes on PostgreSQL: the URL they store at. */
  readonly storageDsn?: string
  /** The process holding the connection node. */
  readonly pid: () => number | undefined
  /** Stops every process and removes the working directory (embedded data, dynalite's files). */
  readonly stop: () => Promise<void>
}

/** How a deployment's processes are started. */
export interface StartOptions {
  /**
   * Added to the test process's environment for every process the deployment spawns, the storage
   * server of separate nodes included (all machines of a deployment share one clock).
   */
  readonly env?: Readonly<Record<string, string>> | undefined
}

const envOf = (options: StartOptions): NodeJS.ProcessEnv =>
  options.env === undefined ? process.env : { ...process.env, ...options.env }

export const freePort = async (): Promise<number> => (await freePorts(1))[0] as number

/** `n` distinct free ports: all held at once while they are picked, so no two are the same. */
export const freePorts = async (n: number): Promise<Array<number>> => {
  const servers = Array.from({ length: n }, () => createServer())
  const ports = await Promise.all(servers.map((server) =>
    new Promise<number>((resolve, reject) => {
      server.once("error", reject)
      server.listen(0, "127.0.0.1", () => resolve((server.address() as { port: number }).port))
    })
  ))
  await Promise.all(servers.map((server) => new Promise((resolve) => server.close(resolve))))
  return ports
}

/** Until `url` answers 200; fails at once when a process exits meanwhile (its last lines say why). */
const waitFor = async (url: string, output: ReadonlyArray<string>, timeoutMs = 20_000): Promise<void> => {
  const deadline = Date.now() + timeoutMs
  const from = output.length
  while (Date.now() < deadline) {
    if (output.slice(from).some((line) => line.startsWith("[") && line.includes(" exited: "))) break
    try {
      const res = await fetch(url)
      if (res.ok) return
    } catch {
      // not up yet
    }
    await new Promise((r) => setTimeout(r, 100))
  }
  throw new Error(`${url} did not come up; output:\n${output.slice(-20).join("\n")}`)
}

const start = (script: string, args: ReadonlyArray<string>, output: Array<string>, cwd: string, env: NodeJS.ProcessEnv): ChildProcess => {
  const child = spawn(process.execPath, [join(root, script), ...args], { cwd, env, stdio: ["ignore", "pipe", "pipe"] })
  const collect = (chunk: Buffer) => output.push(...chunk.toString().split("\n").filter((l) => l.length > 0))
  child.stdout?.on("data", collect)
  child.stderr?.on("data", collect)
  child.once("exit", (code, signal) => output.push(`[${script} pid ${child.pid} exited: code ${code}, signal ${signal}]`))
  return child
}

const stopChild = (child: ChildProcess): Promise<void> =>
  new Promise((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) return resolve()
    child.once("exit", () => resolve())
    child.kill("SIGTERM")
    setTimeout(() => child.kill("SIGKILL"), 5_000).unref()
  })

export type Ports = { readonly ws: number; readonly router: number; readonly endpoint: number }

const urlsOf = (ports: Ports) => ({
  wsUrl: `ws://127.0.0.1:${ports.ws}/`,
  endpointUrl: `http://127.0.0.1:${ports.endpoint}`,
  routerUrl: `http://127.0.0.1:${ports.router}`
})

const endpointFlags = (ports: Ports) => [
  "--endpoint-hostname", "127.0.0.1",
  "--endpoint-port", String(ports.endpoint),
  "--bind-host", "127.0.0.1"
]
const sharedFlags = (ports: Ports) => [...endpointFlags(ports), "--log-level", "debug"]
const connectionFlags = (ports: Ports) => [
  "--port", String(ports.ws),
  "--router-port", String(ports.router),
  "--router-hostname", "127.0.0.1"
]
/** An all-in-one's flags for `ports` on 127.0.0.1 (for tests that start it their own way). */
export const allInOneFlags = (ports: Ports): Array<string> => [...connectionFlags(ports), ...endpointFlags(ports)]
const common = (ports: Ports) => [...sharedFlags(ports), ...connectionFlags(ports)]

/** `npm start`'s process: connection and endpoint node in one, embedded storage in a temp dir. */
/**
 * A free port is only free until someone takes it: if a process of ours lost its port to another
 * one between `freePort` and its listen, start again on new ports.
 */
const withFreshPorts = async (start: () => Promise<Deployment>): Promise<Deployment> => {
  for (let attempt = 1; ; attempt++) {
    try {
      return await start()
    } catch (error) {
      // Another process may take a port between its pick and our listen (the node then says "is in use").
      if (attempt >= 3 || !/EADDRINUSE|is in use/.test(String(error))) throw error
    }
  }
}

/** `extra` flags come last, so they override the defaults above. */
export const startAllInOne = (extra: ReadonlyArray<string> = [], options: StartOptions = {}): Promise<Deployment> =>
  withFreshPorts(() => startAllInOneOnce(extra, envOf(options)))
/** `connectionExtra` flags for the connection node, `sharedExtra` for both. */
export const startSeparate = (
  connectionExtra: ReadonlyArray<string> = [],
  sharedExtra: ReadonlyArray<string> = [],
  options: StartOptions = {}
): Promise<Deployment> => withFreshPorts(() => startSeparateOnce(connectionExtra, sharedExtra, envOf(options)))

const startAllInOneOnce = async (extra: ReadonlyArray<string>, env: NodeJS.ProcessEnv): Promise<Deployment> => {
  const cwd = mkdtempSync(join(tmpdir(), "autopush-e2e-"))
  const [ws, router, endpointPort] = (await freePorts(3)) as [number, number, number]
  const ports = { ws, router, endpoint: endpointPort }
  const output: Array<string> = []
  let child: ChildProcess
  const up = async () => {
    child = start("src/bin/autopush.ts", [...common(ports), ...extra], output, cwd, env)
    await waitFor(`http://127.0.0.1:${ports.endpoint}/__lbheartbeat__`, output)
    await waitFor(`http://127.0.0.1:${ports.router}/__lbheartbeat__`, output)
  }
  await up().catch(async (error: unknown) => {
    await stopChild(child)
    rmSync(cwd, { recursive: true, force: true })
    throw error
  })
  return {
    ...urlsOf(ports),
    output,
    restart: async () => {
      await stopChild(child)
      await up()
    },
    restartConnection: async (between) => {
      await stopChild(child)
      await between?.()
      await up()
    },
    storageFile: join(cwd, "data", "autopush.sqlite"),
    pid: () => child.pid,
    stop: async () => {
      await stopChild(child)
      rmSync(cwd, { recursive: true, force: true })
    }
  }
}

/** `autoconnect` and `autoendpoint` as separate processes sharing one storage server process (`npm run storage`). */
const startSeparateOnce = async (
  connectionExtra: ReadonlyArray<string>,
  sharedExtra: ReadonlyArray<string>,
  env: NodeJS.ProcessEnv
): Promise<Deployment> => {
  const cwd = mkdtempSync(join(tmpdir(), "autopush-e2e-"))
  const [ws, router, endpointPort, dynamoPort, metricsPort] = (await freePorts(5)) as [number, number, number, number, number]
  const ports = { ws, router, endpoint: endpointPort }
  const output: Array<string> = []
  // The storage server's own lines (its start, or why it could not start) go to the same output, marked.
  const collectDynalite = (chunk: Buffer) => output.push(...chunk.toString().split("\n").filter((l) => l.length > 0).map((l) => `[storage] ${l}`))
  const startDynalite = () => {
    const child = spawn(process.execPath, [join(root, "src/bin/storage.ts"), "--port", String(dynamoPort), "--data-dir", join(cwd, "db")], {
      cwd,
      env,
      stdio: ["ignore", "pipe", "pipe"]
    })
    child.stdout?.on("data", collectDynalite)
    child.stderr?.on("data", collectDynalite)
    return child
  }
  let dynalite = startDynalite()
  const shared = [
    ...sharedFlags(ports),
    "--storage-endpoint", `http://127.0.0.1:${dynamoPort}`,
    "--crypto-key", generateFernetKey(),
    "--auth-keys", "e2e-auth-key",
    ...sharedExtra
  ]
  let connection: ChildProcess
  let endpoint: ChildProcess
  const upConnection = async () => {
    connection = start("src/bin/autoconnect.ts", [...shared, ...connectionFlags(ports), ...connectionExtra], output, cwd, env)
    await waitFor(`http://127.0.0.1:${ports.router}/__lbheartbeat__`, output)
  }
  const up = async () => {
    await waitForPort(dynamoPort, 30_000)
    await upConnection()
    endpoint = start("src/bin/autoendpoint.ts", [...shared, "--metrics-port", String(metricsPort)], output, cwd, env)
    await waitFor(`http://127.0.0.1:${ports.endpoint}/__lbheartbeat__`, output)
  }
  await up().catch(async (error: unknown) => {
    await Promise.all([connection, endpoint].filter((c) => c !== undefined).map(stopChild))
    await stopChild(dynalite)
    rmSync(cwd, { recursive: true, force: true })
    throw error
  })
  return {
    ...urlsOf(ports),
    output,
    restart: async () => {
      await Promise.all([stopChild(connection), stopChild(endpoint)])
      await up()
    },
    restartConnection: async (between) => {
      await stopChild(connection)
      await between?.()
      await upConnection()
    },
    storageOutage: async (downMs) => {
      const exited = new Promise((resolve) => dynalite.once("exit", resolve))
      dynalite.kill("SIGKILL")
      await exited
      await new Promise((r) => setTimeout(r, downMs))
      dynalite = startDynalite()
      // As long as its first start may take: the machine is as loaded as then.
      await waitForPort(dynamoPort, 30_000)
    },
    storageFreeze: () => {
      dynalite.kill("SIGSTOP")
      return { resume: () => void dynalite.kill("SIGCONT") }
    },
    storageEndpoint: () => `http://127.0.0.1:${dynamoPort}`,
    pid: () => connection.pid,
    stop: async () => {
      await Promise.all([stopChild(connection), stopChild(endpoint)])
      await stopChild(dynalite)
      rmSync(cwd, { recursive: true, force: true })
    }
  }
}

/** Where separate nodes of one host store: their flags, and what the deployment says of it. */
interface SharedStore {
  readonly flags: (cwd: string) => ReadonlyArray<string>
  readonly storageFile?: (cwd: string) => string
  readonly storageDsn?: string
  readonly storageOutage?: (downMs: number) => Promise<void>
  /** The nodes' crypto key (a new one unless given: nodes of another deployment on the same store share it). */
  readonly cryptoKey?: string
}

const SQLITE_ON_ONE_HOST: SharedStore = {
  flags: (cwd) => ["--embedded-storage", "--data-dir", join(cwd, "data")],
  storageFile: (cwd) => join(cwd, "data", "autopush.sqlite")
}

/** `autoconnect` and `autoendpoint` as separate processes of one host, sharing a store: the SQLite database under one `data_dir`, or PostgreSQL. */
const startOnOneHostOnce = async (env: NodeJS.ProcessEnv, store: SharedStore = SQLITE_ON_ONE_HOST): Promise<Deployment> => {
  const cwd = mkdtempSync(join(tmpdir(), "autopush-e2e-"))
  const [ws, router, endpointPort, metricsPort] = (await freePorts(4)) as [number, number, number, number]
  const ports = { ws, router, endpoint: endpointPort }
  const output: Array<string> = []
  const shared = [
    ...sharedFlags(ports),
    ...store.flags(cwd),
    "--crypto-key", store.cryptoKey ?? generateFernetKey(),
    "--auth-keys", "e2e-auth-key"
  ]
  let connection: ChildProcess
  let endpoint: ChildProcess
  const upConnection = async () => {
    connection = start("src/bin/autoconnect.ts", [...shared, ...connectionFlags(ports)], output, cwd, env)
    await waitFor(`http://127.0.0.1:${ports.router}/__lbheartbeat__`, output)
  }
  const up = async () => {
    await upConnection()
    endpoint = start("src/bin/autoendpoint.ts", [...shared, "--metrics-port", String(metricsPort)], output, cwd, env)
    await waitFor(`http://127.0.0.1:${ports.endpoint}/__lbheartbeat__`, output)
  }
  const stopBoth = () => Promise.all([connection, endpoint].filter((c) => c !== undefined).map(stopChild))
  await up().catch(async (error: unknown) => {
    await stopBoth()
    rmSync(cwd, { recursive: true, force: true })
    throw error
  })
  return {
    ...urlsOf(ports),
    output,
    restart: async () => {
      await stopBoth()
      await up()
    },
    restartConnection: async (between) => {
      await stopChild(connection)
      await between?.()
      await upConnection()
    },
    ...(store.storageFile === undefined ? {} : { storageFile: store.storageFile(cwd) }),
    ...(store.storageOutage === undefined ? {} : { storageOutage: store.storageOutage }),
    ...(store.storageDsn === undefined ? {} : { storageDsn: store.storageDsn }),
    pid: () => connection.pid,
    stop: async () => {
      await stopBoth()
      rmSync(cwd, { recursive: true, force: true })
    }
  }
}

/** `autoconnect` and `autoendpoint` as separate processes on one host, on the embedded SQLite database they share. */
export const startOnOneHost = (options: StartOptions = {}): Promise<Deployment> => withFreshPorts(() => startOnOneHostOnce(envOf(options)))

let postgresSchemas = 0

/** One statement on the PostgreSQL at `dsn`, on a connection of its own. */
const postgresStatement = async (dsn: string, sql: string): Promise<void> => {
  const client = new pg.Client({ connectionString: dsn })
  await client.connect()
  try {
    await client.query(sql)
  } finally {
    await client.end()
  }
}

/** A new schema on the PostgreSQL at `dsn`, named `prefix` and a unique suffix: a DSN into it, and how to drop it. */
export const postgresSchema = async (dsn: string, prefix: string): Promise<{ readonly dsn: string; readonly drop: () => Promise<void> }> => {
  const schema = `${prefix}_${Date.now().toString(36)}${process.pid.toString(36)}${(postgresSchemas++).toString(36)}`
  await postgresStatement(dsn, `CREATE SCHEMA ${schema}`)
  const url = new URL(dsn)
  url.searchParams.set("options", `-c search_path=${schema}`)
  return { dsn: url.href, drop: () => postgresStatement(dsn, `DROP SCHEMA ${schema} CASCADE`).catch(() => {}) }
}

/**
 * `autoconnect` and `autoendpoint` as separate processes sharing PostgreSQL at `dsn` (`--db-dsn`),
 * in a schema of their own (the default table names, nothing shared with other deployments; the
 * schema is dropped when the deployment stops); `outage` stops that server for a while and starts
 * it again.
 */
export const startOnPostgres = async (
  dsn: string,
  options: StartOptions & {
    readonly outage?: (downMs: number) => Promise<void>
    /** Nodes joining another deployment's: its store (schema included) and crypto key, which it keeps (and drops). */
    readonly joining?: { readonly storageDsn: string; readonly cryptoKey: string }
  } = {}
): Promise<Deployment & { readonly storageDsn: string; readonly cryptoKey: string }> => {
  const schema = options.joining === undefined ? await postgresSchema(dsn, "e2e") : undefined
  const storageDsn = options.joining?.storageDsn ?? schema?.dsn as string
  const cryptoKey = options.joining?.cryptoKey ?? generateFernetKey()
  const store: SharedStore = {
    flags: () => ["--db-dsn", storageDsn],
    storageDsn,
    cryptoKey,
    ...(options.outage === undefined ? {} : { storageOutage: options.outage })
  }
  const deployment = await withFreshPorts(() => startOnOneHostOnce(envOf(options), store))
  return {
    ...deployment,
    storageDsn,
    cryptoKey,
    stop: async () => {
      await deployment.stop()
      await schema?.drop()
    }
  }
}

/** Until something accepts TCP connections on `port`. */
const waitForPort = async (port: number, timeoutMs = 10_000): Promise<void> => {
  const deadline = Date.now() + timeoutMs
  while (Date.now() < deadline) {
    const up = await new Promise<boolean>((resolve) => {
      const socket = connect(port, "127.0.0.1", () => {
        socket.destroy()
        resolve(true)
      })
      socket.on("error", () => resolve(false))
    })
    if (up) return
    await new Promise((r) => setTimeout(r, 50))
  }
  throw new Error(`nothing listens on ${port}`)
}

/** A deployment started before the tests of the enclosing block and stopped after them: the getter gives it to them. */
export const deploymentFor = (start: () => Promise<Deployment>): (() => Deployment) => {
  let deployment: Deployment | undefined
  beforeAll(async () => {
    deployment = await start()
  }, 60_000)
  afterAll(async () => {
    await deployment?.stop()
  })
  return () => {
    if (deployment === undefined) throw new Error("the deployment did not start")
    return deployment
  }
}

/**
 * How the connection node delivered a message: its trace's `delivered` event says `direct` or
 * `stored` (undefined when it has none within two seconds).
 */
export const deliveredAs = async (deployment: Deployment, messageId: string): Promise<string | undefined> => {
  const deadline = Date.now() + 2_000
  while (Date.now() < deadline) {
    const res = await fetch(`${deployment.routerUrl}/__trace__/${encodeURIComponent(messageId)}`)
    if (res.ok) {
      const trace = (await res.json()) as { readonly events: ReadonlyArray<{ readonly type: string; readonly data: Record<string, unknown> }> }
      const delivered = trace.events.find((e) => e.type === "notification.delivered.1")
      if (delivered !== undefined) return delivered.data["source"] as string
    } else await res.arrayBuffer()
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
  return undefined
}
