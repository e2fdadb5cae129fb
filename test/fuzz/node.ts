/**
 * What the fuzz tests share: the all-in-one node in this process (what `npm start` runs, on
 * in-memory storage, with short timeouts, its error log captured), the answers the README
 * documents (read at test time: the README is the source of truth), generators, a tally of
 * outcomes per port, and the normal flow a fuzz run must leave working.
 */
import { randomUUID } from "node:crypto"
import { Arbitrary, Duration, Effect, Layer, Logger, Redacted, Schema } from "effect"
import type { HttpServer } from "effect/http"
import { allInOneLayer, withServices } from "../../src/bin/app.ts"
import { makeSettings } from "../../src/config/index.ts"
import { ConnectionNode } from "../../src/connection/node.ts"
import { generateFernetKey } from "../../src/crypto/fernet.ts"
import { makeRouterAuth, type RouterAuthService } from "../../src/crypto/routerAuth.ts"
import { boundPort } from "../../src/endpoint/server.ts"
import { MetricsListener } from "../../src/observability/metricsListener.ts"
import { layerMemory } from "../../src/storage/memory/layer.ts"
import { createActiveTables, Storage } from "../../src/storage/Storage.ts"
import { httpRequest, openClient, type TestClient } from "../connection/client.ts"
import { readme, readmeTable } from "../tools/readme.ts"

/**
 * Cases per property; `FUZZ_RUNS=4000 npx vitest run test/fuzz --silent=false` runs ten times more
 * and shows the outcome counts (the suite hides what passing tests print).
 */
export const FUZZ_RUNS = Math.max(1, Number(process.env["FUZZ_RUNS"] ?? 400))

// ── what the README documents ─────────────────────────────────────────────────────────────────────

export interface Documented {
  /** `status/errno` of every row of the error table (`404 / 405` rows give both). */
  readonly errors: ReadonlySet<string>
  /** Close code → reasons of the close table (`""` where the table says `—`). */
  readonly closes: ReadonlyMap<number, ReadonlySet<string>>
  /** The statuses a `register` is answered with. */
  readonly registerStatuses: ReadonlySet<number>
}

export const documented = (): Documented => {
  const errors = new Set<string>()
  for (const [status = "", errno = ""] of readmeTable("| status | errno |")) {
    for (const s of status.split("/")) errors.add(`${s.trim()}/${errno}`)
  }
  const closes = new Map<number, Set<string>>()
  for (const [code = "", reasons = ""] of readmeTable("| close code | reason |")) {
    const set = closes.get(Number(code)) ?? new Set<string>()
    const named = [...reasons.matchAll(/`([^`]*)`/g)].map((m) => m[1] as string)
    for (const reason of named.length > 0 ? named : reasons === "—" ? [""] : []) set.add(reason)
    closes.set(Number(code), set)
  }
  const text = readme()
  const start = text.indexOf("A `register` is answered")
  if (start === -1) throw new Error("README.md no longer says what a register is answered with")
  const paragraph = text.slice(start, text.indexOf("\n\n", start))
  const registerStatuses = new Set([...paragraph.matchAll(/\b([1-5]\d\d)\b/g)].map((m) => Number(m[1])))
  return { errors, closes, registerStatuses }
}

// ── the node ───────────────────────────────────────────────────────────────────────────────────────

export interface FuzzNode {
  readonly wsPort: number
  readonly routerPort: number
  readonly endpointPort: number
  readonly metricsPort: number
  /** The public base URL endpoints are made with (VAPID `aud` must be its origin). */
  readonly endpointUrl: string
  /** The deployment's router port signatures (requests from its endpoint nodes are signed so). */
  readonly routerAuth: RouterAuthService
  /** Error log records the node wrote (each a defect, a failed request, or the operators' log check). */
  readonly errorLogs: Array<string>
}

const ENDPOINT_URL = "http://push.test"

/** The bearer token of the broadcast admin API (`/v1/broadcasts`). */
export const BROADCAST_ADMIN_TOKEN = "fuzz-admin-token"

/** A user that exists from the start: hellos of concurrent cases with this uaid meet (already connected, ghost). */
export const KNOWN_UAID = "0123456789abcdef0123456789abcdef"

/**
 * The all-in-one node with its services as the entrypoint builds them (`withServices`), in-memory
 * storage, every port on a free loopback port, plus a separate endpoint's metrics listener. Timeouts
 * are short so that stalled bodies are answered within a test.
 */
export const startNode = Effect.gen(function*() {
  const settings = makeSettings({
    port: 0,
    router_port: 0,
    endpoint_port: 0,
    bind_host: "127.0.0.1",
    hostname: "127.0.0.1",
    endpoint_url: ENDPOINT_URL,
    crypto_key: [generateFernetKey()],
    auth_keys: ["fuzz-auth-key"],
    broadcast_admin_tokens: [BROADCAST_ADMIN_TOKEN],
    hello_timeout: Duration.seconds(2),
    close_grace: Duration.millis(200),
    client_request_timeout: Duration.millis(400),
    connection_timeout: Duration.seconds(1)
  })
  const errorLogs: Array<string> = []
  const captureErrors = Logger.layer([
    Logger.make(({ logLevel, message }) => {
      if (logLevel === "Error" || logLevel === "Fatal") errorLogs.push(JSON.stringify(message))
    })
  ])
  // Built apart, so the test can reach storage too.
  const storage = yield* Layer.build(Layer.effectDiscard(createActiveTables).pipe(
    Layer.provideMerge(layerMemory({ routerTable: "router", messageTablePrefix: "message", noTableRotation: false }))
  ))
  const nodes = Layer.merge(allInOneLayer(settings), MetricsListener.layer({ port: 0, host: "127.0.0.1", clientRequestTimeoutMs: 400 }))
  const services = yield* Layer.build(
    withServices("autopush", settings, Layer.succeedContext(storage))(nodes).pipe(Layer.provide(captureErrors))
  )
  const node = yield* ConnectionNode.pipe(Effect.provideContext(services))
  const endpointPort = yield* (boundPort as Effect.Effect<number, never, HttpServer.HttpServer>).pipe(Effect.provideContext(services))
  const metrics = yield* MetricsListener.pipe(Effect.provideContext(services))
  // What the node's own endpoint signs with: the same crypto key.
  const routerAuth = makeRouterAuth({ keys: Redacted.make(settings.cryptoKey), acceptUnsigned: false })
  yield* Effect.gen(function*() {
    const storage = yield* Storage
    const currentMonth = yield* storage.currentMessageTable
    yield* storage.registerUser({ uaid: KNOWN_UAID, routerType: "webpush", routerData: {}, connectedAt: Date.now(), currentMonth })
  }).pipe(Effect.orDie, Effect.provideContext(storage))
  return {
    wsPort: node.port,
    routerPort: node.routerPort,
    endpointPort,
    metricsPort: metrics.port,
    endpointUrl: ENDPOINT_URL,
    routerAuth,
    errorLogs
  } satisfies FuzzNode
})

/** Error log records other than the operators' log check (`/__error__`), which fuzzing calls on purpose. */
export const unexpectedErrors = (node: FuzzNode): Array<string> =>
  node.errorLogs.filter((line) => !line.includes("Test Critical Message"))

// ── the normal flow ──────────────────────────────────────────────────────────────────────────────

const hello = async (client: TestClient, uaid?: string) => {
  client.send({ messageType: "hello", use_webpush: true, ...(uaid === undefined ? {} : { uaid }) })
  return (await client.next((f) => f["messageType"] === "hello"))["uaid"] as string
}

/**
 * Still alive and serving: every port answers its health route, and hello → register → push
 * (through the endpoint) → notification → ack works; the acked message does not come again.
 */
export const normalFlow = (node: FuzzNode) =>
  Effect.promise(async () => {
    for (const port of [node.wsPort, node.routerPort, node.endpointPort]) {
      const reply = await httpRequest("GET", `http://127.0.0.1:${port}/__lbheartbeat__`)
      if (reply.status !== 200) throw new Error(`port ${port}: /__lbheartbeat__ answered ${reply.status}`)
    }
    const scrape = await httpRequest("GET", `http://127.0.0.1:${node.metricsPort}/metrics`)
    if (scrape.status !== 200) throw new Error(`metrics listener answered ${scrape.status}`)

    const ws = `ws://127.0.0.1:${node.wsPort}/`
    const client = await openClient(ws)
    const uaid = await hello(client)
    const channelID = randomUUID()
    client.send({ messageType: "register", channelID })
    const registered = await client.next((f) => f["messageType"] === "register")
    if (registered["status"] !== 200) throw new Error(`register answered ${JSON.stringify(registered)}`)
    const path = new URL(registered["pushEndpoint"] as string).pathname
    const pushed = await httpRequest("POST", `http://127.0.0.1:${node.endpointPort}${path}`, "encrypted bytes", {
      ttl: "60",
      "content-encoding": "aes128gcm"
    })
    if (pushed.status !== 201) throw new Error(`push answered ${pushed.status} ${pushed.body}`)
    const notification = await client.next((f) => f["messageType"] === "notification")
    if (notification["channelID"] !== channelID) throw new Error(`notification for another channel: ${JSON.stringify(notification)}`)
    client.send({ messageType: "ack", updates: [{ channelID, version: notification["version"] }] })
    // The ack is handled before the socket's close: the next session of the uaid gets nothing.
    await new Promise((r) => setTimeout(r, 100))
    await client.close()
    const again = await openClient(ws)
    if (await hello(again, uaid) !== uaid) throw new Error("the uaid was not kept")
    const nothing = await again.quiet(300, (f) => f["messageType"] === "notification")
    await again.close()
    if (!nothing) throw new Error("an acked message came again")
  })

// ── generators ───────────────────────────────────────────────────────────────────────────────────

export const int = (minimum: number, maximum: number): Arbitrary.Arbitrary<number> =>
  Arbitrary.schema(Schema.Int.check(Schema.isBetween({ minimum, maximum })))

/** One of the given values. */
export const pick = <const A>(values: ReadonlyArray<A>): Arbitrary.Arbitrary<A> =>
  Arbitrary.map(int(0, values.length - 1), (i) => values[i] as A)

/** A value of one of the given generators. */
export const oneOf = <A>(...arbitraries: ReadonlyArray<Arbitrary.Arbitrary<A>>): Arbitrary.Arbitrary<A> =>
  Arbitrary.flatMap(int(0, arbitraries.length - 1), (i) => arbitraries[i] as Arbitrary.Arbitrary<A>)

export const anyString: Arbitrary.Arbitrary<string> = Arbitrary.schema(Schema.String)

export const bool: Arbitrary.Arbitrary<boolean> = Arbitrary.schema(Schema.Boolean)

/** Keys that touch `Object.prototype` when code copies them carelessly. */
export const PROTOTYPE_KEYS = ["__proto__", "constructor", "prototype", "toString", "hasOwnProperty", "valueOf"] as const

/** A JSON object's text from its entries in order (duplicates and `__proto__` kept as written). */
export const jsonObject = (entries: ReadonlyArray<readonly [string, unknown]>): string =>
  `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${JSON.stringify(v) ?? "null"}`).join(",")}}`

// ── outcomes ─────────────────────────────────────────────────────────────────────────────────────

/** Outcome counts per port, printed once per file as one line per port. */
export class Tally {
  readonly ports = new Map<string, { cases: number; outcomes: Map<string, number> }>()

  add(port: string, outcomes: ReadonlyArray<string>): void {
    const entry = this.ports.get(port) ?? { cases: 0, outcomes: new Map<string, number>() }
    entry.cases++
    for (const outcome of outcomes) entry.outcomes.set(outcome, (entry.outcomes.get(outcome) ?? 0) + 1)
    this.ports.set(port, entry)
  }

  lines(): Array<string> {
    return [...this.ports].map(([port, { cases, outcomes }]) =>
      `fuzz ${port}: ${cases} cases; ${[...outcomes].sort(([a], [b]) => a.localeCompare(b)).map(([o, n]) => `${o} ×${n}`).join(", ")}`
    )
  }
}

/**
 * Check `property` over `runs` generated cases, `concurrency` at a time on the one node; a
 * falsified case is shrunk (within a budget: every try costs real sockets) and reported with its
 * replay token.
 */
export const check = <A>(
  arbitrary: Arbitrary.Arbitrary<A>,
  property: (value: A) => Effect.Effect<void, string>,
  runs: number,
  show: (value: A) => string,
  concurrency = 16
) =>
  Effect.gen(function*() {
    const result = yield* Arbitrary.checkEffect(arbitrary, (value) => Effect.as(property(value), true), {
      runs,
      concurrency,
      maxShrinks: 40
    })
    if (result._tag === "Falsified") {
      const why = result.failure._tag === "PropertyError" ? result.failure.error : "returned false"
      return yield* Effect.die(new Error(`${why}\nafter ${result.runs} cases and ${result.shrinks} shrinks; case: ${show(result.shrunkInput)}\nreplay: ${result.replay}`))
    }
    const failure = Arbitrary.formatCheckFailure(result)
    if (failure !== undefined) return yield* Effect.die(new Error(failure))
  })
