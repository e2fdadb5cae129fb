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
import { keepingTheId, makeMessageOperations, type MessageRows, type ReadRow, saveAtFreeMs, saveOutcome } from "../messageRules.ts"
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

/**
 * A user's unexpired messages, as the expiry index (`_live_expiry`, `liveIndexSql`) holds them, `$2`
 * the time (s): a condition that implies the index's own, so that the database can read them there.
 */
const UNEXPIRED = "cancelled IS NULL AND expiry IS NOT NULL AND expiry > $2"

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
 * Index entries one step of a page read passes at most (`readLive`) for a user with more unexpired
 * messages than `LIVE_PROBE` among rows that expired since the sweep's last round: steps of a
 * bounded length (about a millisecond each), with the event loop free between them, instead of one
 * long statement.
 */
const SCAN_CHUNK = 1024

/** The keys of a user's unexpired messages a page read past expired rows takes from the expiry index at most. */
const LIVE_PROBE = 1024

const readRows = (rows: ReadonlyArray<MessageRow>) =>
  rows.flatMap((row) => {
    const message = messageFromRow(row)
    return message === undefined ? [] : [{ sortKey: row.chidmessageid, message }]
  })

const messageRowsOf = ({ rows }: Result): ReadonlyArray<MessageRow> => rows as unknown as ReadonlyArray<MessageRow>

/** Rows in key order, as the stores compare keys (byte by byte: the keys are ASCII). */
const byKey = (a: MessageRow, b: MessageRow) => (a.chidmessageid < b.chidmessageid ? -1 : a.chidmessageid > b.chidmessageid ? 1 : 0)

/** A row a read returns: not a tombstone, unexpired at `nowSeconds`. */
const readable = (nowSeconds: number) => (row: MessageRow) => row.cancelled === null && (row.expiry === null || Number(row.expiry) > nowSeconds)

type ReadArgs = Parameters<MessageRows["readable"]>

/**
 * Readable rows with `lo < key < hi`, `limit` at most, in statements run together as one operation.
 * A read from the user's first row on (a hello's) starts with the keys of the user's unexpired
 * messages, in the expiry index alone (`_live_expiry`, `liveIndexSql`), past any dead rows: when
 * they are a page's worth or fewer (nearly every user; none, most often), their rows are the page.
 * Otherwise, the next `limit` rows that are not tombstones, whole, by key (`_live`): where they are
 * unexpired that is the page. Where some had expired (the sweep deletes them within a minute), the
 * rest of the page is found by expiry: the keys of the user's unexpired messages (`LIVE_PROBE` + 1
 * at most, to know whether there are more), then the page's rows by key. A user with more is read
 * on in steps (`inSteps`).
 */
const readLive = (driver: Pick<SqlDriver, "dialect" | "one" | "run">): MessageRows["readable"] => (...args) =>
  Effect.gen(function*() {
    const [operation, uaid, table, lo, hi, limit, now] = args
    const nowSeconds = Math.floor(now / 1000)
    /** The keys of the user's unexpired messages, `atMost` of them, in any order. */
    function* unexpiredKeys(atMost: number): Sql<ReadonlyArray<string>> {
      const { rows } = yield sql(`SELECT chidmessageid FROM ${ident(table)} WHERE uaid = $1 AND ${UNEXPIRED} ORDER BY expiry LIMIT $3`, uaid, nowSeconds, atMost)
      return rows.map((row) => String(row["chidmessageid"]))
    }
    /** Of `keys`, those after `from` in the range, `wanted` at most in key order, read whole: a seek each. */
    function* rowsOf(keys: ReadonlyArray<string>, from: string, wanted: number): Sql<ReadonlyArray<ReadRow>> {
      const chosen = keys.filter((key) => key > from && key < hi).sort().slice(0, wanted)
      if (chosen.length === 0) return []
      // By key alone (with the index's condition, SQLite would read the expiry index again).
      const rows = messageRowsOf(yield sql(`SELECT * FROM ${ident(table)} WHERE uaid = $1 AND chidmessageid ${driver.dialect.inList(2)}`, uaid, jsonList(chosen)))
      return readRows(rows.filter(readable(nowSeconds)).sort(byKey))
    }
    const read = yield* driver.run(operation, function*() {
      if (lo === TOPIC_PREFIX) {
        const keys = yield* unexpiredKeys(limit + 1)
        if (keys.length <= limit) return { page: yield* rowsOf(keys, lo, limit) }
      }
      const first = messageRowsOf(yield sql(`SELECT * ${liveRange(table)} AND chidmessageid < $3 ORDER BY chidmessageid LIMIT $4`, uaid, lo, hi, limit))
      const page = readRows(first.filter(readable(nowSeconds)))
      const from = first.at(-1)?.chidmessageid
      if (first.length < limit || page.length === limit || from === undefined) return { page }
      const keys = yield* unexpiredKeys(LIVE_PROBE + 1)
      if (keys.length > LIVE_PROBE) return { page, from }
      return { page: [...page, ...yield* rowsOf(keys, from, limit - page.length)] }
    })
    return read.from === undefined ? read.page : [...read.page, ...yield* inSteps(driver, args, read.from, limit - read.page.length)]
  })

/** A user's rows that are not tombstones with keys after `$2`, as the `_live` index holds them. */
const liveRange = (table: string) => `FROM ${ident(table)} WHERE uaid = $1 AND chidmessageid > $2 AND cancelled IS NULL`

/**
 * The next `wanted` readable rows after `from`, for a user with more than `LIVE_PROBE` unexpired
 * messages among expired ones: steps of `SCAN_CHUNK` entries of `_live`, the key that far (keys
 * only), then the live rows up to it, judged by the database, the event loop free between steps.
 */
const inSteps = Effect.fnUntraced(function*({ one }: Pick<SqlDriver, "one">, args: ReadArgs, from: string, wanted: number) {
  const [operation, uaid, table, , hi, , now] = args
  const page: Array<ReadRow> = []
  for (let after: string | undefined = from; page.length < wanted && after !== undefined;) {
    yield* Effect.yieldNow
    const bound: string | undefined = yield* one(
      operation,
      sql(`SELECT chidmessageid ${liveRange(table)} AND chidmessageid < $3 ORDER BY chidmessageid LIMIT 1 OFFSET ${SCAN_CHUNK - 1}`, uaid, after, hi),
      ({ rows }) => (rows[0] as { readonly chidmessageid: string } | undefined)?.chidmessageid
    )
    page.push(...readRows(yield* one(
      operation,
      sql(`SELECT * ${liveRange(table)} AND chidmessageid ${bound === undefined ? "<" : "<="} $3 AND (expiry IS NULL OR expiry > $4)
           ORDER BY chidmessageid LIMIT $5`, uaid, after, bound ?? hi, Math.floor(now / 1000), wanted - page.length),
      messageRowsOf
    )))
    after = bound
  }
  return page
})

const sqlMessageRows = ({ dialect, one, run }: SqlDriver): MessageRows => ({
  /** Its two statements as one operation: no write of another fiber comes between the put and the read that tells why it was refused. */
  save: (operation, uaid, table, message) => run(operation, () => saveRow(uaid, table, message)),
  readable: readLive({ dialect, one, run }),
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
            `SELECT count(*) AS n FROM (SELECT 1 FROM ${ident(table)} WHERE uaid = $1 AND ${UNEXPIRED} AND (
               (chidmessageid > $3 AND chidmessageid < $4 AND chidmessageid LIKE $5)
               OR (chidmessageid >= $6 AND chidmessageid < $7 AND chidmessageid <> $8)) LIMIT $9) AS counted`,
            uaid,
            Math.floor(now / 1000),
            TIMESTAMP_PREFIX,
            TIMESTAMP_END,
            `${TIMESTAMP_PREFIX}%:${channelId}`,
            `${TOPIC_PREFIX}${channelId}:`,
            `${TOPIC_PREFIX}${channelId};`,
            replacing === undefined ? "" : topicSortKey(channelId, replacing),
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
