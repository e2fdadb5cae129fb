/**
 * `push listen`: a push client on the command line. It connects to a connection node, says hello,
 * registers one channel (with a VAPID key when given: a v2 endpoint), makes its own keys and prints
 * the subscription JSON a sender needs; then reports every push (decrypted, or plaintext from a push
 * gateway) and acks it.
 *
 * With `--state FILE` the uaid, channel, keys and VAPID key are kept, so the subscription stays
 * valid across runs and pushes sent meanwhile (stored by the service) arrive on the next start.
 */
import { randomUUID } from "node:crypto"
import { readFile } from "node:fs/promises"
import * as Console from "effect/Console"
import * as Effect from "effect/Effect"
import { ToolFailure, UsageError } from "../tools/cli.ts"
import { decryptPush, makeKeys, type PushHeaders, type SubscriberKeys } from "./keys.ts"
import { type Frame, openPushSocket, type PushSocket } from "./socket.ts"
import type { Urgency } from "../domain/notification.ts"
import { writePrivateFile } from "../platform/privateFile.ts"

interface ListenOptions {
  /** The connection node's WebSocket URL, e.g. `ws://localhost:8080/`. */
  readonly server: string
  /** The application server's VAPID public key (base64url): the endpoint then only accepts pushes signed with it. */
  readonly vapidKey?: string | undefined
  /** The VAPID key file it came from, if it did (the `send` hint names it). */
  readonly vapidFile?: string | undefined
  /**
   * Where to keep the subscription between runs. The subscription kept there is used again, with the
   * VAPID key it was made with: a different `vapidKey` is refused, never a reason to replace it.
   */
  readonly stateFile?: string | undefined
  /** Stop after this many pushes (default: run until interrupted). */
  readonly count?: number | undefined
  /** Ask the server for pushes at least this urgent only (RFC 8030 §5.3); the others wait in storage. */
  readonly minUrgency?: Urgency | undefined
}

/** What `--state` keeps. */
interface State {
  readonly uaid: string
  readonly channelID: string
  readonly endpoint: string
  readonly vapidKey: string | null
  readonly keys: SubscriberKeys
}

interface Subscription {
  readonly endpoint: string
  readonly keys: { readonly p256dh: string; readonly auth: string }
}

const subscriptionOf = (state: State): Subscription => ({ endpoint: state.endpoint, keys: { p256dh: state.keys.p256dh, auth: state.keys.auth } })

const readState = (path: string | undefined): Effect.Effect<State | undefined, ToolFailure> =>
  path === undefined ? Effect.succeed(undefined) : Effect.tryPromise({
    try: () =>
      readFile(path, "utf8").then(
        (text) => JSON.parse(text) as State,
        (error: NodeJS.ErrnoException) => (error.code === "ENOENT" ? undefined : Promise.reject(error))
      ),
    catch: (cause) => new ToolFailure({ message: `cannot read the state file ${path}: ${String(cause)}` })
  })

const writeState = (path: string | undefined, state: State): Effect.Effect<void, ToolFailure> =>
  path === undefined ? Effect.void : Effect.tryPromise({
    // The private key is in it: readable by its owner only, never written through a planted link.
    try: () => writePrivateFile(path, JSON.stringify(state, null, 2) + "\n"),
    catch: (cause) => new ToolFailure({ message: `cannot write the state file ${path}: ${String(cause)}` })
  })

/**
 * The VAPID key to subscribe with: the one given, else the saved subscription's. A saved subscription
 * made with another key (or without one) is not replaced: that would lose its keys, and with them
 * the pushes the service keeps for it.
 */
const vapidKeyFor = (options: ListenOptions, saved: State | undefined): Effect.Effect<string | null, UsageError> => {
  if (saved === undefined) return Effect.succeed(options.vapidKey ?? null)
  if (options.vapidKey === undefined || options.vapidKey === saved.vapidKey) return Effect.succeed(saved.vapidKey)
  const made = saved.vapidKey === null ? "without a VAPID key" : `with another VAPID key (${saved.vapidKey.slice(0, 12)}…)`
  return Effect.fail(
    new UsageError({
      message: `the state file ${options.stateFile} keeps a subscription made ${made}; --vapid-key would replace it, losing its keys ` +
        `and the pushes stored for it. Run without --vapid-key to use that subscription, or give another --state file for a new one`
    })
  )
}

/** Hello (as the saved uaid when there is one), then the saved subscription or a new registration. */
const subscribe = (socket: PushSocket, options: ListenOptions, saved: State | undefined, vapidKey: string | null) =>
  Effect.gen(function*() {
    yield* socket.send(
      saved === undefined
        ? { messageType: "hello", use_webpush: true }
        : { messageType: "hello", use_webpush: true, uaid: saved.uaid, channelIDs: [saved.channelID] }
    )
    const hello = yield* socket.expect("hello")
    if (hello["status"] !== 200 || typeof hello["uaid"] !== "string") {
      return yield* new ToolFailure({ message: `the server refused hello: ${JSON.stringify(hello)}` })
    }
    const uaid = hello["uaid"]
    if (saved !== undefined && saved.uaid === uaid && saved.vapidKey === vapidKey) return { state: saved, fresh: false }
    const channelID = randomUUID()
    yield* socket.send(vapidKey === null ? { messageType: "register", channelID } : { messageType: "register", channelID, key: vapidKey })
    const registered = yield* socket.expect("register")
    if (registered["status"] !== 200 || typeof registered["pushEndpoint"] !== "string") {
      return yield* new ToolFailure({ message: `the server refused to register: ${JSON.stringify(registered)}` })
    }
    const state: State = { uaid, channelID, endpoint: registered["pushEndpoint"], vapidKey, keys: makeKeys() }
    yield* writeState(options.stateFile, state)
    return { state, fresh: true }
  })

/**
 * What a notification frame holds: nothing (a push without payload), a text decrypted with our keys,
 * a plaintext (`data` without an encoding: what a push gateway such as this server's Matrix gateway
 * sends, unencrypted by design), or a payload our keys do not open.
 */
export type OpenedPush =
  | { readonly kind: "empty" }
  | { readonly kind: "decrypted"; readonly encoding: string; readonly text: string }
  | { readonly kind: "plaintext"; readonly text: string }
  | { readonly kind: "undecryptable"; readonly encoding: string; readonly error: string }

export const openPush = (keys: SubscriberKeys, frame: Frame): OpenedPush => {
  const data = frame["data"]
  if (typeof data !== "string" || data === "") return { kind: "empty" }
  const headers = (frame["headers"] ?? {}) as PushHeaders
  if (headers.encoding === undefined) return { kind: "plaintext", text: Buffer.from(data, "base64url").toString("utf8") }
  try {
    return { kind: "decrypted", encoding: headers.encoding, text: decryptPush(keys, data, headers).toString("utf8") }
  } catch (error) {
    return { kind: "undecryptable", encoding: headers.encoding, error: error instanceof Error ? error.message : String(error) }
  }
}

/** The ack code for a push: 100 delivered; 101 could not be decrypted (the service deletes it either way). */
export const ackCodeOf = (opened: OpenedPush): 100 | 101 => (opened.kind === "undecryptable" ? 101 : 100)

/** The line that reports a push, with its text: for people, on stderr. */
export const pushReport = (opened: OpenedPush): string => {
  const acked = `acked ${ackCodeOf(opened)}`
  switch (opened.kind) {
    case "empty":
      return `push received (no payload), ${acked}`
    case "decrypted":
      return `push received (${opened.encoding}, ${opened.text.length} chars), ${acked}: ${opened.text}`
    case "plaintext":
      return `push received (plaintext, ${opened.text.length} chars: not encrypted, as a push gateway such as Matrix's sends it), ${acked}: ${opened.text}`
    case "undecryptable":
      return `push received (${opened.encoding}) but not decrypted: ${opened.error}; ${acked}`
  }
}

/** The shell-quoted form of a string (POSIX single quotes). */
const shellQuote = (text: string): string => `'${text.replaceAll("'", `'\\''`)}'`

/** The first pause before connecting again after the connection was lost, and the longest. */
const FIRST_RECONNECT_MS = 1_000
const MAX_RECONNECT_MS = 60_000

/**
 * The pause before connection attempt `failures` + 1 since the last good one: 1 s, 2 s, 4 s … up to
 * 60 s, of which the second half is random (`random` in [0, 1)), so that listeners cut off together
 * (a server restart) do not all come back at the same moment.
 */
export const reconnectDelayMs = (failures: number, random: number): number => {
  const ceiling = Math.min(MAX_RECONNECT_MS, FIRST_RECONNECT_MS * 2 ** Math.min(failures, 16))
  return Math.round(ceiling / 2 + random * ceiling / 2)
}

/**
 * Stdout: the subscription JSON on one line, and nothing else, so that `listen > FILE` makes FILE a
 * subscription `send --subscription FILE` takes; a new subscription (the server forgot this one) on
 * a line of its own again (`send` reads a file's last line). Stderr: what happens, for people, with
 * each push's report and text (`pushReport`). Once subscribed, a lost connection (a server restart) is
 * connected again with the same uaid and keys, so the subscription stays valid: after 1 s, then
 * after twice as long each time it fails again, up to 60 s (`reconnectDelayMs`); a connection that
 * gets as far as its subscription starts the count over.
 */
export const listen = (options: ListenOptions): Effect.Effect<void, ToolFailure | UsageError> =>
  Effect.gen(function*() {
    const saved = yield* readState(options.stateFile)
    const vapidKey = yield* vapidKeyFor(options, saved)
    const progress: { state: State | undefined; printed: string | undefined; received: number; failures: number } = {
      state: saved,
      printed: undefined,
      received: 0,
      failures: 0
    }
    const session = Effect.scoped(Effect.gen(function*() {
      const socket = yield* openPushSocket(options.server)
      const { state, fresh } = yield* subscribe(socket, options, progress.state, vapidKey)
      progress.state = state
      progress.failures = 0
      const subscription = JSON.stringify(subscriptionOf(state))
      if (subscription !== progress.printed) {
        yield* Console.error(
          [
            `${fresh ? "subscribed" : "subscription restored"}${options.stateFile === undefined ? "" : ` (kept in ${options.stateFile})`}; waiting for pushes. Send one with:`,
            `  npm run push -- send --subscription ${shellQuote(subscription)}${state.vapidKey === null ? "" : ` --vapid ${options.vapidFile === undefined ? "<your VAPID key file>" : shellQuote(options.vapidFile)}`} "hello"`
          ].join("\n")
        )
        yield* Console.log(subscription)
        progress.printed = subscription
      } else {
        yield* Console.error("connected again; waiting for pushes")
      }
      // Answered in the stream below (stored pushes may come first, and must not be skipped).
      if (options.minUrgency !== undefined) yield* socket.send({ messageType: "urgency", min: options.minUrgency })
      while (options.count === undefined || progress.received < options.count) {
        const frame = yield* socket.next
        if (frame["messageType"] === "urgency") {
          if (frame["status"] !== 200) return yield* new ToolFailure({ message: `the server refused the minimum urgency: ${JSON.stringify(frame)}` })
          yield* Console.error(`only pushes at least as urgent as ${options.minUrgency} come now; the others wait on the server`)
          continue
        }
        if (frame["messageType"] !== "notification" || typeof frame["version"] !== "string") continue
        const opened = openPush(state.keys, frame)
        yield* Console.error(pushReport(opened))
        yield* socket.send({ messageType: "ack", updates: [{ channelID: frame["channelID"], version: frame["version"], code: ackCodeOf(opened) }] })
        progress.received++
      }
    }))
    const run: Effect.Effect<void, ToolFailure> = session.pipe(
      Effect.catchTag("ConnectionLost", (lost) =>
        progress.printed === undefined
          ? Effect.fail(new ToolFailure({ message: lost.message }))
          : Effect.suspend(() => {
            const delayMs = reconnectDelayMs(progress.failures++, Math.random())
            return Console.error(`${lost.message}; connecting again in ${(delayMs / 1000).toFixed(1)} s`).pipe(
              Effect.andThen(Effect.sleep(delayMs)),
              Effect.andThen(Effect.suspend(() => run))
            )
          }))
    )
    yield* run
  })
