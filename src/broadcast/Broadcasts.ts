/**
 * The broadcast set a connection node serves (Firefox's Remote Settings and the like): read by
 * every session step, so `current()` is a plain read of the last good set. Where it comes from:
 *
 * - a megaphone server (`megaphone_api_url`): `GET` (with `Authorization: Bearer <token>` when a token is
 *   configured), answered
 *   `{"broadcasts": {"<id>": "<version>", …}}`;
 * - otherwise our own storage (one item of the router table, shared by every node), changed through
 *   the endpoint's admin API (`/v1/broadcasts`).
 *
 * Either is polled every `megaphone_poll_interval`. A failed poll (unreachable, slow, not 200, not
 * JSON, too big, invalid) keeps the last good set, is counted (`megaphone.updater.error{reason}`)
 * and logged once until the source works again; a good one is counted as `megaphone.updater.ok`.
 */
import * as Context from "effect/Context"
import * as Data from "effect/Data"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Redacted from "effect/Redacted"
import * as Schedule from "effect/Schedule"
import type { BroadcastSet } from "../protocol/phases.ts"
import { METRICS } from "../observability/catalog.ts"
import { Metrics } from "../observability/Metrics.ts"
import { Storage } from "../storage/Storage.ts"
import { decodeBroadcastSet } from "./validate.ts"

/** Why a poll brought no set: a bounded label (the metric's `reason`). */
class BroadcastSourceError extends Data.TaggedError("BroadcastSourceError")<{
  readonly reason: "unreachable" | "timeout" | "status" | "too_large" | "not_json" | "invalid" | "storage"
  readonly detail: string
}> {}

/** One read of a source. */
type BroadcastSource = Effect.Effect<BroadcastSet, BroadcastSourceError>

interface MegaphoneOptions {
  readonly url: string
  /** Sent as `Authorization: Bearer` when given (a public source such as Remote Settings needs none). */
  readonly token: Redacted.Redacted<string> | undefined
  /** A poll taking longer fails (`timeout`). */
  readonly timeoutMs: number
}

/** Largest megaphone answer read (bytes): a set of the maximum size fits many times over. */
const MEGAPHONE_MAX_BYTES = 1_048_576

/** Read at most `limit` bytes of a response body; undefined when there is more. */
const readCapped = async (response: Response, limit: number): Promise<string | undefined> => {
  const reader = response.body?.getReader()
  if (reader === undefined) return ""
  const chunks: Array<Uint8Array> = []
  let size = 0
  for (;;) {
    const { done, value } = await reader.read()
    if (done) break
    size += value.byteLength
    if (size > limit) {
      await reader.cancel()
      return undefined
    }
    chunks.push(value)
  }
  return Buffer.concat(chunks).toString("utf8")
}

export const megaphoneSource = (options: MegaphoneOptions): BroadcastSource =>
  Effect.tryPromise({
    try: async (signal) => {
      const response = await fetch(options.url, {
        headers: options.token === undefined
          ? { accept: "application/json" }
          : { authorization: `Bearer ${Redacted.value(options.token)}`, accept: "application/json" },
        signal: AbortSignal.any([signal, AbortSignal.timeout(options.timeoutMs)])
      })
      if (response.status !== 200) {
        await response.body?.cancel()
        throw new BroadcastSourceError({ reason: "status", detail: `HTTP ${response.status}` })
      }
      const text = await readCapped(response, MEGAPHONE_MAX_BYTES)
      if (text === undefined) throw new BroadcastSourceError({ reason: "too_large", detail: `more than ${MEGAPHONE_MAX_BYTES} bytes` })
      let body: unknown
      try {
        body = JSON.parse(text)
      } catch {
        throw new BroadcastSourceError({ reason: "not_json", detail: "the answer is not JSON" })
      }
      const set = decodeBroadcastSet((body as { readonly broadcasts?: unknown } | null)?.broadcasts)
      if (typeof set === "string") throw new BroadcastSourceError({ reason: "invalid", detail: set })
      return set
    },
    catch: (cause) =>
      cause instanceof BroadcastSourceError ? cause
      : cause instanceof Error && (cause.name === "TimeoutError" || cause.name === "AbortError")
      ? new BroadcastSourceError({ reason: "timeout", detail: `no answer within ${options.timeoutMs} ms` })
      : new BroadcastSourceError({ reason: "unreachable", detail: String((cause as { readonly cause?: unknown })?.cause ?? cause) })
  })

export const storageSource: Effect.Effect<BroadcastSource, never, Storage> = Effect.map(Effect.service(Storage), (storage) =>
  storage.getBroadcasts.pipe(
    Effect.mapError((error) => new BroadcastSourceError({ reason: "storage", detail: error.operation }))
  ))

export class Broadcasts extends Context.Service<Broadcasts, {
  /** The set in force now (the last good one). */
  readonly current: () => BroadcastSet
}>()("autopush/broadcast/Broadcasts") {
  /** A fixed set (tests, and nodes without broadcasts). */
  static readonly layerStatic = (set: BroadcastSet = new Map()): Layer.Layer<Broadcasts> =>
    Layer.succeed(Broadcasts, Broadcasts.of({ current: () => set }))

  /** Read `source` at start and every `intervalMs`; the polling fiber lives as long as the layer. */
  static readonly layerPolling = (
    source: BroadcastSource,
    intervalMs: number,
    label: string
  ): Layer.Layer<Broadcasts, never, Metrics> =>
    Layer.effect(
      Broadcasts,
      Effect.gen(function*() {
        const metrics = yield* Metrics
        const ok = metrics.counter(METRICS.megaphoneOk.name)
        let current: BroadcastSet = new Map()
        let failing: string | undefined
        const poll = source.pipe(
          Effect.tap((set) =>
            Effect.suspend(() => {
              current = set
              ok.inc()
              if (failing === undefined) return Effect.void
              failing = undefined
              return Effect.logInfo("broadcast source answers again").pipe(Effect.annotateLogs({ source: label, broadcasts: set.size }))
            })),
          Effect.catch((error: BroadcastSourceError) =>
            Effect.suspend(() => {
              metrics.counter(METRICS.megaphoneError.name, { reason: error.reason }).inc()
              if (failing === error.reason) return Effect.void
              failing = error.reason
              return Effect.logWarning("broadcast source failed; the last good set stays in force").pipe(
                Effect.annotateLogs({ source: label, reason: error.reason, detail: error.detail, broadcasts: current.size })
              )
            })),
          Effect.asVoid
        )
        yield* poll
        yield* Effect.forkScoped(Effect.repeat(poll, Schedule.spaced(intervalMs)))
        return Broadcasts.of({ current: () => current })
      })
    )
}
