/**
 * Opaque stand-ins for identifiers that must not be written out as they are.
 *
 * - A `uaid` is a bearer credential on the WebSocket side: a client that says `hello` with it resumes
 *   that user and receives its stored messages. Logs must not carry it.
 * - A message id (`version`) is a Fernet token, and a bearer capability: `DELETE /m/{id}` cancels the
 *   message. Logs must not carry it either.
 *
 * Both are replaced by the first 16 hex digits (64 bits) of their SHA-256: stable across processes
 * (the endpoint's and the connection node's lines about one message or one user carry the same
 * value, so they can be joined), not reversible (a uaid has 122 random bits, a message id is
 * encrypted), and an operator who holds the real id can compute it (`opaqueId`) to grep for it.
 */
import { hash } from "node:crypto"
import { memoize } from "../platform/memo.ts"

/** Length of an opaque id in hex digits. */
const OPAQUE_ID_LENGTH = 16

const OPAQUE = /^[0-9a-f]{16}$/

export const opaqueId = (value: string): string => hash("sha256", value, "hex").slice(0, OPAQUE_ID_LENGTH)

/** True when `value` has the shape of an `opaqueId` (raw uaids and message ids never do: 32 hex / base64url ≥ 100). */
export const isOpaqueId = (value: string): boolean => OPAQUE.test(value)

/**
 * `opaqueId` remembering its last `size` inputs (a SHA-256 costs microseconds; a session's events
 * repeat its uaid, a message's events its version).
 */
export const makeOpaqueIds = (size = 4_096): ((value: string) => string) => memoize(size, opaqueId)
