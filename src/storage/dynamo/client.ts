/**
 * How the DynamoDB layer sends a request: `send(operation, input)` → the operation's output, as the
 * DynamoDB JSON protocol defines both (the AWS SDK's input and output shapes of these operations
 * are that JSON). Two ways:
 *
 * - AWS itself, and any endpoint given credentials: the AWS SDK, loaded only then — it resolves
 *   credentials (environment, profile, SSO, web identity, ECS and EC2 roles), endpoints and signs;
 * - a plain-http endpoint without credentials (embedded dynalite, DynamoDB Local, ScyllaDB
 *   Alternator without auth, a compose network): `POST /` over a keep-alive agent, with a
 *   well-formed SigV4 `Authorization` header those servers accept (they check its shape, not its
 *   signature) — and no probe of the EC2 metadata service on a machine that has none. The SDK's
 *   middleware stack costs about 250 µs of CPU per request more than this (measured against
 *   dynalite); a drain or a reconnect makes several requests per client.
 *
 * Errors carry the server's error type as `name` (`ConditionalCheckFailedException`, ...), as the
 * SDK's do; a connection failure is Node's error (with its `code`).
 */
import * as http from "node:http"
import * as Effect from "effect/Effect"
import type * as Scope from "effect/Scope"
import type {
  BatchWriteItemCommandInput,
  BatchWriteItemCommandOutput,
  CreateTableCommandInput,
  CreateTableCommandOutput,
  DeleteItemCommandInput,
  DeleteItemCommandOutput,
  DeleteTableCommandInput,
  DeleteTableCommandOutput,
  DescribeTableCommandInput,
  DescribeTableCommandOutput,
  DynamoDBClientConfig,
  GetItemCommandInput,
  GetItemCommandOutput,
  ListTablesCommandInput,
  ListTablesCommandOutput,
  PutItemCommandInput,
  PutItemCommandOutput,
  QueryCommandInput,
  QueryCommandOutput,
  ScanCommandInput,
  ScanCommandOutput,
  UpdateItemCommandInput,
  UpdateItemCommandOutput,
  UpdateTimeToLiveCommandInput,
  UpdateTimeToLiveCommandOutput
} from "@aws-sdk/client-dynamodb"

/** The operations the layer uses: input and output. */
export interface DynamoOperations {
  BatchWriteItem: [BatchWriteItemCommandInput, BatchWriteItemCommandOutput]
  CreateTable: [CreateTableCommandInput, CreateTableCommandOutput]
  DeleteItem: [DeleteItemCommandInput, DeleteItemCommandOutput]
  DeleteTable: [DeleteTableCommandInput, DeleteTableCommandOutput]
  DescribeTable: [DescribeTableCommandInput, DescribeTableCommandOutput]
  GetItem: [GetItemCommandInput, GetItemCommandOutput]
  ListTables: [ListTablesCommandInput, ListTablesCommandOutput]
  PutItem: [PutItemCommandInput, PutItemCommandOutput]
  Query: [QueryCommandInput, QueryCommandOutput]
  Scan: [ScanCommandInput, ScanCommandOutput]
  UpdateItem: [UpdateItemCommandInput, UpdateItemCommandOutput]
  UpdateTimeToLive: [UpdateTimeToLiveCommandInput, UpdateTimeToLiveCommandOutput]
}

export type DynamoOperation = keyof DynamoOperations

export interface DynamoClient {
  readonly send: <Op extends DynamoOperation>(
    operation: Op,
    input: DynamoOperations[Op][0],
    options: { readonly abortSignal: AbortSignal }
  ) => Promise<Omit<DynamoOperations[Op][1], "$metadata">>
  readonly destroy: () => void
}

interface DynamoClientOptions {
  /** Endpoint URL; AWS's regional endpoint when absent. */
  readonly endpoint?: string | undefined
  readonly region: string
}

/** Requests to one server at once, at most (each client of a node shares them). */
const MAX_SOCKETS = 256

/**
 * Whether to use placeholder credentials: a plain-http endpoint, and no credentials configured in
 * the environment (then the SDK's chain is what the operator asked for).
 */
const placeholderCredentials = (endpoint: string): boolean =>
  new URL(endpoint).protocol === "http:" &&
  process.env["AWS_ACCESS_KEY_ID"] === undefined &&
  process.env["AWS_PROFILE"] === undefined

/** The SDK, or the JSON protocol over HTTP for a local endpoint (see the module comment). */
export const makeDynamoClient = async ({ endpoint, region }: DynamoClientOptions): Promise<DynamoClient> =>
  endpoint !== undefined && placeholderCredentials(endpoint) ? jsonClient(endpoint, region) : await sdkClient({ endpoint, region })

/** A client for the scope: destroyed (its sockets closed) when the scope closes. */
export const scopedDynamoClient = (options: DynamoClientOptions): Effect.Effect<DynamoClient, never, Scope.Scope> =>
  Effect.acquireRelease(Effect.promise(() => makeDynamoClient(options)), (client) => Effect.sync(() => client.destroy()))

/** An error answer of the server: its error type as `name`. */
class DynamoServiceError extends Error {
  readonly $metadata: { readonly httpStatusCode: number }
  constructor(name: string, message: string, status: number) {
    super(message)
    this.name = name
    this.$metadata = { httpStatusCode: status }
  }
}

/** `com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException` → `ConditionalCheckFailedException`. */
const errorType = (type: unknown, status: number): string =>
  typeof type === "string" && type !== "" ? type.slice(type.lastIndexOf("#") + 1) : status >= 500 ? "InternalServerError" : "UnknownError"

const jsonClient = (endpoint: string, region: string): DynamoClient => {
  const url = new URL(endpoint)
  const agent = new http.Agent({ keepAlive: true, maxSockets: MAX_SOCKETS })
  // Only the date changes: the headers are made again when the second does, not per request.
  let stampedSecond = -1
  let amzDate = ""
  let authorization = ""
  const stamp = (): string => {
    const second = Math.floor(Date.now() / 1000)
    if (second !== stampedSecond) {
      stampedSecond = second
      amzDate = new Date(second * 1000).toISOString().replace(/[-:]/g, "").replace(/\.\d{3}/, "")
      authorization = `AWS4-HMAC-SHA256 Credential=autopush/${amzDate.slice(0, 8)}/${region}/dynamodb/aws4_request, ` +
        `SignedHeaders=host;x-amz-date, Signature=${"0".repeat(64)}`
    }
    return amzDate
  }
  const send: DynamoClient["send"] = (operation, input, options) =>
    new Promise((resolve, reject) => {
      const body = JSON.stringify(input)
      const amzDate = stamp()
      const request = http.request({
        host: url.hostname,
        port: url.port,
        path: url.pathname,
        method: "POST",
        agent,
        signal: options.abortSignal,
        headers: {
          "content-type": "application/x-amz-json-1.0",
          "content-length": Buffer.byteLength(body),
          "x-amz-target": `DynamoDB_20120810.${operation}`,
          "x-amz-date": amzDate,
          authorization
        }
      }, (response) => {
        const chunks: Array<Buffer> = []
        response.on("data", (chunk: Buffer) => chunks.push(chunk))
        response.on("error", reject)
        response.on("end", () => {
          const status = response.statusCode ?? 0
          const text = Buffer.concat(chunks).toString("utf8")
          let json: Record<string, unknown>
          try {
            json = text === "" ? {} : JSON.parse(text) as Record<string, unknown>
          } catch {
            return reject(new DynamoServiceError(errorType(undefined, status), `not JSON (HTTP ${status}): ${text.slice(0, 200)}`, status))
          }
          if (status === 200) return resolve(json as never)
          const message = json["message"] ?? json["Message"]
          reject(new DynamoServiceError(errorType(json["__type"], status), typeof message === "string" ? message : `HTTP ${status}`, status))
        })
      })
      request.on("error", reject)
      request.end(body)
    })
  return { send, destroy: () => agent.destroy() }
}

const sdkClient = async (options: DynamoClientOptions): Promise<DynamoClient> => {
  const sdk = await import("@aws-sdk/client-dynamodb")
  const commands = {
    BatchWriteItem: sdk.BatchWriteItemCommand,
    CreateTable: sdk.CreateTableCommand,
    DeleteItem: sdk.DeleteItemCommand,
    DeleteTable: sdk.DeleteTableCommand,
    DescribeTable: sdk.DescribeTableCommand,
    GetItem: sdk.GetItemCommand,
    ListTables: sdk.ListTablesCommand,
    PutItem: sdk.PutItemCommand,
    Query: sdk.QueryCommand,
    Scan: sdk.ScanCommand,
    UpdateItem: sdk.UpdateItemCommand,
    UpdateTimeToLive: sdk.UpdateTimeToLiveCommand
  } as const
  const config: DynamoDBClientConfig = {
    region: options.region,
    // One retry policy, the layer's: the SDK's own would multiply the attempts and the wait.
    maxAttempts: 1,
    requestHandler: { httpAgent: { keepAlive: true, maxSockets: MAX_SOCKETS }, httpsAgent: { keepAlive: true, maxSockets: MAX_SOCKETS } },
    ...(options.endpoint !== undefined ? { endpoint: options.endpoint } : {})
  }
  const client = new sdk.DynamoDBClient(config)
  return {
    send: (operation, input, sendOptions) => {
      const Command = commands[operation] as unknown as new(input: unknown) => Parameters<typeof client.send>[0]
      return client.send(new Command(input), sendOptions) as never
    },
    destroy: () => client.destroy()
  }
}
