/**
 * The SQL stores' messages, in a month's message table (`{prefix}_{YYYY}_{MM}`): one row per
 * message keyed by (`uaid`, `chidmessageid`: `01:` topic, `02:` timestamp), with its `expiry`
 * (seconds), and its tombstone once cancelled or acked (`cancelled` 1, content gone, key and
 * version kept, expiry cut to `TOMBSTONE_SECONDS` from then: the sweep deletes it within minutes,
 * `sql/sweep.ts`); on either store's driver (`sql/driver.ts`). The row operations the message rules
 * are written over (`messageRules.ts`), and three operations done faster in SQL: a session's saves
 * in one transaction, a channel's count and an ack in one statement each.
 *
 * Expiry is judged by the Effect `Clock` on every read (`expiry > now`), as on the other layers.
 */
import * as Clock from "effect/Clock"
import * as Effect from "effect/Effect"
import { type Notification, sortkeyMs } from "../../domain/notification.ts"
import { keepingTheId, makeMessageOperations, type MessageRows, saveAtFreeMs, saveOutcome } from "../messageRules.ts"
import { messageSortKey, type SaveOutcome, sortKeyOf, TIMESTAMP_END, TIMESTAMP_PREFIX, TOMBSTONE_SECONDS, TOPIC_PREFIX, topicSortKey } from "../model.ts"
import type { AckedRow } from "../Storage.ts"
import type { MessageSave } from "../manySaves.ts"
import { jsonList } from "./dialect.ts"
import { changed, found, fromExcluded, nothing, placeholders, type Result, sql, type Sql, type SqlDriver, type Statement } from "./driver.ts"
import { ident, MESSAGE_COLUMNS, messageFromRow, type MessageRow, messageValues } from "./tables.ts"

const COLUMNS = MESSAGE_COLUMNS.split(", ")
/** A message row's values, and the update of a row it replaces (every column but the key). */
const VALUES = placeholders(COLUMNS.length)
const UPDATE_ALL = fromExcluded(COLUMNS.slice(2))

/** An operation that judges expiry: `now` is the caller's Clock (ms). */
export const atNow = <A, E>(body: (now: number) => Effect.Effect<A, E>): Effect.Effect<A, E> => Effect.flatMap(Clock.currentTimeMillis, body)

/** The write rule (`mayWriteOver`) as an upsert's condition. */
const putStatement = (uaid: string, table: string, message: Notification): Statement => {
  const insert = `INSERT INTO ${ident(table)} AS m (${MESSAGE_COLUMNS}) VALUES (${VALUES})
    ON CONFLICT (uaid, chidmessageid) DO UPDATE SET ${UPDATE_ALL}`
  return message.topic === undefined
    ? sql(`${insert} WHERE m.updateid = excluded.updateid AND m.cancelled IS NULL`, ...messageValues(uaid, message))
    : sql(
      `${insert} WHERE coalesce(m.sortkey_timestamp, m.timestamp * 1000) <= $${COLUMNS.length + 1}
       AND (m.cancelled IS NULL OR m.updateid IS DISTINCT FROM excluded.updateid)`,
      ...messageValues(uaid, message),
      sortkeyMs(message)
    )
}

const ownTombstoneStatement = (uaid: string, table: string, message: Notification): Statement =>
  sql(
    `SELECT 1 FROM ${ident(table)} WHERE uaid = $1 AND chidmessageid = $2 AND updateid = $3 AND cancelled IS NOT NULL`,
    uaid,
    messageSortKey(message),
    message.version
  )

/**
 * What a row becomes when it is buried: its tombstone, key and version kept, expiring
 * `TOMBSTONE_SECONDS` after `now` (the statement's parameter `$n`) unless the message expires sooner.
 */
const bury = (n: number) =>
  `SET cancelled = 1, data = NULL, headers = NULL, expiry = CASE WHEN expiry IS NULL OR expiry > $${n} THEN $${n} ELSE expiry END`
const tombstoneExpiry = (now: number) => Math.floor(now / 1000) + TOMBSTONE_SECONDS

/** One statement as a step of an operation, its answer read from its result. */
function* step<A>(statement: Statement, answer: (result: Result) => A): Sql<A> {
  return answer(yield statement)
}

/** One message's save as statements (a step of a transaction). */
const saveRow = (uaid: string, table: string, message: Notification): Sql<SaveOutcome> =>
  saveOutcome(message, step(putStatement(uaid, table, message), changed), () => step(ownTombstoneStatement(uaid, table, message), found))

/** A user's messages, each at its key or the next ms free (the id kept), as statements; the messages as stored. */
function* saveAll({ messages, table, uaid }: MessageSave): Sql<ReadonlyArray<Notification>> {
  const saved: Array<Notification> = []
  for (const message of messages) {
    const { outcome, placed } = yield* saveAtFreeMs((n) => saveRow(uaid, table, n), message, keepingTheId)
    if (outcome === "stored") saved.push(placed)
  }
  return saved
}

/**
 * Index entries one step of a page read passes at most (`readLive`), so a user's rows that expired
 * since the sweep's last round (not yet deleted) cost steps of a bounded length (about a
 * millisecond each), with the event loop free between them, instead of one long statement.
 */
const SCAN_CHUNK = 1024

/**
 * Readable rows with `lo < key < hi`, `limit` at most, through the live index (`liveIndexSql`).
 * First the next `limit` rows that are not tombstones, whole: where they are live (the common case)
 * that is the page, in one statement. Where some had expired, the rest is read in steps: the key
 * `SCAN_CHUNK` entries on (keys only, in the index), then the live rows up to it, judged by the
 * database, so a dead entry costs the database's time and no row object.
 */
const readLive = ({ one }: Pick<SqlDriver, "one">): MessageRows["readable"] => {
  const messages = (rows: ReadonlyArray<MessageRow>) =>
    rows.flatMap((row) => {
      const message = messageFromRow(row)
      return message === undefined ? [] : [{ sortKey: row.chidmessageid, message }]
    })
  return (operation, uaid, table, lo, hi, limit, now) =>
    Effect.gen(function*() {
      const nowSeconds = Math.floor(now / 1000)
      const range = `FROM ${ident(table)} WHERE uaid = $1 AND chidmessageid > $2 AND cancelled IS NULL`
      const first = yield* one(
        operation,
        sql(`SELECT * ${range} AND chidmessageid < $3 ORDER BY chidmessageid LIMIT $4`, uaid, lo, hi, limit),
        ({ rows }) => rows as unknown as ReadonlyArray<MessageRow>
      )
      const page = messages(first.filter((row) => row.expiry === null || Number(row.expiry) > nowSeconds))
      for (let from = first.at(-1)?.chidmessageid; first.length === limit && page.length < limit && from !== undefined;) {
        yield* Effect.yieldNow
        const bound = yield* one(
          operation,
          sql(`SELECT chidmessageid ${range} AND chidmessageid < $3 ORDER BY chidmessageid LIMIT 1 OFFSET ${SCAN_CHUNK - 1}`, uaid, from, hi),
          ({ rows }) => (rows[0] as { readonly chidmessageid: string } | undefined)?.chidmessageid
        )
        page.push(
          ...yield* one(
            operation,
            sql(
              `SELECT * ${range} AND chidmessageid ${bound === undefined ? "<" : "<="} $3 AND (expiry IS NULL OR expiry > $4)
               ORDER BY chidmessageid LIMIT $5`,
              uaid,
              from,
              bound ?? hi,
              nowSeconds,
              limit - page.length
            ),
            ({ rows }) => messages(rows as unknown as ReadonlyArray<MessageRow>)
          )
        )
        from = bound
      }
      return page
    })
}

const sqlMessageRows = ({ one, run }: SqlDriver): MessageRows => ({
  /** Its two statements as one operation: no write of another fiber comes between the put and the read that tells why it was refused. */
  save: (operation, uaid, table, message) => run(operation, () => saveRow(uaid, table, message)),
  readable: readLive({ one }),
  remove: (operation, uaid, table, sortKey, version) =>
    version === undefined
      ? one(operation, sql(`DELETE FROM ${ident(table)} WHERE uaid = $1 AND chidmessageid = $2`, uaid, sortKey), () => true)
      : one(
        operation,
        sql(`DELETE FROM ${ident(table)} WHERE uaid = $1 AND chidmessageid = $2 AND updateid = $3 AND cancelled IS NULL`, uaid, sortKey, version),
        changed
      ),
  bury: (operation, uaid, table, sortKey, version, now) =>
    one(
      operation,
      sql(
        `UPDATE ${ident(table)} ${bury(4)} WHERE uaid = $1 AND chidmessageid = $2 AND updateid = $3 AND cancelled IS NULL`,
        uaid,
        sortKey,
        version,
        tombstoneExpiry(now)
      ),
      changed
    )
})

export const makeSqlMessages = (driver: SqlDriver) => {
  const { dialect, one, run } = driver
  const operations = makeMessageOperations(sqlMessageRows(driver), {
    /** All in one transaction: one commit for a session's saves. */
    saveMessages: (uaid, table, messages) => run("saveMessages", () => saveAll({ uaid, table, messages }), messages.length > 0),
    /** One statement: the channel's topic rows (a range) and timestamp rows (the user's, by the key's end), readable ones, `atMost` at most. */
    countChannelMessages: (uaid, table, channelId, atMost, replacing) =>
      atNow((now) =>
        one(
          "countChannelMessages",
          sql(
            `SELECT count(*) AS n FROM (SELECT 1 FROM ${ident(table)} WHERE uaid = $1 AND (
               (chidmessageid > $2 AND chidmessageid < $3 AND chidmessageid LIKE $4)
               OR (chidmessageid >= $5 AND chidmessageid < $6 AND chidmessageid <> $7))
             AND (expiry IS NULL OR expiry > $8) AND cancelled IS NULL LIMIT $9) AS counted`,
            uaid,
            TIMESTAMP_PREFIX,
            TIMESTAMP_END,
            `${TIMESTAMP_PREFIX}%:${channelId}`,
            `${TOPIC_PREFIX}${channelId}:`,
            `${TOPIC_PREFIX}${channelId};`,
            replacing === undefined ? "" : topicSortKey(channelId, replacing),
            Math.floor(now / 1000),
            atMost
          ),
          ({ rows }) => Number((rows[0] as { readonly n: unknown } | undefined)?.n ?? 0)
        )
      ),
    /** One statement: each row still holding its acked version becomes its tombstone (rows found by key, then version). */
    ackMessages: (uaid: string, table: string, rows: ReadonlyArray<AckedRow>) =>
      rows.length === 0 ? Effect.void : atNow((now) =>
        one(
          "ackMessages",
          sql(
            `UPDATE ${ident(table)} ${bury(4)} WHERE uaid = $1 AND chidmessageid ${dialect.inList(2)} AND cancelled IS NULL
             AND (chidmessageid, updateid) IN (SELECT value->>0, value->>1 FROM ${dialect.tuples(3)})`,
            uaid,
            jsonList(rows.map((row) => sortKeyOf(row.key))),
            jsonList(rows.map((row) => [sortKeyOf(row.key), row.version])),
            tombstoneExpiry(now)
          ),
          nothing
        )
      )
  })
  return {
    ...operations,
    /** Many users' saves in one transaction: one commit, one round of the write lock. */
    saveManyMessages: (saves: ReadonlyArray<MessageSave>) =>
      run("saveManyMessages", function*() {
        const saved: Array<ReadonlyArray<Notification>> = []
        for (const save of saves) saved.push(yield* saveAll(save))
        return saved
      }, saves.length > 0)
  }
}
