/**
 * Table naming and the month arithmetic of message-table rotation (pure functions; all dates
 * are UTC).
 *
 * - With rotation, message tables are `{prefix}_{YYYY}_{MM}`; the *current* table is this month's;
 *   the *active* tables are last month's, this month's and next month's — the ones a user's
 *   `current_month` may name and still be served — and, on a month's last day, the month after
 *   next too: every node keeps the active tables present, so the tables a month turn makes active
 *   exist the day before it.
 * - With `noTableRotation`, there is exactly one message table and it is named exactly `{prefix}`.
 *   (Mozilla's first autopush picked "the lexically latest table with the prefix"; a fixed name is
 *   deterministic, needs no listing at start-up, and an operator migrating such a single-table
 *   deployment sets the prefix to that table's full name.)
 */
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import { Invalid, StorageError } from "./failures.ts"

export interface StorageOptions {
  /** Name of the router table (default `router`): one row per user, keyed by uaid, holding its router record. */
  readonly routerTable: string
  /** Message tables are `{prefix}_{YYYY}_{MM}`, or exactly `{prefix}` without rotation. */
  readonly messageTablePrefix: string
  readonly noTableRotation: boolean
}

const DAY_MS = 86_400_000

/** The table of push receipts: receipt subscriptions and the status rows of their messages. */
export const receiptTableName = (options: StorageOptions): string => `${options.routerTable}_receipts`

/** Months since year 0 of a UTC instant: `year * 12 + month0`. */
export const monthIndex = (ms: number): number => {
  const d = new Date(ms)
  return d.getUTCFullYear() * 12 + d.getUTCMonth()
}

const pad2 = (n: number): string => String(n).padStart(2, "0")

const tableForIndex = (prefix: string, index: number): string =>
  `${prefix}_${Math.floor(index / 12)}_${pad2((index % 12) + 1)}`

/** `{prefix}_{YYYY}_{MM}` for the UTC month of `ms`. */
export const monthTableName = (prefix: string, ms: number): string => tableForIndex(prefix, monthIndex(ms))

/** The table new and migrated users go to at `nowMs`. */
export const currentTableName = (options: StorageOptions, nowMs: number): string =>
  options.noTableRotation ? options.messageTablePrefix : monthTableName(options.messageTablePrefix, nowMs)

/** Last month, this month and next month, and the month after on a month's last day; oldest first. */
export const activeTableNames = (options: StorageOptions, nowMs: number): ReadonlyArray<string> => {
  if (options.noTableRotation) return [options.messageTablePrefix]
  const now = monthIndex(nowMs)
  const indexes = monthIndex(nowMs + DAY_MS) !== now ? [now - 1, now, now + 1, now + 2] : [now - 1, now, now + 1]
  return indexes.map((i) => tableForIndex(options.messageTablePrefix, i))
}

/** Whether `name` is one of our message tables: `{prefix}_{YYYY}_{MM}`, or `{prefix}` itself. */
export const isMessageTable = (options: StorageOptions, name: string): boolean => {
  if (name === options.messageTablePrefix) return true
  if (!name.startsWith(`${options.messageTablePrefix}_`)) return false
  return /^\d{4}_(0[1-9]|1[0-2])$/.test(name.slice(options.messageTablePrefix.length + 1))
}

/** What `dropMessageTable` does first: any table but one of our message tables is refused. */
export const onlyMessageTable = (options: StorageOptions, table: string): Effect.Effect<void, StorageError> =>
  isMessageTable(options, table) ? Effect.void : Effect.fail(new StorageError({ operation: "dropMessageTable", reason: new Invalid(), cause: `not a message table: ${table}` }))

/**
 * Our message tables among `names`, oldest first (`{YYYY}_{MM}` sorts chronologically; the bare
 * `{prefix}` table, if any, sorts first).
 */
export const messageTablesOf = (options: StorageOptions, names: Iterable<string>): ReadonlyArray<string> =>
  Array.from(names).filter((name) => isMessageTable(options, name)).sort()

/**
 * The `last_connect` months a stale-user sweep covers: `YYYYMM` of the month `monthsAgo` months
 * before `nowMs` and of the `lookbackMonths` months before that (so `lookbackMonths + 1` months,
 * newest first).
 */
export const staleMonths = (nowMs: number, monthsAgo: number, lookbackMonths: number): ReadonlyArray<number> => {
  const first = monthIndex(nowMs) - monthsAgo
  return Array.from({ length: lookbackMonths + 1 }, (_, i) => {
    const index = first - i
    return Math.floor(index / 12) * 100 + (index % 12) + 1
  })
}

/** Highest random spread `lastConnectValue` uses (0-10, as autopush writes it). */
const LAST_CONNECT_SPREAD_MAX = 10

/** Every `last_connect` index key of a `YYYYMM` month: hours 00-23 × spread 0000-0010. */
export const lastConnectKeys = (yyyymm: number): ReadonlyArray<number> => {
  const keys: Array<number> = []
  for (let hour = 0; hour < 24; hour++) {
    for (let spread = 0; spread <= LAST_CONNECT_SPREAD_MAX; spread++) {
      keys.push((yyyymm * 100 + hour) * 10_000 + spread)
    }
  }
  return keys
}

/**
 * `currentMessageTable` / `activeMessageTables` of the service, by the Effect `Clock`. Both only
 * change at a UTC midnight, and are asked on every push: they are worked out once a day.
 */
export const tablesByClock = (options: StorageOptions) => {
  let day = Number.NaN
  let current = ""
  let active: ReadonlyArray<string> = []
  const at = (ms: number): void => {
    const today = Math.floor(ms / DAY_MS)
    if (today === day) return
    day = today
    current = currentTableName(options, ms)
    active = activeTableNames(options, ms)
  }
  return {
    currentMessageTable: Effect.map(Clock.currentTimeMillis, (ms) => {
      at(ms)
      return current
    }),
    activeMessageTables: Effect.map(Clock.currentTimeMillis, (ms) => {
      at(ms)
      return active
    })
  }
}
