/**
 * The senders whose pushes another push service would refuse (`senderWarnings` of `vapid.ts`): each
 * warning counted (`notification.sender.warning`), and kept per VAPID key for the console — the
 * last 1,000 keys that got one, so that an operator can tell which application server to fix.
 */
import type { SenderReport } from "../console/console.ts"
import { METRICS } from "../observability/catalog.ts"
import type { MetricsService } from "../observability/Metrics.ts"
import { RecentMap } from "../platform/memo.ts"
import type { SenderWarning } from "./vapid.ts"

/** VAPID keys remembered with their warnings. */
const KEYS = 1_000
/** Unsigned pushes (legacy encryption) are one sender here: they have no key to tell them apart. */
const UNSIGNED = "unsigned"

export interface SenderWarnings {
  /** Count the warnings of a push signed with `rawKey` (undefined: unsigned); nothing to do when there are none. */
  readonly record: (rawKey: Buffer | undefined, warnings: ReadonlyArray<SenderWarning>, nowMs: number) => void
  /** The keys with warnings, the most recently warned first. */
  readonly reports: () => ReadonlyArray<SenderReport>
}

export const makeSenderWarnings = (metrics: MetricsService | undefined): SenderWarnings => {
  const byKey = new RecentMap<{ readonly warnings: Partial<Record<SenderWarning, number>>; lastSeen: number }>(KEYS)
  const counters = new Map<SenderWarning, { readonly inc: () => void }>()
  const count = (warning: SenderWarning): void => {
    let counter = counters.get(warning)
    if (counter === undefined) {
      counter = metrics?.counter(METRICS.senderWarning.name, { kind: warning }) ?? { inc: () => {} }
      counters.set(warning, counter)
    }
    counter.inc()
  }
  return {
    record: (rawKey, warnings, nowMs) => {
      if (warnings.length === 0) return
      const key = rawKey === undefined ? UNSIGNED : rawKey.toString("base64url")
      const entry = byKey.get(key) ?? { warnings: {}, lastSeen: nowMs }
      for (const warning of warnings) {
        count(warning)
        entry.warnings[warning] = (entry.warnings[warning] ?? 0) + 1
      }
      entry.lastSeen = nowMs
      byKey.set(key, entry)
    },
    reports: () =>
      [...byKey].map(([key, entry]) => ({
        vapidKey: key === UNSIGNED ? null : key,
        warnings: { ...entry.warnings },
        lastSeen: new Date(entry.lastSeen).toISOString()
      })).sort((a, b) => b.lastSeen.localeCompare(a.lastSeen))
  }
}
