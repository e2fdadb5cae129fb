/**
 * The in-memory router table (`memory/rows.ts`): one record per user, keyed by uaid, and the
 * broadcast set, with the conditions of the DynamoDB layer's writes (a record is replaced only by
 * one with a later `connected_at`; `node_id` is cleared only for the session that set it).
 */
import * as Effect from "effect/Effect"
import type { UserRecord } from "../../domain/user.ts"
import { deleteUserRows, type MemoryStore, routerTable } from "./rows.ts"
import { storedUser } from "../model.ts"
import { clearNodeIdsEach, type UserPatch } from "../Storage.ts"

export const makeMemoryUsers = (store: MemoryStore) => {
  const getUser = Effect.fnUntraced(function*(uaid: string) {
    const users = yield* routerTable(store, "getUser")
    const user = users.get(uaid)
    return user === undefined ? undefined : storedUser(user)
  })

  const registerUser = Effect.fnUntraced(function*(user: UserRecord) {
    const users = yield* routerTable(store, "registerUser")
    const existing = users.get(user.uaid)
    if (existing !== undefined && existing.connectedAt >= user.connectedAt) return false
    users.set(user.uaid, storedUser(user))
    return true
  })

  const resumeUser = Effect.fnUntraced(function*(user: UserRecord) {
    const users = yield* routerTable(store, "resumeUser")
    const existing = users.get(user.uaid)
    if (existing === undefined || existing.connectedAt >= user.connectedAt) return false
    users.set(user.uaid, storedUser(user))
    return true
  })

  const updateUser = Effect.fnUntraced(function*(uaid: string, patch: UserPatch) {
    const users = yield* routerTable(store, "updateUser")
    const existing = users.get(uaid)
    if (existing === undefined) return false
    users.set(uaid, storedUser({ ...existing, ...patch, uaid }))
    return true
  })

  const dropUser = Effect.fnUntraced(function*(uaid: string, options?: { readonly ifConnectedAt?: number }) {
    const users = yield* routerTable(store, "dropUser")
    const user = users.get(uaid)
    if (user === undefined) return false
    if (options?.ifConnectedAt !== undefined && user.connectedAt !== options.ifConnectedAt) return false
    users.delete(uaid)
    deleteUserRows(store, uaid, user.currentMonth)
    return true
  })

  const clearNodeId = Effect.fnUntraced(function*(uaid: string, nodeId: string, connectedAt: number) {
    const users = yield* routerTable(store, "clearNodeId")
    const existing = users.get(uaid)
    if (existing === undefined || existing.nodeId !== nodeId || existing.connectedAt !== connectedAt) return false
    users.set(uaid, storedUser({ ...existing, nodeId: undefined }))
    return true
  })

  const { broadcasts } = store
  const getBroadcasts = Effect.suspend(() => Effect.map(routerTable(store, "getBroadcasts"), () => new Map(broadcasts) as ReadonlyMap<string, string>))
  const putBroadcast = (id: string, version: string) =>
    Effect.map(routerTable(store, "putBroadcast"), () => void broadcasts.set(id, version))
  const deleteBroadcast = (id: string) => Effect.map(routerTable(store, "deleteBroadcast"), () => broadcasts.delete(id))

  const clearNodeIds = clearNodeIdsEach(clearNodeId, 1)

  return { getUser, registerUser, resumeUser, updateUser, dropUser, clearNodeId, clearNodeIds, getBroadcasts, putBroadcast, deleteBroadcast }
}
