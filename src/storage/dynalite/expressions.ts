/**
 * dynalite parses every request's expressions anew with its PEG parsers: 20–60 µs a request (the
 * condition of a stored message about 40, a user's message Query about 60), on the embedded
 * storage's one thread. The service sends the same few dozen expressions over and over with other
 * values, so the parse of one is kept and reused (`memoizeExpressions`), for dynalite's
 * `validations/index.js` (patched by `dynalite/thread.ts`).
 *
 * A parsed tree holds the request's value objects themselves where the expression names them
 * (`:uaid` → `{ S: "…" }`); nothing else in it depends on a value but its type. So a tree is kept per
 * expressions, names and the names and types of the values, and reused as a copy with this
 * request's values in place of the first one's. Two checks read a value's content while parsing:
 * `BETWEEN` compares its bounds — a reused tree is checked the same way, and parsed afresh when its
 * bounds are the wrong way round, so that dynalite refuses it with its own words — and
 * `attribute_type` reads a type's name: expressions with it are always parsed. Only valid parses are
 * kept: an invalid request is refused by dynalite's own code every time.
 */

/** The part of dynalite's request validation used here. */
export interface Validations {
  validateExpressions: (data: Record<string, unknown>) => string | undefined
  validateAttributeValue: (value: unknown) => string | undefined
}

/** dynalite's comparison of two attribute values (`db/index.js`), as its parser checks `BETWEEN` with. */
export type Compare = (comparison: "GT", x: unknown, y: unknown) => boolean

/** What `validateExpressions` parses into a request (the fields dynalite's actions read). */
export const PARSED = ["_updates", "_condition", "_keyCondition", "_filter", "_projection"] as const
const EXPRESSIONS = ["UpdateExpression", "ConditionExpression", "KeyConditionExpression", "FilterExpression", "ProjectionExpression"] as const
const TYPE_NAMES_READ = /attribute_type/i
const BOUNDS_COMPARED = /between/i
/** Distinct shapes kept; the service sends a few dozen. */
const MEMO_SIZE = 1024

type Values = Readonly<Record<string, Record<string, unknown>>>

interface Parsed {
  readonly trees: ReadonlyArray<unknown>
  /** The values the trees hold, by name. */
  readonly values: Values | undefined
  /** The expressions have a `BETWEEN`, whose bounds a reused tree must compare again. */
  readonly between: boolean
}

/** A copy of `tree` with each value object that `swap` has replaced by its counterpart. */
const withValues = (tree: unknown, swap: ReadonlyMap<unknown, unknown>): unknown => {
  if (tree === null || typeof tree !== "object") return tree
  const swapped = swap.get(tree)
  if (swapped !== undefined) return swapped
  if (Array.isArray(tree)) return tree.map((node) => withValues(node, swap))
  // dynalite makes some of its maps without a prototype: the copy keeps it.
  const copy = Object.create(Object.getPrototypeOf(tree) as object | null) as Record<string, unknown>
  for (const key of Object.keys(tree)) copy[key] = withValues((tree as Record<string, unknown>)[key], swap)
  return copy
}

/** A `BETWEEN` of two values whose lower bound is above the upper one, anywhere in `tree`. */
const badBetween = (tree: unknown, compare: Compare): boolean => {
  if (tree === null || typeof tree !== "object") return false
  const node = tree as { readonly type?: unknown; readonly args?: ReadonlyArray<unknown> }
  if (node.type === "between" && node.args !== undefined) {
    const [, low, high] = node.args
    if (isValue(low) && isValue(high) && compare("GT", low, high)) return true
  }
  return Object.values(tree).some((child) => badBetween(child, compare))
}

/** An attribute value (`{ S: "…" }`), not a document path (an array) or an expression node. */
const isValue = (x: unknown): boolean => x !== null && typeof x === "object" && !Array.isArray(x) && !("type" in x) && !("attrType" in x)

/** The memo's key: the expressions, the names, and each value's name and type. */
const shapeOf = (data: Record<string, unknown>, values: Values | undefined): string =>
  JSON.stringify([
    EXPRESSIONS.map((field) => data[field]),
    data["ExpressionAttributeNames"],
    values === undefined ? null : Object.keys(values).map((name) => [name, Object.keys(values[name] ?? {})])
  ])

export const memoizeExpressions = (validations: Validations, compare: Compare): void => {
  const validate = validations.validateExpressions
  const parsed = new Map<string, Parsed>()
  validations.validateExpressions = (data) => {
    const values = data["ExpressionAttributeValues"] as Values | undefined
    const key = shapeOf(data, values)
    const known = parsed.get(key)
    if (known === undefined) {
      const invalid = validate(data)
      const text = EXPRESSIONS.map((field) => data[field] ?? "").join(" ")
      if (invalid === undefined && !TYPE_NAMES_READ.test(text)) {
        if (parsed.size >= MEMO_SIZE) parsed.clear()
        parsed.set(key, { trees: PARSED.map((field) => data[field]), values, between: BOUNDS_COMPARED.test(text) })
      }
      return invalid
    }
    let trees = known.trees
    // The key has the same value names as `known`: both have values, or neither.
    if (values !== undefined && known.values !== undefined) {
      const swap = new Map<unknown, unknown>()
      for (const name of Object.keys(values)) {
        // Each value is checked as the original does (a number that is no number, an empty set…).
        if (validations.validateAttributeValue(values[name]) !== undefined) return validate(data)
        swap.set(known.values[name], values[name])
      }
      trees = trees.map((tree) => withValues(tree, swap))
      if (known.between && trees.some((tree) => badBetween(tree, compare))) return validate(data)
    }
    PARSED.forEach((field, i) => {
      if (trees[i] !== undefined) data[field] = trees[i]
    })
    return undefined
  }
}
