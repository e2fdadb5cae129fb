/**
 * A user's channel set in an in-memory message table (`memory/rows.ts`), one set per user and
 * month's table, bounded by `maxChannels` as the DynamoDB layer bounds its `channel_count`.
 */
import * as Effect from "effect/Effect"
import { type MemoryStore, messageTable, rowsOf } from "./rows.ts"

export const makeMemoryChannels = (store: MemoryStore) => {
  const addChannels = Effect.fnUntraced(function*(uaid: string, table: string, channelIds: Iterable<string>) {
    const t = yield* messageTable(store, "addChannels", table)
    const added = Array.from(channelIds)
    if (added.length === 0) return
    const rows = rowsOf(t, uaid)
    rows.chids = new Set([...(rows.chids ?? []), ...added])
  })

  const addChannel = Effect.fnUntraced(function*(uaid: string, table: string, channelId: string, maxChannels?: number) {
    const t = yield* messageTable(store, "addChannel", table)
    const rows = rowsOf(t, uaid)
    const chids = rows.chids ?? new Set<string>()
    if (chids.has(channelId)) return true
    if (maxChannels !== undefined && chids.size >= maxChannels) return false
    rows.chids = new Set([...chids, channelId])
    return true
  })

  const hasChannel = Effect.fnUntraced(function*(uaid: string, table: string, channelId: string) {
    const t = yield* messageTable(store, "hasChannel", table)
    return t.get(uaid)?.chids?.has(channelId) ?? false
  })

  const removeChannel = Effect.fnUntraced(function*(uaid: string, table: string, channelId: string) {
    const t = yield* messageTable(store, "removeChannel", table)
    const rows = t.get(uaid)
    if (rows?.chids === undefined || !rows.chids.has(channelId)) return false
    const chids = new Set(rows.chids)
    chids.delete(channelId)
    if (chids.size === 0) delete rows.chids
    else rows.chids = chids
    return true
  })

  const getChannels = Effect.fnUntraced(function*(uaid: string, table: string) {
    const t = yield* messageTable(store, "getChannels", table)
    return new Set(t.get(uaid)?.chids ?? []) as ReadonlySet<string>
  })

  return { addChannel, addChannels, removeChannel, getChannels, hasChannel }
}
