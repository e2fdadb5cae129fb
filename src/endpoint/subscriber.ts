/**
 * Who a push goes to: rules #7–#9 of a push (the user, its destination, the channel), read from
 * storage or from the router cache (`routerCache.ts`). The validation step (`acceptPush.ts`) asks
 * first; the delivery step (`deliverPush.ts`) asks again on a fresh read when a cached record did
 * not do, and forgets users it can never deliver to.
 *
 * A storage failure is not answered here: it goes up as a `StorageError`, to the error edge.
 */
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import { Bridges } from "../bridges/Bridges.ts"
import type { BridgeRouter } from "../bridges/bridge.ts"
import { bridgedTableOf } from "../bridges/table.ts"
import { BridgeNotConfigured, NoSubscription } from "../domain/errors.ts"
import type { UserRecord } from "../domain/user.ts"
import { Storage, type StorageError } from "../storage/Storage.ts"
import type { EndpointOptions } from "./options.ts"
import { RouterCache } from "./routerCache.ts"

/** Router types that reach users through a bridge (FCM, APNs, ADM, the test stub). */
const BRIDGE_TYPES: ReadonlySet<string> = new Set(["fcm", "apns", "adm", "stub"])

const NO_SUBSCRIPTION = "No such subscription"

/** Where a push goes: the user's router record, its message table, and its bridge if it is bridged. */
export interface Target {
  readonly user: UserRecord
  readonly table: string
  readonly bridge: BridgeRouter | undefined
  /** The record came from the router cache: good for a direct delivery or a store only. */
  readonly cached: boolean
}

export type Subscribers = Effect.Success<ReturnType<typeof makeSubscribers>>

export const makeSubscribers = Effect.fnUntraced(function*(options: EndpointOptions) {
  const storage = yield* Storage
  const bridges = yield* Bridges
  const cache = new RouterCache(options.routerCache ?? { ttlMs: 0, entries: 0 })

  /** #7 */
  const userOf = (uaid: string) =>
    Effect.flatMap(storage.getUser(uaid), (user) =>
      user === undefined ? Effect.fail(new NoSubscription({ message: NO_SUBSCRIPTION })) : Effect.succeed(user))

  /**
   * Forget a user we can never deliver to, then say so (410/106). A failure to forget is only
   * logged: the answer is the same, and the next push tries again.
   */
  const dropUser = (uaid: string, message: string) =>
    storage.dropUser(uaid).pipe(
      Effect.catchTag("StorageError", (error) => Effect.logWarning("dropping a user failed", error)),
      Effect.andThen(Effect.fail(new NoSubscription({ message })))
    )

  /**
   * #8: a WebPush user whose message table is still served (a stale `current_month`: the user is dropped),
   * or a bridged user of a bridge this node has (its channels moved to the current table if need be).
   */
  const destinationOf = Effect.fnUntraced(function*(user: UserRecord) {
    if (user.routerType === "gcm") return yield* dropUser(user.uaid, "Bridge reports user was not found")
    if (BRIDGE_TYPES.has(user.routerType)) {
      const bridge = bridges.get(user.routerType)
      if (bridge === undefined) return yield* new BridgeNotConfigured({ message: `No ${user.routerType} router is configured` })
      const table = yield* bridgedTableOf(user).pipe(Effect.provideService(Storage, storage))
      return { table, bridge }
    }
    if (user.routerType !== "webpush") return yield* dropUser(user.uaid, NO_SUBSCRIPTION)
    const table = user.currentMonth
    if (table === undefined || !(yield* storage.activeMessageTables).includes(table)) {
      return yield* dropUser(user.uaid, NO_SUBSCRIPTION)
    }
    return { table, bridge: undefined }
  })

  /** #9 */
  const hasChannel = (uaid: string, table: string, channelId: string): Effect.Effect<boolean, StorageError> =>
    storage.hasChannel(uaid, table, channelId)

  /** #7–#9 on a fresh read of the router record (kept in the cache). */
  const subscriberOf = Effect.fnUntraced(function*(uaid: string, channelId: string) {
    cache.forget(uaid)
    const user = yield* userOf(uaid) //                                  #7
    const { table, bridge } = yield* destinationOf(user) //              #8
    if (!(yield* hasChannel(uaid, table, channelId))) return yield* new NoSubscription({ message: NO_SUBSCRIPTION })
    cache.remember(user, channelId, yield* Clock.currentTimeMillis)
    return { user, table, bridge, cached: false } satisfies Target
  })

  /**
   * #7–#9 from the cache when it has a record whose table is still served, and holds the channel
   * (known, or read now); anything else is decided on a fresh read. A cached answer is only used
   * for a direct delivery, which the node checks, or to store for a client that was offline, which
   * the re-read after the store checks (`routerCache.ts`). Asked on every push, at `nowMs`.
   */
  const targetOf = (uaid: string, channelId: string, nowMs: number) => {
    const hit = cache.get(uaid, nowMs)
    const table = hit?.user.currentMonth
    if (hit === undefined || table === undefined) return subscriberOf(uaid, channelId)
    const cached = (): Target => {
      hit.channels.add(channelId)
      return { user: hit.user, table, bridge: undefined, cached: true }
    }
    return Effect.flatMap(storage.activeMessageTables, (tables) =>
      !tables.includes(table) ? subscriberOf(uaid, channelId)
      : hit.channels.has(channelId) ? Effect.succeed(cached())
      : Effect.flatMap(hasChannel(uaid, table, channelId), (has) => has ? Effect.succeed(cached()) : subscriberOf(uaid, channelId)))
  }

  return { targetOf, subscriberOf, dropUser, cache } as const
})
