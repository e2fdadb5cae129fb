/**
 * Where a bridged user's channels live. Bridged clients never say hello, so nothing else moves them
 * to a new month's message table: whoever touches the user (a push, the registration API) moves its
 * channel set to the current table once the one it names is no longer served.
 */
import * as Effect from "effect/Effect"
import type { UserRecord } from "../domain/user.ts"
import { Storage, type StorageError } from "../storage/Storage.ts"

export const bridgedTableOf = (user: UserRecord): Effect.Effect<string, StorageError, Storage> =>
  Effect.gen(function*() {
    const storage = yield* Storage
    const active = yield* storage.activeMessageTables
    if (user.currentMonth !== undefined && active.includes(user.currentMonth)) return user.currentMonth
    const table = yield* storage.currentMessageTable
    const channels = user.currentMonth === undefined
      ? new Set<string>()
      // The old table may be gone already: then the channels went with it.
      : yield* storage.getChannels(user.uaid, user.currentMonth).pipe(Effect.orElseSucceed(() => new Set<string>()))
    yield* storage.addChannels(user.uaid, table, channels)
    yield* storage.updateUser(user.uaid, { currentMonth: table })
    return table
  })
