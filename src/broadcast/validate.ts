/** What a broadcast id and version may be: what the admin API accepts and a source may deliver. */

/** Ids like Firefox's `remote-settings/monitor_changes`: letters, digits, `_ - . / :`, at most 128. */
const ID = /^[A-Za-z0-9_\-./:]{1,128}$/
/** Versions are opaque (Remote Settings quotes its timestamps): printable ASCII, at most 128. */
const VERSION = /^[\x21-\x7e]{1,128}$/

export const isBroadcastId = (id: string): boolean => ID.test(id)
export const isBroadcastVersion = (version: string): boolean => VERSION.test(version)

/** Broadcasts a set may hold: a bound on what a source can make every node keep. */
export const MAX_BROADCASTS = 1_000

/** A set as a source sent it, if every id and version is valid; otherwise why not. */
export const decodeBroadcastSet = (value: unknown): ReadonlyMap<string, string> | string => {
  if (typeof value !== "object" || value === null || Array.isArray(value)) return "not an object of id → version"
  const entries = Object.entries(value)
  if (entries.length > MAX_BROADCASTS) return `more than ${MAX_BROADCASTS} broadcasts`
  const set = new Map<string, string>()
  for (const [id, version] of entries) {
    if (!isBroadcastId(id)) return `invalid broadcast id ${JSON.stringify(id.slice(0, 40))}`
    if (typeof version !== "string" || !isBroadcastVersion(version)) return `invalid version of ${id}`
    set.set(id, version)
  }
  return set
}
