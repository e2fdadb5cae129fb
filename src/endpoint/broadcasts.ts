/**
 * The broadcast admin API: the set every connection node serves when no megaphone server is
 * configured, kept in storage.
 *
 * - `GET /v1/broadcasts` → `{"broadcasts": {"<id>": "<version>", …}}`
 * - `PUT /v1/broadcasts/{id}` with `{"version": "<version>"}` → the set after the change
 * - `DELETE /v1/broadcasts/{id}` → the set after the change; 404 when there was no such broadcast
 *
 * Every call needs `Authorization: Bearer <token>` with one of `broadcast_admin_tokens` (compared in
 * constant time); with none configured the API does not exist (404). An id with one `/` may go as it
 * is (`/v1/broadcasts/remote-settings/monitor_changes`); any id may go percent-encoded. A storage
 * failure goes up as a `StorageError`, to the error edge (`edge.ts`).
 */
import { createHash, timingSafeEqual } from "node:crypto"
import * as ByteSize from "effect/ByteSize"
import * as Effect from "effect/Effect"
import * as Redacted from "effect/Redacted"
import * as HttpIncomingMessage from "effect/http/HttpIncomingMessage"
import type * as HttpServerRequest from "effect/http/HttpServerRequest"
import * as HttpServerResponse from "effect/http/HttpServerResponse"
import { isBroadcastId, isBroadcastVersion, MAX_BROADCASTS } from "../broadcast/validate.ts"
import { BroadcastNotFound, InvalidAuth, InvalidRequestBody, RouteNotFound } from "../domain/errors.ts"
import { Storage } from "../storage/Storage.ts"
import { bearerToken } from "../platform/raw-http.ts"

/** A PUT body is `{"version": "…"}`: this is plenty. */
const MAX_BODY = ByteSize.bytes(4_096)

const digest = (text: string): Buffer => createHash("sha256").update(text).digest()

export const makeBroadcastAdmin = Effect.fnUntraced(function*(tokens: ReadonlyArray<Redacted.Redacted<string>>) {
  const storage = yield* Storage
  const digests = tokens.map((token) => digest(Redacted.value(token)))

  /** Comparing digests keeps the time independent of where and whether a token differs. */
  const authorize = (request: HttpServerRequest.HttpServerRequest): Effect.Effect<void, RouteNotFound | InvalidAuth> => {
    if (digests.length === 0) return Effect.fail(new RouteNotFound())
    const offered = digest(bearerToken(request.headers["authorization"]) ?? "")
    let ok = false
    for (const known of digests) ok = timingSafeEqual(known, offered) || ok
    return ok ? Effect.void : Effect.fail(new InvalidAuth({ message: "Invalid broadcast admin token" }))
  }

  const idOf = (raw: string) => {
    let id: string
    try {
      id = decodeURIComponent(raw)
    } catch {
      id = ""
    }
    return isBroadcastId(id)
      ? Effect.succeed(id)
      : Effect.fail(new InvalidRequestBody({ message: "A broadcast id is 1 to 128 of A-Z a-z 0-9 _ - . / :" }))
  }

  const answer = Effect.map(storage.getBroadcasts, (set) =>
    HttpServerResponse.jsonUnsafe({ broadcasts: Object.fromEntries(set) }))

  const versionOf = (request: HttpServerRequest.HttpServerRequest) =>
    request.text.pipe(
      Effect.provideService(HttpIncomingMessage.MaxBodySize, MAX_BODY),
      Effect.mapError(() => new InvalidRequestBody({ message: "The request body could not be read" })),
      Effect.flatMap((text) => {
        let body: unknown
        try {
          body = JSON.parse(text)
        } catch {
          body = undefined
        }
        const version = (body as { readonly version?: unknown } | undefined)?.version
        return typeof version === "string" && isBroadcastVersion(version)
          ? Effect.succeed(version)
          : Effect.fail(new InvalidRequestBody({ message: "The body must be {\"version\": \"…\"}: 1 to 128 printable characters" }))
      })
    )

  return {
    list: (request: HttpServerRequest.HttpServerRequest) => Effect.andThen(authorize(request), answer),
    put: (request: HttpServerRequest.HttpServerRequest, rawId: string) =>
      Effect.gen(function*() {
        yield* authorize(request)
        const id = yield* idOf(rawId)
        const version = yield* versionOf(request)
        const set = yield* storage.getBroadcasts
        if (!set.has(id) && set.size >= MAX_BROADCASTS) {
          return yield* new InvalidRequestBody({ message: `At most ${MAX_BROADCASTS} broadcasts` })
        }
        yield* storage.putBroadcast(id, version)
        yield* Effect.logInfo("broadcast changed").pipe(Effect.annotateLogs({ broadcast: id, version }))
        return yield* answer
      }),
    remove: (request: HttpServerRequest.HttpServerRequest, rawId: string) =>
      Effect.gen(function*() {
        yield* authorize(request)
        const id = yield* idOf(rawId)
        if (!(yield* storage.deleteBroadcast(id))) return yield* new BroadcastNotFound()
        yield* Effect.logInfo("broadcast removed").pipe(Effect.annotateLogs({ broadcast: id }))
        return yield* answer
      })
  } as const
})
