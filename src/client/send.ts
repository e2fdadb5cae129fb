/**
 * `push send`: send a push to a subscription with the `web-push` library. It builds the request
 * (encryption, VAPID, TTL, Topic, Urgency headers); we send it with `fetch`, which speaks plain HTTP
 * too (web-push's own sender only speaks HTTPS). With a receipt subscription, the push asks for a
 * receipt (`receipt.ts` waits for it).
 */
import * as Console from "effect/Console"
import * as Effect from "effect/Effect"
import webpush, { type PushSubscription, type RequestOptions, type VapidDetails } from "web-push"
import { receiptHeaders } from "../console/static/receipts.js"
import type { Urgency } from "../domain/notification.ts"
import { ToolFailure, UsageError } from "../tools/cli.ts"

export type Encoding = "aes128gcm" | "aesgcm"

interface SendOptions {
  readonly subscription: PushSubscription
  /** Nothing: a push without payload. */
  readonly payload?: string | undefined
  readonly encoding: Encoding
  readonly vapid?: VapidDetails | undefined
  readonly ttl: number
  readonly topic?: string | undefined
  readonly urgency?: Urgency | undefined
  /** A receipt subscription's URL: the push asks for a receipt there (`Push-Receipt`). */
  readonly receipt?: string | undefined
}

/**
 * The JSON of a subscription text. Lines of JSON, each a subscription, are what `listen > FILE` saves
 * when it had to subscribe again (the server forgot the first): the last line is the one in use.
 */
const subscriptionJson = (text: string): unknown => {
  try {
    return JSON.parse(text)
  } catch (error) {
    const lines = text.trim().split("\n")
    if (lines.length < 2) throw error
    return JSON.parse(lines[lines.length - 1]!)
  }
}

/** A subscription as `PushSubscription.toJSON()` gives it: `endpoint` and `keys.p256dh`/`keys.auth`. */
export const parseSubscription = (text: string, from: string): Effect.Effect<PushSubscription, UsageError> =>
  Effect.try({
    try: () => subscriptionJson(text),
    catch: () => new UsageError({ message: `the subscription (${from}) is not JSON` })
  }).pipe(Effect.flatMap((value) => {
    const s = value as { endpoint?: unknown; keys?: { p256dh?: unknown; auth?: unknown } } | null
    return typeof s?.endpoint === "string" && typeof s.keys?.p256dh === "string" && typeof s.keys.auth === "string"
      ? Effect.succeed({ endpoint: s.endpoint, keys: { p256dh: s.keys.p256dh, auth: s.keys.auth } })
      : Effect.fail(new UsageError({ message: `the subscription (${from}) needs "endpoint" and "keys": {"p256dh", "auth"}` }))
  }))

export interface SendResult {
  readonly status: number
  readonly statusText: string
  readonly location: string | null
  /** `Autopush-Warning`: what another push service would refuse of this push. */
  readonly warning: string | null
  readonly body: string
}

export const send = (options: SendOptions): Effect.Effect<SendResult, ToolFailure | UsageError> =>
  Effect.gen(function*() {
    const requestOptions: RequestOptions = {
      TTL: options.ttl,
      contentEncoding: options.encoding,
      ...(options.vapid === undefined ? {} : { vapidDetails: options.vapid }),
      ...(options.topic === undefined ? {} : { topic: options.topic }),
      ...(options.urgency === undefined ? {} : { urgency: options.urgency })
    }
    // web-push validates keys, VAPID details, topic and urgency here, and throws plain errors.
    const details = yield* Effect.try({
      try: () => webpush.generateRequestDetails(options.subscription, options.payload ?? null, requestOptions),
      catch: (error) => new UsageError({ message: error instanceof Error ? error.message : String(error) })
    })
    const headers = {
      ...Object.fromEntries(Object.entries(details.headers).map(([name, value]) => [name, String(value)])),
      ...(options.receipt === undefined ? {} : receiptHeaders(options.receipt))
    }
    return yield* Effect.tryPromise({
      try: async (signal) => {
        const res = await fetch(details.endpoint, { method: details.method, headers, signal, ...(details.body === null ? {} : { body: details.body }) })
        return { status: res.status, statusText: res.statusText, location: res.headers.get("location"), warning: res.headers.get("autopush-warning"), body: await res.text() }
      },
      catch: unreachable(details.endpoint)
    })
  })

const causeOf = (error: unknown): string => {
  const cause = (error as { cause?: { message?: unknown } } | undefined)?.cause?.message
  return typeof cause === "string" ? cause : error instanceof Error ? error.message : String(error)
}

/** A failed `fetch` to `url`: which service could not be reached, and why ("connect ECONNREFUSED …", not "fetch failed"). */
export const unreachable = (url: string) => (error: unknown): ToolFailure =>
  new ToolFailure({ message: `cannot reach ${new URL(url).origin}: ${causeOf(error)}` })

/** What an error's errno means for someone who just ran `send`, where the server's message is not enough. */
const ERRNO_HINTS: Readonly<Record<number, string>> = {
  117: "the service does not know the receipt subscription it made a moment ago (errno 117): it expired at once " +
    "(receipt_subscription_idle is very short) or the service's endpoint nodes do not share their storage"
}

const hintOf = (body: string): string | undefined => {
  try {
    return ERRNO_HINTS[(JSON.parse(body) as { readonly errno?: number }).errno ?? -1]
  } catch {
    return undefined
  }
}

/** Prints the answer (status, Location, and an error's JSON body); anything but 2xx fails. */
export const report = (result: SendResult): Effect.Effect<void, ToolFailure> =>
  Effect.gen(function*() {
    yield* Console.log(`${result.status} ${result.statusText}`)
    if (result.location !== null) yield* Console.log(`Location: ${result.location}`)
    if (result.warning !== null) yield* Console.error(`Autopush-Warning: ${result.warning}`)
    if (result.status >= 300) {
      if (result.body !== "") yield* Console.log(result.body)
      const hint = hintOf(result.body)
      return yield* new ToolFailure({ message: `the push was not accepted (${result.status})${hint === undefined ? "" : `: ${hint}`}` })
    }
  })

/** `vapid-keys`: a new VAPID key pair (P-256, base64url), as JSON that `send --vapid FILE` reads. */
export const vapidKeys = (subject: string): Effect.Effect<void> =>
  Effect.suspend(() => Console.log(JSON.stringify({ subject, ...webpush.generateVAPIDKeys() }, null, 2)))
