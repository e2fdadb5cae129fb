/**
 * In-memory Storage: the DynamoDB layer's semantics without a server, for tests of the services
 * above storage. Tables must be created (`createTables`) before use, exactly as with DynamoDB; an
 * operation on a missing table fails with a `StorageError` whose cause is named
 * `ResourceNotFoundException`. Each operation runs without yielding, so conditional writes are
 * atomic as they are on the server.
 */
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import { type MessageKey, type Notification, sortkeyMs } from "../domain/notification.ts"
import type { MessageStatus, StatusUpdate } from "../domain/receipt.ts"
import type { UserRecord } from "../domain/user.ts"
import {
  expiryOf,
  isVisible,
  messageSortKey,
  nextFreeMs,
  type SaveOutcome,
  sortKeyMsOf,
  sortKeyOf,
  storedNotification,
  storedUser,
  TIMESTAMP_END,
  timestampLowerBound,
  TOPIC_END,
  TOPIC_PREFIX
} from "./model.ts"
import { Storage, StorageError, type UserPatch } from "./Storage.ts"
import {
  activeTableNames,
  isMessageTable,
  lastConnectKeys,
  messageTablesOf,
  receiptTableName,
  type StorageOptions,
  staleMonths,
  tablesByClock
} from "./tables.ts"

/** Per user and message table: the meta row (`" "`) and the message rows by sort key. */
interface UserRows {
  chids?: ReadonlySet<string>
  readonly messages: Map<string, Notification>
}

type MessageTable = Map<string, UserRows>

/** A receipt subscription's rows: its own (`expiry`, absent until it is created) and its messages'. */
interface ReceiptRows {
  expiry: number | undefined
  readonly statuses: Map<string, { readonly status: MessageStatus; readonly expiry: number | undefined }>
}

const STALE_BATCH = 25

const notFound = (operation: string, table: string) =>
  new StorageError({
    operation,
    cause: Object.assign(new Error(`Requested resource not found: ${table}`), { name: "ResourceNotFoundException" })
  })

export const layerMemory = (options: StorageOptions): Layer.Layer<Storage> =>
  Layer.sync(Storage, () => {
    let router: Map<string, UserRecord> | undefined
    const tables = new Map<string, MessageTable>()

    const routerTable = (operation: string) =>
      router === undefined ? Effect.fail(notFound(operation, options.routerTable)) : Effect.succeed(router)
    const messageTable = (operation: string, table: string) => {
      const t = tables.get(table)
      return t === undefined ? Effect.fail(notFound(operation, table)) : Effect.succeed(t)
    }
    const rowsOf = (t: MessageTable, uaid: string): UserRows => {
      let rows = t.get(uaid)
      if (rows === undefined) {
        rows = { messages: new Map() }
        t.set(uaid, rows)
      }
      return rows
    }
    /** Message rows of a user, in sort-key order, with `lo < key < hi`. */
    const range = (t: MessageTable, uaid: string, lo: string, hi: string) =>
      Array.from(t.get(uaid)?.messages ?? [])
        .filter(([key]) => key > lo && key < hi)
        .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))

    const getUser = Effect.fnUntraced(function*(uaid: string) {
      const users = yield* routerTable("getUser")
      const user = users.get(uaid)
      return user === undefined ? undefined : storedUser(user)
    })

    const registerUser = Effect.fnUntraced(function*(user: UserRecord) {
      const users = yield* routerTable("registerUser")
      const existing = users.get(user.uaid)
      if (existing !== undefined && existing.connectedAt >= user.connectedAt) return false
      users.set(user.uaid, storedUser(user))
      return true
    })

    const resumeUser = Effect.fnUntraced(function*(user: UserRecord) {
      const users = yield* routerTable("resumeUser")
      const existing = users.get(user.uaid)
      if (existing === undefined || existing.connectedAt >= user.connectedAt) return false
      users.set(user.uaid, storedUser(user))
      return true
    })

    const updateUser = Effect.fnUntraced(function*(uaid: string, patch: UserPatch) {
      const users = yield* routerTable("updateUser")
      const existing = users.get(uaid)
      if (existing === undefined) return false
      users.set(uaid, storedUser({ ...existing, ...patch, uaid }))
      return true
    })

    const deleteUserRows = (uaid: string, table: string | undefined) => {
      if (table !== undefined) tables.get(table)?.delete(uaid)
    }

    const dropUser = Effect.fnUntraced(function*(uaid: string, options?: { readonly ifConnectedAt?: number }) {
      const users = yield* routerTable("dropUser")
      const user = users.get(uaid)
      if (user === undefined) return false
      if (options?.ifConnectedAt !== undefined && user.connectedAt !== options.ifConnectedAt) return false
      users.delete(uaid)
      deleteUserRows(uaid, user.currentMonth)
      return true
    })

    const clearNodeId = Effect.fnUntraced(function*(uaid: string, nodeId: string, connectedAt: number) {
      const users = yield* routerTable("clearNodeId")
      const existing = users.get(uaid)
      if (existing === undefined || existing.nodeId !== nodeId || existing.connectedAt !== connectedAt) return false
      users.set(uaid, storedUser({ ...existing, nodeId: undefined }))
      return true
    })

    const broadcasts = new Map<string, string>()
    const getBroadcasts = Effect.suspend(() => Effect.map(routerTable("getBroadcasts"), () => new Map(broadcasts) as ReadonlyMap<string, string>))
    const putBroadcast = (id: string, version: string) =>
      Effect.map(routerTable("putBroadcast"), () => void broadcasts.set(id, version))
    const deleteBroadcast = (id: string) => Effect.map(routerTable("deleteBroadcast"), () => broadcasts.delete(id))

    const addChannels = Effect.fnUntraced(function*(uaid: string, table: string, channelIds: Iterable<string>) {
      const t = yield* messageTable("addChannels", table)
      const added = Array.from(channelIds)
      if (added.length === 0) return
      const rows = rowsOf(t, uaid)
      rows.chids = new Set([...(rows.chids ?? []), ...added])
    })

    const addChannel = Effect.fnUntraced(function*(uaid: string, table: string, channelId: string, maxChannels?: number) {
      const t = yield* messageTable("addChannel", table)
      const rows = rowsOf(t, uaid)
      const chids = rows.chids ?? new Set<string>()
      if (chids.has(channelId)) return true
      if (maxChannels !== undefined && chids.size >= maxChannels) return false
      rows.chids = new Set([...chids, channelId])
      return true
    })

    const hasChannel = Effect.fnUntraced(function*(uaid: string, table: string, channelId: string) {
      const t = yield* messageTable("hasChannel", table)
      return t.get(uaid)?.chids?.has(channelId) ?? false
    })

    const removeChannel = Effect.fnUntraced(function*(uaid: string, table: string, channelId: string) {
      const t = yield* messageTable("removeChannel", table)
      const rows = t.get(uaid)
      if (rows?.chids === undefined || !rows.chids.has(channelId)) return false
      const chids = new Set(rows.chids)
      chids.delete(channelId)
      if (chids.size === 0) delete rows.chids
      else rows.chids = chids
      return true
    })

    const getChannels = Effect.fnUntraced(function*(uaid: string, table: string) {
      const t = yield* messageTable("getChannels", table)
      return new Set(t.get(uaid)?.chids ?? []) as ReadonlySet<string>
    })

    /** Topic messages replace an older one; a timestamp message is written over nothing but its own row. */
    const put = (rows: UserRows, message: Notification): SaveOutcome => {
      const key = messageSortKey(message)
      const existing = rows.messages.get(key)
      if (existing !== undefined) {
        if (message.topic === undefined) {
          if (existing.version !== message.version) return "taken"
        } else if (sortkeyMs(existing) > sortkeyMs(message)) return "superseded"
      }
      rows.messages.set(key, storedNotification(message))
      return "stored"
    }

    const saveMessage = Effect.fnUntraced(function*(uaid: string, table: string, message: Notification) {
      const t = yield* messageTable("saveMessage", table)
      return put(rowsOf(t, uaid), message)
    })

    const saveMessages = Effect.fnUntraced(function*(uaid: string, table: string, messages: ReadonlyArray<Notification>) {
      const t = yield* messageTable("saveMessages", table)
      const rows = rowsOf(t, uaid)
      const saved: Array<Notification> = []
      for (const message of messages) {
        let placed = message
        let outcome = put(rows, placed)
        while (outcome === "taken") outcome = put(rows, placed = nextFreeMs(placed))
        if (outcome === "stored") saved.push(placed)
      }
      return saved
    })

    const fetchTopicMessages = Effect.fnUntraced(function*(uaid: string, table: string, limit: number) {
      const t = yield* messageTable("fetchTopicMessages", table)
      const now = yield* Clock.currentTimeMillis
      return range(t, uaid, TOPIC_PREFIX, TOPIC_END)
        .map(([, message]) => message)
        .filter((message) => isVisible(expiryOf(message), now))
        .slice(0, limit)
    })

    /** One page of message rows after `lo` up to the last timestamp row, `limit` rows at most. */
    const messagePage = Effect.fnUntraced(function*(operation: string, uaid: string, table: string, lo: string, limit: number) {
      const t = yield* messageTable(operation, table)
      const now = yield* Clock.currentTimeMillis
      const page = range(t, uaid, lo, TIMESTAMP_END).slice(0, limit)
      const last = page.at(-1)
      return {
        messages: page.map(([, message]) => message).filter((message) => isVisible(expiryOf(message), now)),
        lastSortKey: last === undefined ? undefined : sortKeyMsOf(last[0]),
        more: page.length === limit
      }
    })

    const fetchMessages = (uaid: string, table: string, limit: number) => messagePage("fetchMessages", uaid, table, TOPIC_PREFIX, limit)

    const fetchTimestampMessages = (uaid: string, table: string, after: number | undefined, limit: number) =>
      messagePage("fetchTimestampMessages", uaid, table, timestampLowerBound(after), limit)

    const deleteMessages = Effect.fnUntraced(function*(uaid: string, table: string, keys: ReadonlyArray<MessageKey>) {
      const rows = (yield* messageTable("deleteMessages", table)).get(uaid)
      for (const key of keys) rows?.messages.delete(sortKeyOf(key))
    })

    const deleteMessage = Effect.fnUntraced(function*(uaid: string, table: string, key: MessageKey, version?: string) {
      const t = yield* messageTable("deleteMessage", table)
      const rows = t.get(uaid)
      const sortKey = sortKeyOf(key)
      if (version !== undefined && rows?.messages.get(sortKey)?.version !== version) return false
      rows?.messages.delete(sortKey)
      return true
    })

    // ── receipts: per subscription, its expiry and its messages' status rows ─────────────────────
    let receipts: Map<string, ReceiptRows> | undefined
    const receiptTable = (operation: string) =>
      receipts === undefined ? Effect.fail(notFound(operation, receiptTableName(options))) : Effect.succeed(receipts)

    const createReceiptSubscription = Effect.fnUntraced(function*(id: string, expiry: number) {
      const table = yield* receiptTable("createReceiptSubscription")
      table.set(id, { expiry, statuses: table.get(id)?.statuses ?? new Map() })
    })

    const touchReceiptSubscription = Effect.fnUntraced(function*(id: string, expiry: number) {
      const rows = (yield* receiptTable("touchReceiptSubscription")).get(id)
      if (rows?.expiry === undefined || !isVisible(rows.expiry, yield* Clock.currentTimeMillis)) return false
      rows.expiry = expiry
      return true
    })

    /** A status write: `open` may make the row; otherwise the row must be there (as the DynamoDB condition). */
    const writeMessageStatus = (operation: string, open: boolean) =>
      Effect.fnUntraced(function*(subscription: string, messageId: string, update: StatusUpdate) {
        const table = yield* receiptTable(operation)
        const existing = table.get(subscription)?.statuses.get(messageId)
        if (existing === undefined && !open) return false
        let rows = table.get(subscription)
        if (rows === undefined) table.set(subscription, rows = { expiry: undefined, statuses: new Map() })
        const before = existing?.status ?? { messageId }
        if (update.outcome !== undefined && before.outcome !== undefined) return false
        const { outcome, expiry, ...times } = update
        const defined = Object.fromEntries(Object.entries(times).filter(([, v]) => v !== undefined))
        const status: MessageStatus = {
          ...before,
          ...defined,
          ...(outcome === undefined ? {} : {
            outcome: outcome.outcome,
            outcomeAt: outcome.at,
            ...(outcome.code === undefined ? {} : { code: outcome.code })
          })
        }
        rows.statuses.set(messageId, { status, expiry: expiry ?? existing?.expiry })
        return true
      })
    const openMessageStatus = writeMessageStatus("openMessageStatus", true)
    const updateMessageStatus = writeMessageStatus("updateMessageStatus", false)

    const getMessageStatus = Effect.fnUntraced(function*(subscription: string, messageId: string) {
      const row = (yield* receiptTable("getMessageStatus")).get(subscription)?.statuses.get(messageId)
      return row === undefined || !isVisible(row.expiry, yield* Clock.currentTimeMillis) ? undefined : row.status
    })

    const readReceiptSubscription = Effect.fnUntraced(function*(id: string) {
      const rows = (yield* receiptTable("readReceiptSubscription")).get(id)
      const now = yield* Clock.currentTimeMillis
      if (rows?.expiry === undefined || !isVisible(rows.expiry, now)) return undefined
      const statuses = Array.from(rows.statuses.values()).filter((row) => isVisible(row.expiry, now)).map((row) => row.status)
      return { expiry: rows.expiry, statuses }
    })

    const deleteMessageStatuses = Effect.fnUntraced(function*(subscription: string, messageIds: ReadonlyArray<string>) {
      const rows = (yield* receiptTable("deleteMessageStatuses")).get(subscription)
      for (const id of messageIds) rows?.statuses.delete(id)
    })

    const createTables = Effect.fnUntraced(function*(messageTables: ReadonlyArray<string>) {
      router ??= new Map()
      receipts ??= new Map()
      for (const table of messageTables) if (!tables.has(table)) tables.set(table, new Map())
    })

    const checkTables = Effect.gen(function*() {
      const active = activeTableNames(options, yield* Clock.currentTimeMillis)
      const status = (table: string, ok: boolean) => (ok ? { table, ok } : { table, ok, cause: "table not found" })
      return [
        status(options.routerTable, router !== undefined),
        status(receiptTableName(options), receipts !== undefined),
        ...active.map((t) => status(t, tables.has(t)))
      ]
    })

    const dropMessageTable = Effect.fnUntraced(function*(table: string) {
      if (!isMessageTable(options, table)) {
        return yield* new StorageError({ operation: "dropMessageTable", cause: `not a message table: ${table}` })
      }
      tables.delete(table)
    })

    const dropStaleUsers = Effect.fnUntraced(function*(args: {
      readonly monthsAgo: number
      readonly lookbackMonths: number
      readonly onProgress?: (dropped: number) => Effect.Effect<void>
      readonly dryRun?: boolean
    }) {
      const users = yield* routerTable("dropStaleUsers")
      const now = yield* Clock.currentTimeMillis
      const keys = new Set(staleMonths(now, args.monthsAgo, args.lookbackMonths).flatMap(lastConnectKeys))
      const stale = Array.from(users.values()).filter((u) => u.lastConnect !== undefined && keys.has(u.lastConnect))
      if (args.dryRun === true) return stale.length
      let dropped = 0
      for (let i = 0; i < stale.length; i += STALE_BATCH) {
        for (const user of stale.slice(i, i + STALE_BATCH)) {
          deleteUserRows(user.uaid, user.currentMonth)
          users.delete(user.uaid)
          dropped++
        }
        if (args.onProgress !== undefined) yield* args.onProgress(dropped)
      }
      return dropped
    })

    return Storage.of({
      getUser,
      registerUser,
      resumeUser,
      updateUser,
      dropUser,
      clearNodeId,
      getBroadcasts,
      putBroadcast,
      deleteBroadcast,
      ...tablesByClock(options),
      addChannel,
      addChannels,
      removeChannel,
      getChannels,
      hasChannel,
      saveMessage,
      saveMessages,
      fetchTopicMessages,
      fetchMessages,
      fetchTimestampMessages,
      deleteMessage,
      deleteMessages,
      createReceiptSubscription,
      touchReceiptSubscription,
      openMessageStatus,
      updateMessageStatus,
      getMessageStatus,
      readReceiptSubscription,
      deleteMessageStatuses,
      createTables,
      checkTables,
      listMessageTables: Effect.sync(() => messageTablesOf(options, tables.keys())),
      dropMessageTable,
      dropStaleUsers
    })
  })
