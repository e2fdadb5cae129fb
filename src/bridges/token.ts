/**
 * An access token (OAuth2 for FCM and ADM, the provider JWT for APNs), fetched when first needed,
 * kept until `renewBeforeMs` before it expires, and dropped on demand (a platform said 401: fetch a
 * new one once). Concurrent requests that find no token share one fetch.
 */
import * as Clock from "effect/Clock"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"

interface Token {
  readonly value: string
  /** Milliseconds since the epoch. */
  readonly expiresAt: number
}

export interface TokenCache<E> {
  readonly get: Effect.Effect<string, E>
  /** Forget the current token (the next `get` fetches), unless it was already replaced. */
  readonly invalidate: (value: string) => void
}

export const makeTokenCache = <E>(fetch: Effect.Effect<Token, E>, renewBeforeMs: number): TokenCache<E> => {
  let current: Token | undefined
  let pending: Deferred.Deferred<Token, E> | undefined
  const refresh = Effect.suspend(() => {
    if (pending !== undefined) return Deferred.await(pending)
    const deferred = Deferred.makeUnsafe<Token, E>()
    pending = deferred
    return fetch.pipe(
      Effect.onExit((exit) =>
        Effect.sync(() => {
          pending = undefined
          if (Exit.isSuccess(exit)) current = exit.value
        }).pipe(Effect.andThen(Deferred.done(deferred, exit)))
      )
    )
  })
  return {
    get: Effect.flatMap(Clock.currentTimeMillis, (now) =>
      current !== undefined && now < current.expiresAt - renewBeforeMs
        ? Effect.succeed(current.value)
        : Effect.map(refresh, (token) => token.value)),
    invalidate: (value) => {
      if (current?.value === value) current = undefined
    }
  }
}
