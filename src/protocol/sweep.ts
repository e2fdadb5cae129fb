/**
 * The sweep of a month move cut short (see `Sweep`): a session that ends while moving its user out
 * of last month's table reads the record; if it names a newer table, the old table's rows the
 * session does not hold are moved there (saved first, then taken out of the old table, a page at a
 * time, until a read finds none), and the session's table becomes the record's, so that what it
 * saves next goes there too. The rest of the end (`closing.ts`) then goes on as usual.
 */
import type { Out } from "./out.ts"
import type { Closing, ClosingStage, Phase, Session, StoredUnacked, Sweep } from "./phases.ts"
import type { Notification } from "../domain/notification.ts"
import { tableMovedTo, type UserRecord } from "../domain/user.ts"

/** The rest of the end once the sweep is done (the save of what is unacked). */
type Resume = (phase: Closing, out: Out) => Phase

/** The sweep is due: the record says whether, and where, the user moved. */
export const startSweep = (phase: Closing, out: Out): Phase => {
  out.run({ _tag: "ReadUser", uaid: phase.session.uaid, attempt: 0 })
  return { ...phase, stage: { _tag: "Sweeping", to: undefined, moved: 0, rows: [] } }
}

/** The messages the session holds (unacked, or acked and not made tombstones yet): its own save takes care of them. */
const held = (s: Session): ReadonlySet<string> => {
  const versions = new Set<string>()
  for (const entry of s.acks.unacked.values()) versions.add(entry.notification.version)
  for (const row of s.acks.ackedRows) versions.add(row.notification.version)
  if (s.retry?.command._tag === "TombstoneAcked") for (const row of s.retry.command.messages) versions.add(row.notification.version)
  return versions
}

/**
 * The next page of the old table, from its first row (the rows moved so far are gone from it), with
 * enough rows to pass those the session holds; `moved` so far.
 */
export const sweepNextPage = (phase: Closing, sweep: Sweep, to: string, moved: number, out: Out): Phase => {
  const s = phase.session
  out.run({ _tag: "ReadPage", uaid: s.uaid, table: sweep.from, rows: "first", after: undefined, limit: out.options.pageSize + held(s).size, attempt: 0 })
  return { ...phase, stage: { _tag: "Sweeping", to, moved, rows: [] } }
}

const done = (phase: Closing, sweep: Sweep, moved: number, resume: Resume, out: Out): Phase =>
  resume({ ...phase, sweep: { ...sweep, moved } }, out)

/** The record: still on the old table (or gone), nothing to move; else its pages are moved to the record's table. */
export const sweepUserRead = (phase: Closing, sweep: Sweep, user: UserRecord | undefined, resume: Resume, out: Out): Phase => {
  const to = tableMovedTo(sweep.from, user)
  if (to === undefined) return done(phase, sweep, 0, resume, out)
  return sweepNextPage({ ...phase, session: { ...phase.session, table: to } }, sweep, to, 0, out)
}

/** A page: the rows the session does not hold are saved into the record's table `to`; none left, the sweep is done. */
export const sweepPageRead = (phase: Closing, sweep: Sweep, to: string, moved: number, page: ReadonlyArray<Notification>, resume: Resume, out: Out): Phase => {
  const mine = held(phase.session)
  const rows = page.filter((n) => !mine.has(n.version))
  if (rows.length === 0) return done(phase, sweep, moved, resume, out)
  out.run({ _tag: "SaveMessages", uaid: phase.session.uaid, table: to, messages: rows, attempt: 0 })
  return { ...phase, stage: { _tag: "Sweeping", to, moved, rows } }
}

/**
 * Saved into the record's table `to`: every row of the page is taken out of the old one next (then
 * the next page), also those the save left out (replaced there by a newer message of their topic,
 * or cancelled): they are dead, and a sweep that left them would read them again and again.
 */
export const sweepSaved = (
  sweep: Sweep,
  stage: Extract<ClosingStage, { _tag: "Sweeping" }>,
  to: string,
  saved: ReadonlyArray<Notification>
): Extract<ClosingStage, { _tag: "Taking" }> => ({
  _tag: "Taking",
  table: to,
  then: { _tag: "Sweep", moved: stage.moved },
  saved,
  left: stage.rows.map((notification): StoredUnacked => ({ _tag: "Stored", notification, table: sweep.from })),
  undo: []
})
