/**
 * Whole tables out and in on the SQLite store, for `maintenance export` and `import`: the same
 * `TableCopy` service as on DynamoDB, rows read and written as the DynamoDB items they are
 * there (`dynamo/rows.ts`), so an export file moves between the two (a dynalite data directory to
 * SQLite, SQLite to DynamoDB) and reads the same whichever wrote it.
 *
 * Router table: one item per user, and the broadcasts item (`uaid` = `broadcasts`, one `b:{id}`
 * attribute per broadcast: the `{router}_broadcasts` table). Message tables: channel rows, and
 * messages; a meta row's `chids` set (written by older versions) becomes channel rows.
 */
import * as Effect from "effect/Effect"
import * as Layer from "effect/Layer"
import * as Option from "effect/Option"
import * as Stream from "effect/Stream"
import { TableCopy } from "../tableCopy.ts"
import { STORAGE_TIMEOUT_MS } from "../deadlines.ts"
import { hasReason } from "../failures.ts"
import { type Item, messageFromItem, messageToItem, S, userFromItem, userToItem } from "../items.ts"
import { BROADCAST_ATTRIBUTE_PREFIX, BROADCASTS_KEY, CHANNEL_PREFIX, channelSortKey, META_SORT_KEY } from "../model.ts"
import type { SqliteOptions } from "./layer.ts"
import { scopedSqlite } from "./driver.ts"
import { broadcastTableName, ident, MESSAGE_COLUMNS, messageFromRow, type MessageRow, messageValues, USER_COLUMNS, userFromRow, userRow } from "../sql/tables.ts"
import { type StorageError } from "../Storage.ts"

/** Rows read at a time by a scan. */
const SCAN_PAGE = 500

export const layerSqliteTableCopy = (options: SqliteOptions): Layer.Layer<TableCopy, StorageError> =>
  Layer.effect(
    TableCopy,
    Effect.gen(function*() {
      const { connection, run } = yield* scopedSqlite(options.path, options.timeoutMs ?? STORAGE_TIMEOUT_MS)
      const { statement, immediate } = connection
      const isRouter = (table: string) => table === options.routerTable

      const itemOf = (table: string, row: Record<string, unknown>): Item | undefined => {
        if (isRouter(table)) return userToItem(userFromRow(row as Parameters<typeof userFromRow>[0]))
        const key = String(row["chidmessageid"])
        if (key.startsWith(CHANNEL_PREFIX)) return { uaid: S(String(row["uaid"])), chidmessageid: S(key) }
        const message = messageFromRow(row as unknown as MessageRow)
        return message === undefined ? undefined : messageToItem(String(row["uaid"]), message)
      }

      const broadcastsItem = () => {
        const rows = statement(`SELECT id, version FROM ${ident(broadcastTableName(options))}`).all()
        if (rows.length === 0) return []
        const item: Item = { uaid: S(BROADCASTS_KEY) }
        for (const row of rows) item[`${BROADCAST_ATTRIBUTE_PREFIX}${String(row["id"])}`] = S(String(row["version"]))
        return [item]
      }

      /** Pages of rows by rowid, so that a scan of a live table holds no lock between pages. */
      const scan = (table: string) =>
        Stream.paginate<number, Item, StorageError>(0, (after) =>
          run("export", () => {
            const rows = statement(`SELECT rowid AS _rowid, * FROM ${ident(table)} WHERE rowid > ? ORDER BY rowid LIMIT ${SCAN_PAGE}`).all(after)
            const items = rows.flatMap((row): Array<Item> => {
              const item = itemOf(table, row)
              return item === undefined ? [] : [item]
            })
            const last = rows.at(-1)
            const next = last !== undefined && rows.length === SCAN_PAGE ? Option.some(Number(last["_rowid"])) : Option.none<number>()
            return [items as ReadonlyArray<Item>, next] as const
          })).pipe(Stream.concat(isRouter(table) ? Stream.fromIterableEffect(run("export", broadcastsItem)) : Stream.empty))

      const countUsers = (routerTable: string) =>
        run("import", () => Number(statement(`SELECT COUNT(*) AS n FROM ${ident(routerTable)}`).get()?.["n"] ?? 0)).pipe(
          Effect.catchIf(hasReason("MissingTable"), () => Effect.succeed(0))
        )

      const putRouterItem = (item: Item) => {
        if (item.uaid?.S === BROADCASTS_KEY) {
          for (const [name, value] of Object.entries(item)) {
            if (!name.startsWith(BROADCAST_ATTRIBUTE_PREFIX) || value.S === undefined) continue
            statement(`INSERT INTO ${ident(broadcastTableName(options))} (id, version) VALUES (?, ?) ON CONFLICT (id) DO UPDATE SET version = excluded.version`)
              .run(name.slice(BROADCAST_ATTRIBUTE_PREFIX.length), value.S)
          }
          return
        }
        statement(`INSERT OR REPLACE INTO ${ident(options.routerTable)} (uaid, ${USER_COLUMNS.join(", ")}) VALUES (${["uaid", ...USER_COLUMNS].map(() => "?").join(", ")})`)
          .run(...userRow(userFromItem(item)))
      }

      const putMessageItem = (table: string, item: Item) => {
        const uaid = item.uaid?.S
        const key = item.chidmessageid?.S
        if (uaid === undefined || key === undefined) return
        const addChannel = (sortKey: string) =>
          statement(`INSERT INTO ${ident(table)} (uaid, chidmessageid) VALUES (?, ?) ON CONFLICT DO NOTHING`).run(uaid, sortKey)
        if (key.startsWith(CHANNEL_PREFIX)) return void addChannel(key)
        if (key === META_SORT_KEY) return void (item.chids?.SS ?? []).forEach((chid) => addChannel(channelSortKey(chid)))
        const message = messageFromItem(item)
        if (message === undefined) return
        statement(`INSERT OR REPLACE INTO ${ident(table)} (${MESSAGE_COLUMNS}) VALUES (${MESSAGE_COLUMNS.split(", ").map(() => "?").join(", ")})`)
          .run(...messageValues(uaid, message))
      }

      const putItems = (table: string, items: ReadonlyArray<Item>) =>
        run("import", () =>
          immediate(() => {
            for (const item of items) isRouter(table) ? putRouterItem(item) : putMessageItem(table, item)
          }))

      return TableCopy.of({ scan, countUsers, putItems })
    })
  )
