/**
 * Messages across the monthly rotation of message tables, with storage failing at random.
 *
 * Message tables are `message_YYYY_MM` and rotate at 00:00 UTC on the 1st. A user's router record
 * names its table (`currentMonth`); a session that finds its user on last month's table drains it,
 * moves the channel set and the record to this month's table, then drains both months once.
 *
 * The world here: live sessions of this node (`makeHarness`: the real session machine, this node's
 * registry, the endpoint's own `WebPushRouter` delivering into that registry), and the endpoint's
 * real push handler (`makeWebPushHandlers`: validation, the router cache — on, records reused for
 * 60 s — push receipts, then the router) over one in-memory storage. Every storage operation takes
 * TestClock time, and fails (`StorageError`) when a generated fault says so: the next n calls of an
 * operation, or every call during an outage — for the sessions and the endpoint alike. A fault is
 * `refused` (the operation never reached storage) or `lost` (it was applied — a write written, a
 * read read — and its answer lost: the error comes after, as a timeout does). A push may be
 * interrupted (its sender leaves) at any of its storage boundaries, and a message may be cancelled
 * (`DELETE` of its `Location`) at any point. The clock starts on the last day of a month shortly before midnight and crosses
 * one or more month boundaries at generated points. The test plays the node's ticker: sessions get
 * a `Tick` when their deadline (a retry, the keepalive) is due, and answer pings with pongs.
 *
 * A push may race with the client: the client acts (resumes, acks everything, leaves) just before
 * the endpoint writes the message to storage — after the endpoint has read the router record.
 *
 * What must hold, as the client sees it (frames it received, acks it sent):
 * - nothing is delivered that the endpoint did not accept (201/202 with its message id), except the
 *   message of a push answered 503 or not at all whose write may have been applied;
 * - nothing is delivered after its cancel was answered 204;
 * - a message the client acked is never delivered again: not to the session that got the ack, and
 *   not to any other once that session has ended (while it is still ending, its delete of the
 *   acked row may be failing and waiting for a retry, and a new connection of the client reads the
 *   row meanwhile: nothing else can know of the ack yet);
 * - nothing is delivered after its TTL ran out;
 * - after the run (storage healthy, the clock moved on a little, the client resumes and acks
 *   everything, then once more), every accepted message with a TTL was acked by the client —
 *   unless it expired, a later accepted message of its topic replaced it, it was cancelled, or its
 *   user was dropped; and no table holds a message of the user any more (none stranded in a month
 *   no drain reads).
 * Unacked deliveries may come again on a later connection (at least once): exactly once means
 * acked once, and never delivered after the ack.
 */
import type { IncomingMessage } from "node:http"
import { assert, describe, it } from "@effect/vitest"
import { Arbitrary, Clock, Deferred, Effect, Exit, Fiber, Layer, Schema } from "effect"
import { afterAll } from "vitest"
import { TestClock } from "effect/testing"
import { Bridges } from "../../src/bridges/Bridges.ts"
import { EndpointCrypto, TEST_ENDPOINT_URL } from "../../src/crypto/endpoint.ts"
import { toErrorResponse } from "../../src/domain/errors.ts"
import { defaultEndpointOptions, type EndpointOptions } from "../../src/endpoint/options.ts"
import { makeRateLimits, NO_LIMITS } from "../../src/endpoint/rateLimits.ts"
import { makeEndpointReceipts } from "../../src/endpoint/receipts.ts"
import { makeWebPushHandlers, type PushRequest } from "../../src/endpoint/webpush.ts"
import { EventLog } from "../../src/observability/EventLog.ts"
import { isLive } from "../../src/protocol/phases.ts"
import { WebPushRouter } from "../../src/routers/webpush.ts"
import { layerMemory } from "../../src/storage/memory/layer.ts"
import { mapStorageOperations, Storage, StorageError, type StorageService } from "../../src/storage/Storage.ts"
import { Unavailable } from "../../src/storage/failures.ts"
import { activeTableNames, type StorageOptions } from "../../src/storage/tables.ts"
import { type Client, makeHarness, pump, STORAGE_LATENCY_MS } from "./harness.ts"

const CHANNELS = ["eac8e1de-cddf-42d6-9919-a7b0e0f41e59", "7dbb5bdb-0845-4535-98c9-0f34a94e2e7b"] as const
const STORAGE: StorageOptions = { routerTable: "router", messageTablePrefix: "message", noTableRotation: false }
const DAY_MS = 86_400_000

/** The endpoint: the router cache on (records reused for 60 s), receipt subscriptions that outlive the run. */
const ENDPOINT: EndpointOptions = {
  ...defaultEndpointOptions,
  endpointUrl: TEST_ENDPOINT_URL,
  routerCache: { ttlMs: 60_000, entries: 1000 },
  receipts: { idleSeconds: 400 * 86_400 }
}

/** Whole-run bounds on injected failures: a session that closed keeps trying to save for 5 minutes, well past them. */
const OUTAGE_BUDGET_MS = 60_000
const FAULT_BUDGET = 6

// ── storage that takes time and fails when told ─────────────────────────────────────────────────

/** The storage operations a fault may name ("*": whichever comes next). */
const FAULTY_OPERATIONS = [
  "*",
  "getUser",
  "resumeUser",
  "updateUser",
  "clearNodeId",
  "hasChannel",
  "getChannels",
  "addChannels",
  "saveMessage",
  "saveMessages",
  "fetchMessages",
  "fetchTimestampMessages",
  "deleteMessage",
  "ackMessages",
  "touchReceiptSubscription",
  "openMessageStatus",
  "updateMessageStatus"
] as const

/** How a fault fails an operation: before it reaches storage, or after it was applied (its answer lost). */
type FaultKind = "refused" | "lost"

/** What the runs generated, over the whole property (printed at the end, for the record). */
const tally = {
  runs: 0,
  refused: 0,
  lost: 0,
  outageRefusals: 0,
  interruptedPushes: 0,
  interruptedPushesAfterAStore: 0,
  cancels204: 0,
  cancels404: 0,
  nodeDeaths: 0,
  pushes503: 0
}
afterAll(() => {
  console.log(`month property, fault kinds generated: ${JSON.stringify(tally)}`)
})

/** Operations that never fail: they cannot (their type says so), or only the test itself calls them. */
const NEVER_FAIL: ReadonlySet<string> = new Set(["currentMessageTable", "activeMessageTables", "createTables"])

/** The world's mutable state: storage timing, the faults in force, and a client action to run before the endpoint's next store. */
interface World {
  /** The in-memory storage itself (no latency, no faults): for the test's own reads and table creation. */
  raw: StorageService | undefined
  readonly latency: () => number
  faultsOn: boolean
  /** Every operation fails until this time (ms). */
  outageUntil: number
  /** Per operation (or "*"), how its next calls fail, in order. */
  readonly failNext: Map<string, Array<FaultKind>>
  /** The push in flight is interrupted when it reaches this many more storage operations (then forgotten). */
  interruptAt: { left: number; readonly reached: Deferred.Deferred<void> } | undefined
  /** Run just before the endpoint's next `saveMessage` reaches storage (then forgotten). */
  interleave: Effect.Effect<void> | undefined
  /** The operations made to fail so far, in order (a lost one as `name:lost`). */
  readonly failed: Array<string>
  /** The operations that reached storage so far, in order. */
  readonly applied: Array<string>
  /** The node dies right after the next of these operations is applied: whoever called it waits forever (then forgotten). */
  dieAfter: { readonly operations: ReadonlySet<string>; readonly died: Deferred.Deferred<string> } | undefined
}

const newWorld = (latency: () => number): World => ({
  raw: undefined,
  latency,
  faultsOn: false,
  outageUntil: 0,
  failNext: new Map(),
  interruptAt: undefined,
  interleave: undefined,
  failed: [],
  applied: [],
  dieAfter: undefined
})

const failsNow = (world: World, operation: string, now: number): FaultKind | undefined => {
  if (!world.faultsOn || NEVER_FAIL.has(operation)) return undefined
  if (now < world.outageUntil) {
    tally.outageRefusals++
    return "refused"
  }
  for (const key of [operation, "*"]) {
    const [kind, ...left] = world.failNext.get(key) ?? []
    if (kind !== undefined) {
      if (left.length === 0) world.failNext.delete(key)
      else world.failNext.set(key, left)
      tally[kind]++
      return kind
    }
  }
  return undefined
}

/**
 * In-memory storage whose every operation takes `world.latency()` ms of TestClock time (half before
 * it reaches storage, half after) and fails when `world` says so: refused without reaching storage,
 * or lost after it was applied; a push to be interrupted is let go at its boundary (the test
 * interrupts it there); the test crypto key; the in-memory event log.
 */
const worldParts = (world: World) =>
  Layer.mergeAll(
    Layer.effect(
      Storage,
      Effect.map(Storage, (inner) => {
        world.raw = inner
        return mapStorageOperations(inner, (name) => <A, E>(operation: Effect.Effect<A, E>): Effect.Effect<A, E> =>
          Effect.gen(function*() {
            const interrupt = world.interruptAt
            if (interrupt !== undefined && !NEVER_FAIL.has(name) && --interrupt.left === 0) {
              world.interruptAt = undefined
              yield* Deferred.succeed(interrupt.reached, undefined)
              // The sender's interrupt arrives here, at the boundary, if the push can be interrupted now.
              for (let i = 0; i < 5; i++) yield* Effect.yieldNow
            }
            const ms = world.latency()
            const before = Math.floor(ms / 2)
            yield* TestClock.adjust(before)
            if (name === "saveMessage" && world.interleave !== undefined) {
              const action = world.interleave
              world.interleave = undefined
              yield* action
            }
            const fault = failsNow(world, name, yield* Clock.currentTimeMillis)
            if (fault === "refused") {
              world.failed.push(name)
              yield* TestClock.adjust(ms - before)
              return yield* Effect.fail(new StorageError({ operation: name, reason: new Unavailable(), cause: "injected fault" }) as E)
            }
            const result = yield* operation
            world.applied.push(name)
            const dies = world.dieAfter
            if (dies !== undefined && dies.operations.has(name)) {
              world.dieAfter = undefined
              yield* Deferred.succeed(dies.died, name)
              // Nothing of the node runs any more (interruptible even in a step that is not: the test
              // interrupts it to stand for the process's end).
              return yield* Effect.interruptible(Effect.never)
            }
            yield* TestClock.adjust(ms - before)
            if (fault === "lost") {
              world.failed.push(`${name}:lost`)
              return yield* Effect.fail(new StorageError({ operation: name, reason: new Unavailable(), cause: "injected fault: applied, answer lost" }) as E)
            }
            return result
          }))
      })
    ).pipe(Layer.provide(layerMemory(STORAGE))),
    EndpointCrypto.layerTest,
    EventLog.layerMemory
  )

// ── the scene: a subscriber, its sessions, the endpoint ─────────────────────────────────────────

interface PushSpec {
  readonly channel: 0 | 1
  readonly ttl: number
  readonly topic?: string | undefined
  readonly urgency?: string | undefined
  /** With a `Push-Receipt` (when the scene has a receipt subscription). */
  readonly receipt?: boolean | undefined
  /** false: the node refuses the direct delivery (as a full queue would), so the endpoint stores it. */
  readonly direct?: boolean | undefined
  /** What the client does between the endpoint's read of the router record and its store. */
  readonly race?: "none" | "resume" | "ackAll" | "disconnect" | undefined
  /** The sender leaves when the push reaches its n-th storage operation (0: it waits for the answer). */
  readonly interruptAt?: number | undefined
}

interface Pushed {
  readonly index: number
  readonly spec: PushSpec
  readonly channelId: string
  readonly status: number
  /** The accepted message's id (from `Location`); undefined when refused or never answered (status 0). */
  readonly version: string | undefined
  /**
   * Refused after its message was stored, and taking it back failed too (a `deleteMessage` failed
   * while it was handled), or a write of it was applied with its answer lost, or its sender left:
   * it may still be delivered, as an answer 503 (or none) allows.
   */
  readonly maybeStored: boolean
  /** Answered 503, or would have been had its sender not left: no promise was made. */
  readonly failed: boolean
  /** Its cancel was answered 204 when the client had seen this much of the wire: nothing of it may come after. */
  cancelledAt?: number | undefined
  /** A cancel of it was answered 204 or 503 (which may have removed it). */
  cancelTried?: boolean | undefined
  readonly at: number
  /** Seconds: the message is expired from then on. */
  readonly expiresAt: number
}

/** What the client saw, in order, across its sessions. */
type Wire =
  | {
    readonly kind: "received"
    readonly session: number
    readonly version: string
    /** Sessions that had not ended when it was received (a closing one may still be deleting acked rows). */
    readonly unended: ReadonlySet<number>
  }
  | { readonly kind: "acked"; readonly session: number; readonly version: string }

/** A push's body: its index (so that a stored row tells which push it is, id or not). */
const bodyOf = (index: number): Buffer => Buffer.from(`push ${index}`)

const fakeRequest = { headers: {}, socket: { remoteAddress: "127.0.0.1" } } as unknown as IncomingMessage

const makeScene = (world: World, receiptsOn: boolean) =>
  Effect.gen(function*() {
    const harness = yield* makeHarness({ msgLimit: 10_000, pageSize: 3 })
    const limits = makeRateLimits(NO_LIMITS)
    const receipts = yield* makeEndpointReceipts(ENDPOINT, limits)
    const webpush = yield* makeWebPushHandlers(ENDPOINT, receipts, limits).pipe(
      Effect.provideService(WebPushRouter, harness.router),
      Effect.provide(Bridges.none)
    )
    const raw = world.raw as StorageService
    const crypto = yield* EndpointCrypto
    const sessions: Array<Client> = []
    const seen = new Map<Client, number>()
    const wire: Array<Wire> = []
    const pushes: Array<Pushed> = []
    /** What the test did and saw, for failure messages (a message is named by its push once known). */
    const trace: Array<{ readonly at: number; readonly text: (label: (version: string) => string) => string }> = []

    const clock = Clock.currentTimeMillis
    const stamp = (ms: number) => new Date(ms).toISOString()
    const note = (what: string) => Effect.map(clock, (at) => void trace.push({ at, text: () => what }))

    /** Frames the client got since last looked at. */
    const observe = (c: Client, at: number) => {
      const from = seen.get(c) ?? 0
      const session = sessions.indexOf(c)
      for (const frame of c.sent.frames.slice(from)) {
        if (frame["messageType"] !== "notification") continue
        const version = String(frame["version"])
        const unended = new Set(sessions.flatMap((other, i) => (other.machine.isClosed ? [] : [i])))
        wire.push({ kind: "received", session, version, unended })
        trace.push({ at, text: (label) => `session ${session} receives ${label(version)}` })
      }
      seen.set(c, c.sent.frames.length)
    }
    const drive = (c: Client, effect: Effect.Effect<void>) =>
      Effect.andThen(effect, Effect.flatMap(clock, (at) => Effect.sync(() => observe(c, at))))

    /** Sessions of a node that died: they never run again. */
    const dead = new Set<Client>()
    const live = () => sessions.find((c) => isLive(c.machine.phase))
    const open = () => sessions.filter((c) => !c.machine.isClosed && !dead.has(c))

    /** When the session retries a failed storage call next (ms). */
    const retryAt = (c: Client): number => {
      const phase = c.machine.phase
      if (phase._tag === "Closing") return phase.retry?.at ?? Number.POSITIVE_INFINITY
      return isLive(phase) ? phase.session.retry?.at ?? Number.POSITIVE_INFINITY : Number.POSITIVE_INFINITY
    }

    /** This month's, last month's and the coming tables exist (as the deployment creates them ahead). */
    const ensureTables = Effect.flatMap(clock, (now) =>
      raw.createTables([...new Set([...activeTableNames(STORAGE, now), ...activeTableNames(STORAGE, now + DAY_MS)])]).pipe(Effect.orDie))

    /** Hand every session what its mailbox holds, and a `Tick` when its deadline is due (a ping is answered). */
    const settle = Effect.gen(function*() {
      for (let round = 0;; round++) {
        if (round > 10_000) return yield* Effect.die(new Error("the sessions never settle"))
        let busy = false
        for (const c of open()) {
          if (c.handle.mailbox.size > 0) {
            yield* drive(c, pump(c))
            busy = true
          }
          if (c.machine.isClosed || c.handle.deadline > (yield* clock)) continue
          const pings = c.sent.pings
          yield* drive(c, c.feed({ _tag: "Tick" }))
          if (c.sent.pings > pings && !c.machine.isClosed) yield* drive(c, c.feed({ _tag: "Pong" }))
          busy = true
        }
        if (!busy) return
      }
    })

    /** Let `ms` pass: every retry runs when it is due; keepalives at the end. */
    const advance = (ms: number) =>
      Effect.gen(function*() {
        const target = (yield* clock) + ms
        for (;;) {
          yield* settle
          const now = yield* clock
          const next = Math.min(target, ...open().map(retryAt))
          if (next > now) {
            yield* TestClock.adjust(next - now)
            yield* ensureTables
          }
          if (next >= target) return yield* settle
        }
      })

    /** Until every session has ended (storage healthy). */
    const untilAllClosed = Effect.gen(function*() {
      for (let i = 0; i < 1000 && open().some((c) => !isLive(c.machine.phase)); i++) yield* advance(1_000)
      assert.isFalse(open().some((c) => !isLive(c.machine.phase)), "a closing session never ended")
    })

    const connect = Effect.gen(function*() {
      const c = yield* harness.connect()
      sessions.push(c)
      return c
    })

    // The subscriber: a new uaid, two channels, and (with receipts) a receipt subscription.
    const first = yield* connect
    yield* drive(first, first.frame({ messageType: "hello", use_webpush: true }))
    const uaid = String(first.of("hello")[0]?.["uaid"])
    for (const channelID of CHANNELS) yield* drive(first, first.frame({ messageType: "register", channelID }))
    const endpoints = first.of("register").map((f) => {
      assert.strictEqual(f["status"], 200, "register")
      const [, , version, token] = new URL(String(f["pushEndpoint"])).pathname.split("/")
      return { version: version as string, token: token as string }
    })
    const receiptUrl = receiptsOn ? (yield* receipts.subscribe(fakeRequest).pipe(Effect.orDie)).headers.location : undefined
    yield* ensureTables
    yield* note(`subscribed ${uaid}, table ${(yield* raw.getUser(uaid).pipe(Effect.orDie))?.currentMonth}`)

    // ── what the client does ──

    /** Versions the client received in this session and has not acked. */
    const unacked = (c: Client) => {
      const acked = new Set(c.acked)
      return [...new Set(c.of("notification").map((f) => String(f["version"])))].filter((v) => !acked.has(v))
    }
    const ack = (c: Client, versions: ReadonlyArray<string>) =>
      Effect.gen(function*() {
        if (versions.length === 0 || !isLive(c.machine.phase)) return
        const channelOf = new Map(c.of("notification").map((f) => [String(f["version"]), String(f["channelID"])]))
        const session = sessions.indexOf(c)
        for (const version of versions) wire.push({ kind: "acked", session, version })
        const at = yield* clock
        trace.push({ at, text: (label) => `session ${session} acks ${versions.map(label).join(", ")}` })
        yield* drive(c, c.frame({ messageType: "ack", updates: versions.map((version) => ({ channelID: channelOf.get(version) ?? CHANNELS[0], version })) }))
      })
    /** Ack whatever comes until nothing more does (or the session ends). */
    const ackAll = (c: Client) =>
      Effect.gen(function*() {
        for (let round = 0; round < 200; round++) {
          yield* settle
          const pending = unacked(c)
          if (pending.length === 0 || !isLive(c.machine.phase)) return
          yield* ack(c, pending)
        }
      })
    const disconnect = Effect.gen(function*() {
      const c = live()
      if (c === undefined) return
      yield* note(`session ${sessions.indexOf(c)} closes`)
      yield* drive(c, c.feed({ _tag: "SocketClosed" }))
      yield* settle
    })
    /**
     * The live session's client leaves and its node dies right after the first of `operations` its
     * close sequence applies (nothing of the node runs after that): what storage holds then is all
     * that is left. The name of the operation it died after.
     */
    const dieClosing = (operations: ReadonlyArray<string>) =>
      Effect.gen(function*() {
        const c = live()
        if (c === undefined) return undefined
        const died = yield* Deferred.make<string>()
        world.dieAfter = { operations: new Set(operations), died }
        const closing = yield* Effect.forkChild(c.feed({ _tag: "SocketClosed" }), { startImmediately: true })
        const after = yield* Effect.raceFirst(Deferred.await(died), Effect.as(Fiber.await(closing), undefined))
        world.dieAfter = undefined
        yield* Fiber.interrupt(closing)
        if (after !== undefined) {
          dead.add(c)
          tally.nodeDeaths++
        }
        yield* note(`session ${sessions.indexOf(c)} closes; its node dies after ${after ?? "nothing"}`)
        return after
      })

    /** A new connection resuming the uaid (when no session is live). */
    const resume = Effect.gen(function*() {
      if (live() !== undefined) return undefined
      const c = yield* connect
      yield* drive(c, c.frame({ messageType: "hello", uaid, use_webpush: true }))
      yield* note(`session ${sessions.indexOf(c)} hello: ${isLive(c.machine.phase) ? c.machine.phase._tag : `closed ${JSON.stringify(c.sent.closed)}`}`)
      yield* settle
      return c
    })

    // ── the endpoint ──

    const push = (spec: PushSpec) =>
      Effect.gen(function*() {
        const index = pushes.length
        const channelId = CHANNELS[spec.channel]
        const { version: segment, token } = endpoints[spec.channel] as { version: string; token: string }
        const headers: Record<string, string> = { ttl: String(spec.ttl) }
        if (spec.topic !== undefined && spec.topic !== "") headers["topic"] = spec.topic
        if (spec.urgency !== undefined && spec.urgency !== "") headers["urgency"] = spec.urgency
        if (spec.receipt === true && receiptUrl !== undefined) headers["push-receipt"] = receiptUrl
        // The body names the push: a stored row, whatever its id, is known by it.
        headers["content-encoding"] = "aes128gcm"
        const request: PushRequest = { headers, body: Effect.succeed(bodyOf(index)), peer: "127.0.0.1" }
        const c = live()
        world.interleave = spec.race === "resume" && c === undefined
          ? Effect.asVoid(Effect.flatMap(resume, (r) => (r === undefined ? Effect.void : ackAll(r))))
          : spec.race === "ackAll" && c !== undefined
          ? ackAll(c)
          : spec.race === "disconnect" && c !== undefined
          ? disconnect
          : undefined
        harness.node.takesDirect = spec.direct !== false
        const at = yield* clock
        const failedBefore = world.failed.length
        const appliedBefore = world.applied.length
        const eventsBefore = harness.events.length
        const reached = yield* Deferred.make<void>()
        world.interruptAt = spec.interruptAt === undefined || spec.interruptAt === 0 ? undefined : { left: spec.interruptAt, reached }
        const sending = yield* Effect.forkChild(Effect.result(webpush.send(request, segment, token)), { startImmediately: true })
        const ended = yield* Effect.raceFirst(Effect.as(Deferred.await(reached), false), Effect.as(Fiber.await(sending), true))
        const exit = ended ? yield* Fiber.await(sending) : yield* Fiber.interrupt(sending).pipe(Effect.andThen(Fiber.await(sending)))
        world.interruptAt = undefined
        world.interleave = undefined
        harness.node.takesDirect = true
        const answer = Exit.isSuccess(exit) ? exit.value : undefined
        if (answer === undefined) {
          tally.interruptedPushes++
          if (world.applied.slice(appliedBefore).includes("saveMessage")) tally.interruptedPushesAfterAStore++
        }
        const status = answer === undefined ? 0 : answer._tag === "Success" ? answer.success.status : toErrorResponse(answer.failure).status
        if (status === 503) tally.pushes503++
        const location = answer?._tag === "Success" ? answer.success.headers["location"] : undefined
        const version = location === undefined ? undefined : location.slice(location.indexOf("/m/") + 3)
        // A 503 after the store: the message was taken back, unless that failed — or it is a topic
        // message, which is left in place (taking it back would lose the topic's previous message too);
        // a write whose answer was lost may have stored it; so may a push whose sender left.
        const faults = world.failed.slice(failedBefore)
        const maybeStored = version === undefined && (status === 0 || faults.some((f) => f.endsWith(":lost")) || status === 503 &&
          (faults.includes("deleteMessage") || (spec.topic !== undefined && spec.topic !== "")))
        // A sender that left gets no answer; the push still ran to its end, and failed if its routing did.
        const failed = status === 503 ||
          status === 0 && harness.events.slice(eventsBefore).some((e) => e.type === "notification.routed.1" && e.data.outcome === "failed")
        const pushed: Pushed = { index, spec, channelId, status, version, maybeStored, failed, at, expiresAt: Math.floor(at / 1000) + spec.ttl }
        pushes.push(pushed)
        trace.push({ at, text: () => `push #${index} ${JSON.stringify(spec)} → ${status}` })
        yield* settle
        return pushed
      })

    /** `DELETE` of the `Location` of the accepted push `back` places before the last accepted one. */
    const cancel = (back: number) =>
      Effect.gen(function*() {
        const accepted = pushes.filter((p) => p.version !== undefined)
        const p = accepted[accepted.length - 1 - back]
        if (p === undefined) return
        const status = yield* webpush.cancel(p.version as string).pipe(
          Effect.map((answer) => answer.status),
          Effect.catchTag("StorageError", () => Effect.succeed(503)),
          Effect.catch((error) => Effect.succeed(toErrorResponse(error).status))
        )
        if (status === 204) {
          p.cancelledAt = wire.length
          tally.cancels204++
        } else if (status === 404) tally.cancels404++
        // A cancel refused with a lost delete may have removed it: the message is not owed any more.
        if (status !== 404) p.cancelTried = true
        trace.push({ at: yield* clock, text: () => `cancel of #${p.index} → ${status}` })
        yield* settle
      })

    /** To `offsetMs` from the next midnight that starts a month (the one after, if that is past). */
    const midnight = (offsetMs: number) =>
      Effect.gen(function*() {
        const now = new Date(yield* clock)
        let target = Date.UTC(now.getUTCFullYear(), now.getUTCMonth() + 1, 1) + offsetMs
        if (target <= now.getTime()) target = Date.UTC(now.getUTCFullYear(), now.getUTCMonth() + 2, 1) + offsetMs
        yield* note(`clock to ${stamp(target)}`)
        yield* advance(target - now.getTime())
      })

    const userGone = Effect.map(raw.getUser(uaid).pipe(Effect.orDie), (user) => user === undefined)

    /**
     * The end of a scenario: storage healthy, every session ended, the clock on a little; the client
     * resumes and acks everything, twice. Then the checks.
     */
    const finish = (dropped: boolean) =>
      Effect.gen(function*() {
        world.faultsOn = false
        world.interleave = undefined
        yield* disconnect
        yield* untilAllClosed
        yield* advance(1_500)
        for (let pass = 0; pass < 2; pass++) {
          const c = yield* resume
          assert.isDefined(c, "a session was still live")
          assert.isTrue(isLive(c!.machine.phase), `the final resume failed: ${JSON.stringify(c!.sent.closed)}`)
          yield* ackAll(c!)
          yield* disconnect
          yield* untilAllClosed
          yield* advance(1_000)
        }
        // The final resume may find the user on a table two months old (the clock crossed a second
        // boundary since it last moved): it is dropped then, as at any hello.
        yield* check(dropped || (yield* userGone))
      })

    const check = (dropped: boolean) =>
      Effect.gen(function*() {
        const finalSec = Math.floor((yield* clock) / 1000)
        const accepted = new Map(pushes.flatMap((p) => (p.version === undefined ? [] : [[p.version, p] as const])))
        const describe = (p: Pushed) =>
          `push #${p.index} (${JSON.stringify(p.spec)}, answered ${p.status} at ${stamp(p.at)})`
        const label = (version: string) => {
          const p = accepted.get(version)
          return p === undefined ? "a message never accepted" : `#${p.index}`
        }
        // The test's steps, and what the sessions and the endpoint recorded meanwhile.
        const recorded = harness.events.flatMap((e) => {
          const version = "version" in e.data ? String(e.data.version) : ""
          switch (e.type) {
            case "notification.routed.1":
              return [{ at: e.time, text: () => `  endpoint routes ${label(version)}: ${e.data.outcome}` }]
            case "notification.stored.1":
              return e.data.reason === "disconnect" ? [{ at: e.time, text: () => `  a closing session saves ${label(version)}` }] : []
            case "notification.expired.1":
              return [{ at: e.time, text: () => `  ${label(version)} expired` }]
            case "month.migrated.1":
              return [{ at: e.time, text: () => `  moved from ${e.data.from} to ${e.data.to}` }]
            case "uaid.reset.1":
              return [{ at: e.time, text: () => `  user dropped (${e.data.reason})` }]
            case "session.ended.1":
              return [{ at: e.time, text: () => `  a session ended (${e.data.reason})` }]
            default:
              return []
          }
        })
        const timeline = [...trace, ...recorded].map((t, i) => ({ ...t, i })).sort((a, b) => a.at - b.at || a.i - b.i)
        const context = () => `\n  what happened:\n    ${timeline.map((t) => `${stamp(t.at)} ${t.text(label)}`).join("\n    ")}`
        // Safety, on what the client saw in order. The one window where an acked message may come
        // again: the client reconnected while the session it acked in is still ending, its delete of
        // the acked row failing and being retried (no other session can know of that ack yet). Once
        // that session has ended, the message never comes again.
        const ackedSoFar = new Map<string, Set<number>>()
        for (const [at, w] of wire.entries()) {
          if (w.kind === "acked") {
            const ackers = ackedSoFar.get(w.version) ?? new Set()
            ackedSoFar.set(w.version, ackers.add(w.session))
            continue
          }
          const p = accepted.get(w.version)
          if (p === undefined) {
            const key = yield* crypto.parseMessageId(w.version).pipe(Effect.orDie)
            if (pushes.some((q) => q.maybeStored && q.channelId === key.channelId)) continue
            const refused = pushes.filter((q) => q.version === undefined).map(describe)
            assert.fail(
              `session ${w.session} was delivered a message the endpoint never accepted (${key.kind} message, channel ${
                CHANNELS.findIndex((c) => c === key.channelId)
              }, ${key.kind === "topic" ? `topic ${key.topic}` : `sort key ${stamp(key.sortkeyTimestamp)}`}); refused: ${refused.join("; ")}${context()}`
            )
          }
          assert.isFalse(
            p.cancelledAt !== undefined && at >= p.cancelledAt,
            `${describe(p)}: its cancel was answered 204, then it was delivered to session ${w.session}${context()}`
          )
          const ackers = [...(ackedSoFar.get(w.version) ?? [])]
          assert.isFalse(
            ackers.length > 0 && (ackers.includes(w.session) || !ackers.some((a) => w.unended.has(a))),
            `${describe(p)}: acked by the client (session ${ackers.join(", ")}), then delivered again to session ${w.session}${context()}`
          )
        }
        // Nothing delivered after its TTL ran out (the delivery's own time: the session's event).
        for (const e of harness.events) {
          if (e.type !== "notification.delivered.1") continue
          const p = accepted.get(e.data.version)
          if (p !== undefined && p.spec.ttl > 0) {
            assert.isBelow(Math.floor(e.time / 1000), p.expiresAt, `${describe(p)}: delivered at ${stamp(e.time)}, after it expired${context()}`)
          }
        }
        // Liveness: every accepted message with a TTL was acked by the end — except one that only a
        // node that died held: delivered to its session directly (never read from storage), not acked.
        const received = new Set(wire.flatMap((w) => (w.kind === "received" ? [w.version] : [])))
        const deadSessions = new Set([...dead].map((c) => sessions.indexOf(c)))
        const fromStorage = new Set(harness.events.flatMap((e) => (e.type === "notification.delivered.1" && e.data.source !== "direct" ? [e.data.version] : [])))
        const heldByTheDead = new Set(wire.flatMap((w) => (w.kind === "received" && deadSessions.has(w.session) && !fromStorage.has(w.version) ? [w.version] : [])))
        for (const p of accepted.values()) {
          if (p.spec.ttl === 0 || dropped || ackedSoFar.has(p.version!) || p.cancelTried === true || heldByTheDead.has(p.version!)) continue
          if (finalSec >= p.expiresAt) continue
          const topic = p.spec.topic === undefined || p.spec.topic === "" ? undefined : `${p.channelId}:${p.spec.topic}`
          const replaced = topic !== undefined && pushes.some((q) =>
            q.index > p.index && `${q.channelId}:${q.spec.topic}` === topic &&
            (q.version !== undefined ? q.spec.ttl > 0 || received.has(q.version) : q.maybeStored)
          )
          if (replaced) continue
          assert.fail(`${describe(p)} ${received.has(p.version!) ? "was delivered but never acked, and never came again" : "was never delivered"}${context()}`)
        }
        // Nothing stranded: after the full drain no table holds an unexpired message of a push that
        // was answered 201/202, or not at all (a sender that left) unless it failed. One that failed
        // (503) may be left where a write of it went (no promise was made; it expires).
        // A node that died between saving a message into the new table and taking it out of the old
        // one leaves a copy there (duplicated, never lost): not checked after a death.
        if (dropped || dead.size > 0) return
        for (const table of yield* raw.listMessageTables.pipe(Effect.orDie)) {
          const left = (yield* raw.fetchMessages(uaid, table, 100).pipe(Effect.orDie)).messages.flatMap((n) => {
            const p = pushes.find((q) => n.data === bodyOf(q.index).toString("base64url"))
            return p === undefined || p.failed ? [] : [`push #${p.index} (answered ${p.status})`]
          })
          assert.deepStrictEqual(left, [], `stored in ${table} after the full drain${context()}`)
        }
      })

    return {
      harness,
      world,
      uaid,
      sessions,
      pushes,
      wire,
      trace,
      raw,
      live,
      note,
      settle,
      advance,
      midnight,
      push,
      cancel,
      dieClosing,
      resume,
      disconnect,
      ack,
      ackAll,
      unacked,
      userGone,
      finish,
      check
    }
  })

// ── the property ────────────────────────────────────────────────────────────────────────────────

const Push = Schema.Struct({
  channel: Schema.Literals([0, 1]),
  ttl: Schema.Literals([0, 5, 60, 3600, 2_592_000]),
  topic: Schema.Literals(["", "a", "b"]),
  urgency: Schema.Literals(["", "high", "low"]),
  receipt: Schema.Boolean,
  direct: Schema.Boolean,
  race: Schema.Literals(["none", "resume", "ackAll", "disconnect"]),
  interruptAt: Schema.Literals([0, 0, 0, 1, 2, 3, 4, 5, 6, 8])
})

const Action = Schema.Union([
  Schema.Struct({ op: Schema.Literal("ack"), count: Schema.Literals([1, 2, 100]) }),
  Schema.Struct({ op: Schema.Literal("disconnect") }),
  Schema.Struct({ op: Schema.Literal("resume") }),
  Schema.Struct({ op: Schema.Literal("poke") }),
  Schema.Struct({ op: Schema.Literal("wait"), ms: Schema.Literals([1, 40, 300, 2_000, 61_000, 3_600_000]) }),
  Schema.Struct({ op: Schema.Literal("midnight"), offsetMs: Schema.Literals([-3_000, -20, 0, 20, 2_000, 45_000]) }),
  Schema.Struct({
    op: Schema.Literal("fault"),
    operation: Schema.Literals(FAULTY_OPERATIONS),
    count: Schema.Literals([1, 2, 3]),
    kind: Schema.Literals(["refused", "lost"])
  }),
  Schema.Struct({ op: Schema.Literal("cancel"), back: Schema.Literals([0, 1, 2]) }),
  Schema.Struct({ op: Schema.Literal("die"), after: Schema.Literals(["ackMessages", "getUser", "saveMessages", "deleteMessage", "clearNodeId"]) }),
  Schema.Struct({ op: Schema.Literal("outage"), ms: Schema.Literals([200, 2_000, 20_000]) })
])

/** One step: maybe a push, then something else happens. */
const Step = Schema.Struct({ push: Schema.NullOr(Push), action: Action })
type Step = typeof Step.Type

const Run = Schema.Struct({
  receipts: Schema.Boolean,
  /** The month (0-based) on whose last day the run starts, and how long before its midnight. */
  month: Schema.Literals([0, 1, 11]),
  beforeMidnightMs: Schema.Literals([5_000, 20_000, 45_000, 180_000])
})

const Steps = Arbitrary.array(Arbitrary.schema(Step), { maxLength: 24 })
/** Times (ms) storage operations take, and that pass between steps, used in turn. */
const Latencies = Arbitrary.array(Arbitrary.schema(Schema.Literals([0, 1, 3, 17, 120, 1_100])), { minLength: 1, maxLength: 6 })
const Gaps = Arbitrary.array(Arbitrary.schema(Schema.Literals([0, 1, 5, 40, 300])), { minLength: 1, maxLength: 6 })

const cycle = (times: ReadonlyArray<number>) => {
  let i = 0
  return () => times[i++ % times.length] as number
}

const runScenario = (run: typeof Run.Type, steps: ReadonlyArray<Step>, latencies: ReadonlyArray<number>, gaps: ReadonlyArray<number>) => {
  const world = newWorld(cycle(latencies))
  const gap = cycle(gaps)
  return Effect.gen(function*() {
    tally.runs++
    yield* TestClock.setTime(Date.UTC(2026, run.month + 1, 1) - run.beforeMidnightMs)
    const scene = yield* makeScene(world, run.receipts)
    world.faultsOn = true
    let outageLeft = OUTAGE_BUDGET_MS
    let faultsLeft = FAULT_BUDGET
    let dropped = false
    for (const step of steps) {
      if (step.push !== null) yield* scene.push(step.push)
      const action = step.action
      switch (action.op) {
        case "ack": {
          const c = scene.live()
          if (c !== undefined) yield* scene.ack(c, scene.unacked(c).slice(0, action.count))
          break
        }
        case "disconnect":
          yield* scene.disconnect
          break
        case "resume":
          yield* scene.resume
          break
        case "poke":
          scene.live()?.handle.mailbox.offer({ _tag: "CheckStorage" })
          break
        case "wait":
          yield* scene.advance(action.ms)
          break
        case "midnight":
          yield* scene.midnight(action.offsetMs)
          break
        case "fault": {
          const count = Math.min(action.count, faultsLeft)
          faultsLeft -= count
          if (count === 0) break
          world.failNext.set(action.operation, [...(world.failNext.get(action.operation) ?? []), ...Array.from({ length: count }, () => action.kind)])
          yield* scene.note(`the next ${count} ${action.operation} fail (${action.kind})`)
          break
        }
        case "cancel":
          yield* scene.cancel(action.back)
          break
        case "die":
          yield* scene.dieClosing([action.after])
          break
        case "outage": {
          const ms = Math.min(action.ms, outageLeft)
          if (ms === 0) break
          outageLeft -= ms
          const now = yield* Clock.currentTimeMillis
          world.outageUntil = Math.max(world.outageUntil, now + ms)
          yield* scene.note(`storage out for ${ms} ms`)
          break
        }
      }
      yield* scene.settle
      yield* scene.advance(gap())
      // A user whose record names a table two months old is dropped (by the endpoint, or at its next hello).
      if (yield* scene.userGone) {
        dropped = true
        yield* scene.note("the user was dropped")
        break
      }
    }
    yield* scene.finish(dropped)
  }).pipe(Effect.provide(worldParts(world)))
}

describe("messages across month boundaries, storage failing", () => {
  it.effect.prop(
    "every push answered 201/202 is delivered and acked once, never again after its ack; nothing else is delivered",
    [Arbitrary.schema(Run), Steps, Latencies, Gaps],
    ([run, steps, latencies, gaps]) => runScenario(run, steps, latencies, gaps),
    { timeout: 120_000, arbitrary: { runs: 500, size: 24 } }
  )



  // ── examples ──────────────────────────────────────────────────────────────────────────────────

  /** A scene at `start` with storage taking the usual time. */
  const example = (start: number, body: (scene: Effect.Success<ReturnType<typeof makeScene>>) => Effect.Effect<void>) => {
    const world = newWorld(() => STORAGE_LATENCY_MS)
    return Effect.gen(function*() {
      yield* TestClock.setTime(start)
      const scene = yield* makeScene(world, false)
      yield* body(scene)
    }).pipe(Effect.provide(worldParts(world)))
  }

  it.effect("a push the endpoint stores on a cached record naming last month's table, after the client moved to this month's, is delivered", () =>
    example(Date.UTC(2026, 0, 31, 23, 59, 30), (scene) =>
      Effect.gen(function*() {
        // Offline on January's table; a push reads the record (the endpoint caches it) and stores.
        yield* scene.disconnect
        const before = yield* scene.push({ channel: 0, ttl: 3600 })
        assert.strictEqual(before.status, 201)
        // Past midnight, within the cache's 60 s: the client comes back and moves to February's table.
        yield* scene.advance(Date.UTC(2026, 1, 1, 0, 0, 2) - (yield* Clock.currentTimeMillis))
        const c = yield* scene.resume
        yield* scene.ackAll(c!)
        assert.strictEqual((yield* scene.raw.getUser(scene.uaid).pipe(Effect.orDie))?.currentMonth, "message_2026_02", "the user moved")
        assert.deepStrictEqual(c!.acked, [before.version], "January's message delivered at the move")
        // The next push reuses the cached record (offline, January's table).
        const after = yield* scene.push({ channel: 0, ttl: 3600 })
        assert.strictEqual(after.status, 201)
        yield* scene.ackAll(c!)
        assert.include(c!.acked, after.version, "a push answered 201 right after the client moved to this month's table did not reach its live session")
        yield* scene.finish(false)
      })))

  it.effect("a push whose record was read before the client's month move, and stored after it, is delivered", () =>
    example(Date.UTC(2026, 11, 31, 23, 59, 50), (scene) =>
      Effect.gen(function*() {
        // Offline on December's table, past midnight: January's table is this month's.
        yield* scene.disconnect
        yield* scene.advance(Date.UTC(2027, 0, 1, 0, 0, 1) - (yield* Clock.currentTimeMillis))
        // The endpoint reads the record (December); the client resumes and moves before the store.
        const raced = yield* scene.push({ channel: 1, ttl: 3600, race: "resume" })
        assert.strictEqual(raced.status, 201)
        assert.strictEqual((yield* scene.raw.getUser(scene.uaid).pipe(Effect.orDie))?.currentMonth, "message_2027_01", "the user moved")
        const c = scene.live()
        assert.isDefined(c, "the client is connected")
        yield* scene.ackAll(c!)
        assert.include(c!.acked, raced.version, "a push answered 201, stored in last month's table as the client moved, did not reach its live session")
        yield* scene.finish(false)
      })))

  it.effect("a push stored into last month's table as its client moves, the client leaving before it read that table again, is delivered at the next hello", () =>
    example(Date.UTC(2026, 11, 31, 23, 59, 50), (scene) =>
      Effect.gen(function*() {
        // Offline on December's table, past midnight. The client comes back between the endpoint's
        // read of the record (December) and its store, and drains December's table; its move's
        // writes are applied but their answers lost, so the message lands in December's table while
        // the record still names it, and the session is still retrying when the record has moved.
        yield* scene.disconnect
        yield* scene.advance(Date.UTC(2027, 0, 1, 0, 0, 1) - (yield* Clock.currentTimeMillis))
        scene.world.faultsOn = true
        scene.world.failNext.set("addChannels", ["lost"])
        scene.world.failNext.set("updateUser", Array.from({ length: 20 }, () => "lost" as const))
        const raced = yield* scene.push({ channel: 0, ttl: 3600, race: "resume" })
        assert.strictEqual(raced.status, 201)
        yield* scene.advance(1_000)
        assert.strictEqual((yield* scene.raw.getUser(scene.uaid).pipe(Effect.orDie))?.currentMonth, "message_2027_01", "the record points at January")
        const c = scene.live()
        assert.strictEqual(c?.machine.phase._tag, "Moving", "the client is connected, its session still moving")
        assert.notInclude(c!.acked.concat(scene.unacked(c!)), raced.version, "not delivered before the client leaves")
        // The client leaves before its session reads December's table again.
        yield* scene.disconnect
        scene.world.faultsOn = false
        const again = yield* scene.resume
        yield* scene.ackAll(again!)
        assert.include(again!.acked, raced.version, "a push answered 201, stored in December's table as the client moved, was not delivered")
        yield* scene.finish(false)
      })))

  it.effect("a client leaving with many unacked messages, its save applied but answered with a timeout twice: retried from the start, each message stored once", () =>
    example(Date.UTC(2026, 2, 10, 12, 0, 0), (scene) =>
      Effect.gen(function*() {
        const c = scene.live()!
        const pushed: Array<string> = []
        for (let i = 0; i < 60; i++) pushed.push((yield* scene.push({ channel: (i % 2) as 0 | 1, ttl: 3600 })).version!)
        assert.strictEqual(scene.unacked(c).length, 60, "delivered directly, none acked")
        scene.world.faultsOn = true
        scene.world.failNext.set("saveMessages", ["lost", "lost"])
        yield* scene.disconnect
        yield* scene.advance(10_000)
        assert.deepStrictEqual(scene.world.failed, ["saveMessages:lost", "saveMessages:lost"])
        scene.world.faultsOn = false
        const rows = (yield* scene.raw.fetchMessages(scene.uaid, (yield* scene.raw.getUser(scene.uaid).pipe(Effect.orDie))!.currentMonth!, 1000).pipe(Effect.orDie)).messages
        assert.deepStrictEqual(rows.map((n) => n.version).sort(), [...pushed].sort(), "each message stored once, at its id's key")
        const again = yield* scene.resume
        yield* scene.ackAll(again!)
        assert.deepStrictEqual([...again!.acked].sort(), [...pushed].sort())
        yield* scene.finish(false)
      })))

  it.effect("a message cancelled while its client's close sequence retries a save that was applied, its answer lost, is not delivered", () =>
    example(Date.UTC(2026, 2, 10, 12, 0, 0), (scene) =>
      Effect.gen(function*() {
        const c = scene.live()!
        const pushed = yield* scene.push({ channel: 0, ttl: 3600 })
        assert.deepStrictEqual(scene.unacked(c), [pushed.version], "delivered directly, not acked")
        // The close sequence saves it: applied, the answer lost; the save is retried after a backoff.
        scene.world.faultsOn = true
        scene.world.failNext.set("saveMessages", ["lost"])
        yield* scene.disconnect
        assert.deepStrictEqual(scene.world.failed, ["saveMessages:lost"])
        scene.world.faultsOn = false
        // Meanwhile its sender cancels it: the row the first save wrote is found, 204.
        yield* scene.cancel(0)
        assert.isDefined(pushed.cancelledAt, "the cancel was answered 204")
        // The retried save must not bring it back.
        yield* scene.advance(10_000)
        const again = yield* scene.resume
        yield* scene.ackAll(again!)
        assert.deepStrictEqual(again!.acked, [], "a message whose cancel was answered 204 was delivered")
        yield* scene.finish(false)
      })))

  it.effect("a message acked from storage while its closing session retries a save whose answer was lost is not delivered again", () =>
    example(Date.UTC(2026, 2, 10, 12, 0, 0), (scene) =>
      Effect.gen(function*() {
        const c = scene.live()!
        const pushed = yield* scene.push({ channel: 0, ttl: 3600 })
        assert.deepStrictEqual(scene.unacked(c), [pushed.version], "delivered directly, not acked")
        // The close sequence saves it: applied, the answer lost; the save is retried after a backoff.
        scene.world.faultsOn = true
        scene.world.failNext.set("saveMessages", ["lost"])
        yield* scene.disconnect
        assert.deepStrictEqual(scene.world.failed, ["saveMessages:lost"])
        scene.world.faultsOn = false
        // Meanwhile the client is back: it gets the saved row from storage and acks it.
        const resumed = yield* scene.resume
        yield* scene.ackAll(resumed!)
        assert.deepStrictEqual(resumed!.acked, [pushed.version])
        // The closing session's retried save must not bring it back.
        yield* scene.advance(10_000)
        yield* scene.disconnect
        const again = yield* scene.resume
        yield* scene.ackAll(again!)
        assert.deepStrictEqual(again!.of("notification").map((f) => f["version"]), [], "a message the client acked was delivered again")
        yield* scene.finish(false)
      })))

  it.effect("a message acked while deleting acked rows fails, the retry pending when the socket closes, is not delivered again", () =>
    example(Date.UTC(2026, 2, 10, 12, 0, 0), (scene) =>
      Effect.gen(function*() {
        // A stored message, delivered from storage at the resume.
        yield* scene.disconnect
        const stored = yield* scene.push({ channel: 0, ttl: 3600 })
        assert.strictEqual(stored.status, 201)
        const c = yield* scene.resume
        assert.deepStrictEqual(scene.unacked(c!), [stored.version])
        // The client acks it; deleting its row fails (retried with backoff); the socket closes before the retry.
        scene.world.faultsOn = true
        scene.world.failNext.set("ackMessages", ["refused"])
        yield* scene.ack(c!, [stored.version!])
        const phase = c!.machine.phase
        assert.strictEqual(isLive(phase) ? phase.session.retry?.command._tag : undefined, "TombstoneAcked", "the delete is to be retried")
        yield* scene.disconnect
        scene.world.faultsOn = false
        yield* scene.advance(5_000)
        // The next connection must not get it again.
        const again = yield* scene.resume
        assert.deepStrictEqual(again!.of("notification").map((f) => f["version"]), [], "a message the client acked was delivered again on its next connection")
        yield* scene.finish(false)
      })))

  it.effect("a message a closing session saved into last month's table, acked from there at the client's month move, is not delivered again when the closing session follows the move", () =>
    example(Date.UTC(2026, 0, 31, 23, 59, 50), (scene) =>
      Effect.gen(function*() {
        // Delivered directly on January's table, not acked.
        const direct = yield* scene.push({ channel: 0, ttl: 3600 })
        assert.deepStrictEqual(scene.unacked(scene.live()!), [direct.version])
        yield* scene.advance(Date.UTC(2026, 1, 1, 0, 0, 5) - (yield* Clock.currentTimeMillis))
        // The socket closes: the message is saved into January's table, then leaving the record fails (retried).
        scene.world.faultsOn = true
        scene.world.failNext.set("clearNodeId", ["refused"])
        yield* scene.disconnect
        // The client is back at once: it gets the saved copy from January's table, acks it, and moves to February's.
        const c = yield* scene.resume
        yield* scene.ackAll(c!)
        assert.deepStrictEqual(c!.acked, [direct.version])
        assert.strictEqual((yield* scene.raw.getUser(scene.uaid).pipe(Effect.orDie))?.currentMonth, "message_2026_02", "the user moved")
        // The closing session goes on, finds the user moved, and follows it with what it saved.
        yield* scene.advance(5_000)
        yield* scene.ackAll(c!)
        assert.deepStrictEqual(c!.of("notification").map((f) => f["version"]), [direct.version], "a message the client acked was delivered again")
        yield* scene.finish(false)
      })))

  it.effect("a message stored in last month's table while the client moves, delivered after the move and not acked, is delivered on the next connection", () =>
    example(Date.UTC(2026, 0, 31, 23, 59, 50), (scene) =>
      Effect.gen(function*() {
        yield* scene.disconnect
        yield* scene.advance(Date.UTC(2026, 1, 1, 0, 0, 2) - (yield* Clock.currentTimeMillis))
        // The endpoint reads the record (January, offline); before it stores, the client resumes and
        // starts moving, and reading the channel set fails once: the move waits for its retry.
        scene.world.faultsOn = true
        scene.world.failNext.set("getChannels", ["refused"])
        const stored = yield* scene.push({ channel: 0, ttl: 3600, race: "resume" })
        assert.strictEqual(stored.status, 201)
        const c = scene.live()
        assert.strictEqual(c?.machine.phase._tag, "Moving")
        // The move completes; both months are drained: the message comes from January's table.
        yield* scene.advance(2_000)
        assert.strictEqual((yield* scene.raw.getUser(scene.uaid).pipe(Effect.orDie))?.currentMonth, "message_2026_02", "the user moved")
        assert.deepStrictEqual(scene.unacked(c!), [stored.version])
        // Not acked: the client leaves, and comes back.
        yield* scene.disconnect
        yield* scene.advance(2_000)
        const again = yield* scene.resume
        assert.deepStrictEqual(again!.of("notification").map((f) => f["version"]), [stored.version], "an accepted message delivered but not acked was lost")
        yield* scene.finish(false)
      })))

  it.effect("a message read from last month's table after the move, not acked: its node dying between the two steps of its move leaves it in a table, delivered", () =>
    example(Date.UTC(2026, 0, 31, 23, 59, 50), (scene) =>
      Effect.gen(function*() {
        yield* scene.disconnect
        yield* scene.advance(Date.UTC(2026, 1, 1, 0, 0, 2) - (yield* Clock.currentTimeMillis))
        // As above: stored in January's table as the client moves, read from there after the move.
        scene.world.faultsOn = true
        scene.world.failNext.set("getChannels", ["refused"])
        const stored = yield* scene.push({ channel: 0, ttl: 3600, race: "resume" })
        yield* scene.advance(2_000)
        const c = scene.live()!
        assert.deepStrictEqual(scene.unacked(c), [stored.version])
        // The client leaves; its node dies after the first write of the move (saved into February's
        // table, or taken out of January's, whichever comes first).
        const diedAfter = yield* scene.dieClosing(["saveMessages", "deleteMessage"])
        assert.isDefined(diedAfter)
        yield* scene.advance(2_000)
        const again = yield* scene.resume
        yield* scene.ackAll(again!)
        assert.deepStrictEqual(again!.acked, [stored.version], "an accepted message delivered but not acked was lost when its node died")
      })))

  it.effect("the newest message of a topic, delivered directly while an older one waits in storage, is not lost to the older one", () =>
    example(Date.UTC(2026, 2, 10, 12, 0, 0), (scene) =>
      Effect.gen(function*() {
        // A stored message the client has not acked holds the drain (the next read waits for its ack).
        yield* scene.disconnect
        const held = yield* scene.push({ channel: 1, ttl: 3600, topic: "x" })
        const c = yield* scene.resume
        assert.deepStrictEqual(scene.unacked(c!), [held.version])
        // Topic t: an older message is stored (the node refuses it), then a newer one goes directly.
        const older = yield* scene.push({ channel: 0, ttl: 3600, topic: "t", direct: false })
        const newer = yield* scene.push({ channel: 0, ttl: 3600, topic: "t" })
        assert.deepStrictEqual(scene.unacked(c!), [held.version, newer.version])
        // The held message is acked: the drain goes on and finds the older one in storage.
        yield* scene.ack(c!, [held.version!])
        yield* scene.settle
        yield* scene.note(`unacked now: ${scene.unacked(c!).map((v) => (v === older.version ? "older" : v === newer.version ? "newer" : v)).join(", ")}`)
        // The client leaves without acking; what it gets next must end with the newer message.
        yield* scene.disconnect
        const again = yield* scene.resume
        yield* scene.ackAll(again!)
        assert.include(again!.acked, newer.version, "the newest message of a topic was lost; the older one it replaced came back instead")
        yield* scene.finish(false)
      })))

  it.effect("a push stored in last month's table on a cached record, the read after the store failing, is delivered if it was accepted and never if it was refused", () =>
    example(Date.UTC(2026, 0, 31, 23, 59, 30), (scene) =>
      Effect.gen(function*() {
        // Offline on January's table; a push caches the record.
        yield* scene.disconnect
        const first = yield* scene.push({ channel: 0, ttl: 3600 })
        assert.strictEqual(first.status, 201)
        // Past midnight, within the cache's 60 s: the next push stores on the cached record, and
        // the read of the record after the store fails.
        yield* scene.advance(Date.UTC(2026, 1, 1, 0, 0, 5) - (yield* Clock.currentTimeMillis))
        scene.world.faultsOn = true
        scene.world.failNext.set("getUser", ["refused"])
        const second = yield* scene.push({ channel: 1, ttl: 3600 })
        scene.world.faultsOn = false
        const c = yield* scene.resume
        yield* scene.ackAll(c!)
        const accepted = [first, second].flatMap((p) => (p.version === undefined ? [] : [p.version]))
        assert.sameMembers(
          c!.of("notification").map((f) => String(f["version"])),
          accepted,
          `the client gets exactly the accepted pushes (the second was answered ${second.status})`
        )
        yield* scene.finish(false)
      })))
})
