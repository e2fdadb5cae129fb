/**
 * `endpoint-diagnostic URL`: what an endpoint URL stands for and whether the endpoint node would
 * accept a message for it. The token is opened with the configured crypto keys (one at a time, to
 * tell which key made it), then storage is read: the router record, the channel set and the
 * stored messages of the user's message table. Nothing is written.
 *
 * With `--authorization`, a sender's VAPID header is checked as the endpoint node checks it (key,
 * signature, `exp`, `aud`) and given the sender warnings its pushes would get (`Autopush-Warning`).
 *
 * Secrets stay secret: the keys are never printed, and of a bridge user's `router_data` only the
 * field names are.
 */
import * as Clock from "effect/Clock"
import * as Console from "effect/Console"
import * as Effect from "effect/Effect"
import * as Result from "effect/Result"
import { ConfigError, HelpRequested, requireSecrets, type Settings } from "../config/index.ts"
import type { OptionName } from "../config/options.ts"
import {
  decodeVapidPublicKey,
  type EndpointToken,
  type EndpointVersion,
  makeKeyRing,
  matchesVapidKey,
  parseEndpointToken
} from "../crypto/endpoint.ts"
import type { FernetErrorReason } from "../crypto/fernet.ts"
import { endpointOrigin } from "../endpoint/options.ts"
import { parseVapid, SENDER_WARNING_TEXT, type SenderWarning, senderWarnings, verifyVapid } from "../endpoint/vapid.ts"
import type { Notification } from "../domain/notification.ts"
import type { UserRecord } from "../domain/user.ts"
import { hasReason, Storage, StorageError } from "../storage/Storage.ts"
import {
  describeStorageError,
  NegativeResult,
  settingsHelp,
  splitArgs,
  type ToolError,
  ToolFailure,
  toolSettings,
  usageRow,
  UsageError
} from "./cli.ts"
import { embeddedSecretsFile, readEmbeddedSecrets, storageDescription, toolStorageLayer } from "./storage.ts"

// ── the URL ──────────────────────────────────────────────────────────────────────────────────────

interface EndpointRef {
  readonly token: string
  /** The version the endpoint node would read the token as (`/wpush/TOKEN` is v1); undefined for a bare token. */
  readonly pathVersion: EndpointVersion | undefined
}

const TOKEN = /^[A-Za-z0-9_-]+={0,2}$/
const FORMS = "expected https://HOST/wpush/v1/TOKEN, …/wpush/v2/TOKEN, …/wpush/TOKEN, a path such as /wpush/v2/TOKEN, or the bare TOKEN"

/**
 * The token of an endpoint URL: `…/wpush/{v1|v2}/TOKEN`, `…/wpush/TOKEN` (read as v1, as the
 * endpoint node does), `…/{v1|v2}/TOKEN` (a proxy in front that strips `/wpush`), with or without
 * scheme and host, or the bare token. Query and fragment are ignored.
 */
const parseEndpointArg = (input: string): Result.Result<EndpointRef, string> => {
  const text = input.trim()
  let path: string
  if (text.includes("://")) {
    if (!URL.canParse(text)) return Result.fail(`not a URL: ${JSON.stringify(input)}`)
    const url = new URL(text)
    if (url.protocol !== "http:" && url.protocol !== "https:") return Result.fail(`not an http(s) URL: ${JSON.stringify(input)}`)
    path = url.pathname
  } else {
    path = text.replace(/[?#].*$/s, "")
  }
  let segments: Array<string>
  try {
    segments = path.split("/").filter((s) => s !== "").map(decodeURIComponent)
  } catch {
    return Result.fail(`not a URL path: ${JSON.stringify(input)}`)
  }
  const at = segments.lastIndexOf("wpush")
  const rest = at >= 0 ? segments.slice(at + 1) : segments
  let ref: EndpointRef | undefined
  const [first, second] = rest
  if (rest.length === 2 && first !== undefined && second !== undefined && /^v\d+$/.test(first)) {
    if (first !== "v1" && first !== "v2") {
      return Result.fail(`API version ${first} is not v1 or v2 (the endpoint node answers 404 to it)`)
    }
    ref = { token: second, pathVersion: first }
  } else if (rest.length === 1 && first !== undefined) {
    ref = { token: first, pathVersion: at >= 0 ? "v1" : undefined }
  } else if (at < 0 && rest.length > 2) {
    const [v, token] = rest.slice(-2)
    if ((v === "v1" || v === "v2") && token !== undefined) ref = { token, pathVersion: v }
  }
  if (ref === undefined) return Result.fail(`not an endpoint URL: ${JSON.stringify(input)}; ${FORMS}`)
  if (!TOKEN.test(ref.token)) return Result.fail(`not an endpoint token (URL-safe base64 expected): ${JSON.stringify(ref.token)}`)
  return Result.succeed(ref)
}

// ── the token ────────────────────────────────────────────────────────────────────────────────────

interface OpenedToken extends EndpointToken {
  readonly version: EndpointVersion
  /** 1-based position of the key that opened it in the configured list. */
  readonly keyNumber: number
}

/**
 * Open the token with each key in turn, as v1 (32 bytes) or v2 (64 bytes) by its length: which
 * key made it matters when keys are rotated. Fails with the Fernet reason when no key opens it,
 * or `bad-length` when one does but the plaintext is not an endpoint's.
 */
const openToken = (
  keys: ReadonlyArray<string>,
  token: string
): Result.Result<OpenedToken, FernetErrorReason | "bad-length" | "bad-key"> => {
  let failure: FernetErrorReason | "bad-length" = "bad-signature"
  for (const [index, key] of keys.entries()) {
    const ring = makeKeyRing([key])
    if (Result.isFailure(ring)) return Result.fail("bad-key")
    for (const version of ["v1", "v2"] as const) {
      const opened = parseEndpointToken(ring.success, version, token)
      if (Result.isSuccess(opened)) return Result.succeed({ ...opened.success, version, keyNumber: index + 1 })
      const reason = opened.failure.reason
      if (reason === "bad-length") failure = "bad-length"
      else if (reason !== "bad-signature") return Result.fail(reason)
      else break
    }
  }
  return Result.fail(failure)
}

const reasonText = (reason: FernetErrorReason | "bad-length" | "bad-key", keys: number): string => {
  const ofKeys = `${keys === 1 ? "the configured crypto key" : `any of the ${keys} configured crypto keys`}`
  switch (reason) {
    case "bad-signature":
      return `the token does not decrypt with ${ofKeys} (bad signature): it was made with another key, or altered`
    case "bad-length":
      return "the token decrypts, but not to an endpoint (neither 32 nor 64 bytes): it is some other Fernet token (a message id?)"
    case "bad-key":
      return "a configured crypto key is not a Fernet key"
    default:
      return `the token is not an endpoint token (${reason}): truncated, or not made by autopush`
  }
}

// ── storage ──────────────────────────────────────────────────────────────────────────────────────

interface MessageCounts {
  readonly total: number
  readonly topic: number
  readonly timestamp: number
  /** Of the total, those for the endpoint's channel. */
  readonly channel: number
}

interface Diagnosis {
  readonly endpoint: {
    readonly pathVersion: EndpointVersion | null
    readonly tokenVersion: EndpointVersion
    readonly cryptoKey: number
    readonly cryptoKeys: number
    /** Hex sha256 of the VAPID public key a v2 endpoint is bound to. */
    readonly vapidKeyHash: string | null
    /** With `--vapid-key`: whether it is the key the endpoint is bound to. */
    readonly vapidKeyMatches?: boolean
  }
  readonly uaid: string
  readonly chid: string
  readonly router: {
    readonly routerType: string
    readonly nodeId: string | null
    readonly connectedAt: number
    readonly connectedAtIso: string
    readonly lastConnect: number | null
    readonly currentMonth: string | null
    readonly currentMonthActive: boolean
    readonly recordVersion: number | null
    readonly routerDataFields: ReadonlyArray<string>
  } | null
  readonly messageTable: { readonly name: string; readonly exists: boolean } | null
  readonly channelRegistered: boolean | null
  readonly messages: MessageCounts | null
  /** With `--authorization`: the sender's VAPID key, and what its pushes would be warned of (`Autopush-Warning`). */
  readonly sender?: { readonly vapidKey: string | null; readonly warnings: ReadonlyArray<SenderWarning> }
  /** Why the endpoint node would not accept a message for this endpoint; empty when it would. */
  readonly problems: ReadonlyArray<string>
}

/** Every unexpired message of a user in one table. */
const allMessages = (uaid: string, table: string) =>
  Effect.gen(function*() {
    const storage = yield* Storage
    const messages: Array<Notification> = [...(yield* storage.fetchTopicMessages(uaid, table, 100_000))]
    let after: number | undefined
    for (;;) {
      const page = yield* storage.fetchTimestampMessages(uaid, table, after, 500)
      messages.push(...page.messages)
      if (page.lastSortKey === undefined || page.lastSortKey === after) break
      after = page.lastSortKey
    }
    return messages
  })

const routerOf = (user: UserRecord, active: ReadonlyArray<string>): NonNullable<Diagnosis["router"]> => ({
  routerType: user.routerType,
  nodeId: user.nodeId ?? null,
  connectedAt: user.connectedAt,
  connectedAtIso: new Date(user.connectedAt).toISOString(),
  lastConnect: user.lastConnect ?? null,
  currentMonth: user.currentMonth ?? null,
  currentMonthActive: user.currentMonth !== undefined && active.includes(user.currentMonth),
  recordVersion: user.recordVersion ?? null,
  routerDataFields: Object.keys(user.routerData).sort()
})

/** A sender's VAPID header checked for the endpoint's origin, as the endpoint node checks it. */
type SenderCheck =
  | { readonly ok: true; readonly rawKey: Buffer | undefined; readonly warnings: ReadonlyArray<SenderWarning> }
  | { readonly ok: false; readonly problem: string }

const checkSender = (authorization: string, draftKey: string | undefined, origin: string, nowSeconds: number): Effect.Effect<SenderCheck> => {
  const headers = { authorization, ...(draftKey === undefined ? {} : { "crypto-key": `p256ecdsa=${draftKey}` }) }
  const parsed = parseVapid(headers)
  if (Result.isFailure(parsed)) return Effect.succeed({ ok: false, problem: `--authorization: ${parsed.failure.message} (the endpoint node answers ${parsed.failure._tag === "InvalidAuth" ? "401, errno 109" : "400, errno 110"})` })
  const credentials = parsed.success
  if (credentials === undefined) return Effect.succeed({ ok: true, rawKey: undefined, warnings: senderWarnings(undefined, undefined) })
  return verifyVapid(credentials, origin, nowSeconds).pipe(
    Effect.match({
      onFailure: (error): SenderCheck => ({ ok: false, problem: `--authorization: ${error.message} (for ${origin}; the endpoint node answers 401, errno 109)` }),
      onSuccess: (vapid): SenderCheck => ({ ok: true, rawKey: vapid.rawKey, warnings: senderWarnings(vapid, "aes128gcm") })
    })
  )
}

const diagnose = (opened: OpenedToken, ref: EndpointRef, keys: number, vapidKey: Buffer | undefined, sender: SenderCheck | undefined) =>
  Effect.gen(function*() {
    const storage = yield* Storage
    const problems: Array<string> = []
    if (sender?.ok === false) problems.push(sender.problem)
    if (ref.pathVersion !== undefined && ref.pathVersion !== opened.version) {
      problems.push(`the URL says ${ref.pathVersion} but the token is ${opened.version}: the endpoint node answers 404 (errno 102)`)
    }
    const vapidKeyMatches = vapidKey === undefined ? undefined : matchesVapidKey(opened, vapidKey)
    if (vapidKeyMatches === false) {
      problems.push(
        opened.keyHash === undefined
          ? "--vapid-key given, but this is a v1 endpoint: it is bound to no key (any VAPID key or none is accepted)"
          : "the endpoint is bound to another VAPID key: messages signed with --vapid-key get 401 (errno 109)"
      )
    }
    const endpoint: Diagnosis["endpoint"] = {
      pathVersion: ref.pathVersion ?? null,
      tokenVersion: opened.version,
      cryptoKey: opened.keyNumber,
      cryptoKeys: keys,
      vapidKeyHash: opened.keyHash?.toString("hex") ?? null,
      ...(vapidKeyMatches !== undefined ? { vapidKeyMatches } : {})
    }
    const senderPart = sender?.ok === true
      ? { sender: { vapidKey: sender.rawKey?.toString("base64url") ?? null, warnings: sender.warnings } }
      : {}
    const base = { endpoint, uaid: opened.uaid, chid: opened.channelId, ...senderPart }
    const user = yield* storage.getUser(opened.uaid)
    if (user === undefined) {
      problems.push("no router record for this uaid: the user was dropped or never registered; the endpoint node answers 410 (errno 106)")
      return { ...base, router: null, messageTable: null, channelRegistered: null, messages: null, problems } satisfies Diagnosis
    }
    const router = routerOf(user, yield* storage.activeMessageTables)
    if (user.routerType !== "webpush") {
      problems.push(`router_type is ${user.routerType}: not a WebPush user, and this server routes to no bridge`)
    }
    const table = user.currentMonth
    if (table === undefined) {
      problems.push("the router record names no message table (current_month): the endpoint node drops the user (410)")
      return { ...base, router, messageTable: null, channelRegistered: null, messages: null, problems } satisfies Diagnosis
    }
    if (!router.currentMonthActive) {
      problems.push(`current_month ${table} is not an active message table: the endpoint node drops the user (410, errno 106)`)
    }
    const missing = <A>(self: Effect.Effect<A, StorageError, Storage>) =>
      self.pipe(Effect.catchIf(hasReason("MissingTable"), () => Effect.succeed(undefined)))
    const channels = yield* missing(storage.getChannels(opened.uaid, table))
    if (channels === undefined) {
      problems.push(`the message table ${table} does not exist`)
      return { ...base, router, messageTable: { name: table, exists: false }, channelRegistered: null, messages: null, problems } satisfies Diagnosis
    }
    const channelRegistered = channels.has(opened.channelId)
    if (!channelRegistered) problems.push("the channel is not registered (unsubscribed, or never): the endpoint node answers 410 (errno 106)")
    const messages = (yield* missing(allMessages(opened.uaid, table))) ?? []
    const topic = messages.filter((m) => m.topic !== undefined).length
    return {
      ...base,
      router,
      messageTable: { name: table, exists: true },
      channelRegistered,
      messages: {
        total: messages.length,
        topic,
        timestamp: messages.length - topic,
        channel: messages.filter((m) => m.channelId === opened.channelId).length
      },
      problems
    } satisfies Diagnosis
  })

// ── output ───────────────────────────────────────────────────────────────────────────────────────

const lastConnectText = (value: number): string => {
  const s = String(value)
  if (!/^\d{12}$/.test(s)) return String(value)
  return `${value} (${s.slice(0, 4)}-${s.slice(4, 6)}, hour ${s.slice(6, 8)} UTC, spread ${Number(s.slice(8))})`
}

/** The diagnosis as aligned `name: value` lines. */
const renderDiagnosis = (d: Diagnosis, nowMs: number): string => {
  const lines: Array<string> = []
  const row = (name: string, value: string) => lines.push(`${`${name}:`.padEnd(18)} ${value}`)
  row("uaid", d.uaid)
  row("chid", d.chid)
  const e = d.endpoint
  row(
    "endpoint",
    `${e.tokenVersion}${e.pathVersion === null ? "" : e.pathVersion === e.tokenVersion ? "" : ` (URL path says ${e.pathVersion})`}, ` +
      (e.vapidKeyHash === null
        ? "not bound to a VAPID key"
        : `bound to a VAPID key (sha256 ${e.vapidKeyHash.slice(0, 16)}…)${e.vapidKeyMatches === undefined ? "" : e.vapidKeyMatches ? ", --vapid-key matches" : ", --vapid-key does NOT match"}`)
  )
  row("crypto key", `#${e.cryptoKey} of ${e.cryptoKeys}${e.cryptoKey > 1 ? " (an older key: new endpoints use #1)" : ""}`)
  const r = d.router
  if (r === null) row("router record", "none")
  else {
    lines.push("router record:")
    row("  router_type", r.routerType)
    row("  node_id", r.nodeId ?? "none (not connected)")
    const ago = Math.max(0, Math.round((nowMs - r.connectedAt) / 60_000))
    row("  connected_at", `${r.connectedAtIso} (${r.connectedAt}; ${ago < 120 ? `${ago} min` : ago < 2880 ? `${Math.round(ago / 60)} h` : `${Math.round(ago / 1440)} days`} ago)`)
    row("  last_connect", r.lastConnect === null ? "none" : lastConnectText(r.lastConnect))
    row("  current_month", r.currentMonth === null ? "none" : `${r.currentMonth} (${r.currentMonthActive ? "active" : "NOT active"})`)
    row("  record_version", r.recordVersion === null ? "none" : String(r.recordVersion))
    if (r.routerDataFields.length > 0) row("  router_data", `fields ${r.routerDataFields.join(", ")} (values not shown)`)
  }
  if (d.messageTable !== null && !d.messageTable.exists) row("message table", `${d.messageTable.name} does not exist`)
  if (d.channelRegistered !== null) row("channel", d.channelRegistered ? `registered in ${d.messageTable?.name}` : "NOT registered")
  if (d.messages !== null) {
    const m = d.messages
    row("stored messages", `${m.total} unexpired (${m.topic} topic, ${m.timestamp} timestamp); ${m.channel} for this channel`)
  }
  if (d.sender !== undefined) {
    const key = d.sender.vapidKey === null ? "unsigned" : `VAPID key ${d.sender.vapidKey.slice(0, 16)}…`
    row("sender", d.sender.warnings.length === 0 ? `${key}: no warnings` : `${key}: ${d.sender.warnings.length} warning(s) (Autopush-Warning)`)
    for (const warning of d.sender.warnings) lines.push(`  - ${warning}: ${SENDER_WARNING_TEXT[warning]}`)
  }
  if (d.problems.length === 0) row("verdict", "ok: the endpoint node accepts messages for this endpoint")
  else {
    row("verdict", "NOT deliverable")
    for (const problem of d.problems) lines.push(`  - ${problem}`)
  }
  return lines.join("\n")
}

// ── the tool ─────────────────────────────────────────────────────────────────────────────────────

const OPTIONS: ReadonlyArray<OptionName> = [
  "crypto_key",
  "storage_endpoint",
  "aws_region",
  "router_tablename",
  "message_tablename",
  "no_table_rotation",
  "data_dir"
]

export const diagnosticHelp = (): string =>
  [
    "Usage: endpoint-diagnostic [options] URL",
    "",
    "Decrypts a push endpoint URL with the configured crypto keys and reads storage (nothing is",
    "written): prints the uaid and channel id, the endpoint version and, for v2, the hash of the",
    "VAPID key it is bound to, which crypto key made it, the user's router record (node_id,",
    "connected_at, last_connect, current_month, router_type), whether the channel is registered,",
    "the unexpired stored messages of the user, and whether the endpoint node would accept a",
    "message for it (and if not, why).",
    "",
    "URL forms: https://HOST/wpush/v1/TOKEN, https://HOST/wpush/v2/TOKEN, https://HOST/wpush/TOKEN",
    "(read as v1, like the endpoint node does), the path alone, or the bare TOKEN.",
    "",
    "Options:",
    usageRow("--json", "print the diagnosis as one JSON object"),
    usageRow("--vapid-key KEY", "also check whether a v2 endpoint is bound to this VAPID public key"),
    usageRow("", "(base64url of the raw P-256 point, as in the VAPID header's k=)"),
    usageRow("--authorization HEADER", "check a sender's Authorization header (vapid t=JWT, k=KEY; or WebPush JWT"),
    usageRow("", "with --vapid-key KEY) as the endpoint node would for this endpoint's origin, and"),
    usageRow("", "print the sender warnings its pushes would get (Autopush-Warning)"),
    "",
    "Exit status: 0 the endpoint is deliverable; 1 it is not (the reasons are printed), the token",
    "does not decrypt, or storage failed; 2 bad arguments or configuration.",
    "",
    "The crypto keys are crypto_key (all of them are tried); with embedded storage and no crypto_key",
    "configured, those the all-in-one generated in data_dir/secrets.json.",
    "",
    ...settingsHelp(OPTIONS)
  ].join("\n")

/** The configured keys, or (embedded storage only) those the all-in-one generated and kept. */
const cryptoKeys = (settings: Settings): Effect.Effect<ReadonlyArray<string>, ConfigError> =>
  Effect.gen(function*() {
    if (settings.cryptoKey.length > 0 || settings.storageEndpoint !== undefined) {
      yield* requireSecrets(settings, ["crypto_key"])
      return settings.cryptoKey
    }
    const path = embeddedSecretsFile(settings)
    const stored = yield* readEmbeddedSecrets(path).pipe(Effect.mapError((error) => new ConfigError({ message: error.message })))
    if (stored !== undefined) return stored.crypto_key
    return yield* requireSecrets(settings, ["crypto_key"]).pipe(
      Effect.mapError((e) => new ConfigError({ message: `${e.message} (and ${path} holds no generated key)` })),
      Effect.as([])
    )
  })

export const endpointDiagnostic = (argv: ReadonlyArray<string>): Effect.Effect<void, ToolError> =>
  Effect.gen(function*() {
    const args = yield* splitArgs(argv, { "--json": "boolean", "--vapid-key": "value", "--authorization": "value" })
    if (args.help) return yield* new HelpRequested({ text: diagnosticHelp() })
    const [url, extra] = args.positional
    if (url === undefined) return yield* new UsageError({ message: "an endpoint URL is required" })
    if (extra !== undefined) return yield* new UsageError({ message: `one URL at a time (unexpected ${JSON.stringify(extra)})` })
    const parsed = parseEndpointArg(url)
    if (Result.isFailure(parsed)) return yield* new UsageError({ message: parsed.failure })
    const ref = parsed.success
    const vapidText = args.flags.get("--vapid-key")
    const vapidKey = vapidText === undefined ? undefined : decodeVapidPublicKey(vapidText)
    if (vapidText !== undefined && vapidKey === undefined) {
      return yield* new UsageError({ message: "--vapid-key: not a P-256 public key (65 bytes, base64url)" })
    }
    const settings = yield* toolSettings(args.config)
    const keys = yield* cryptoKeys(settings)
    const opened = openToken(keys, ref.token)
    if (Result.isFailure(opened)) return yield* new ToolFailure({ message: reasonText(opened.failure, keys.length) })
    const authorization = args.flags.get("--authorization")
    // The origin a JWT's `aud` must name: the URL's, when it has one, else the configured endpoint_url's.
    const origin = /^https?:\/\//i.test(url.trim()) && URL.canParse(url.trim()) ? new URL(url.trim()).origin : endpointOrigin(settings.endpointUrl)
    const sender = authorization === undefined
      ? undefined
      : yield* checkSender(authorization, vapidText, origin, Math.floor((yield* Clock.currentTimeMillis) / 1000))
    // A v2 endpoint takes only its own key: the header's key is checked against it too.
    const boundKey = vapidKey ?? (sender?.ok === true && opened.success.keyHash !== undefined ? sender.rawKey : undefined)
    const diagnosis = yield* diagnose(opened.success, ref, keys.length, boundKey, sender).pipe(
      Effect.provide(toolStorageLayer(settings)),
      Effect.catchTag("StorageError", (error) => Effect.fail(new ToolFailure({ message: describeStorageError(error, settings) })))
    )
    const now = yield* Clock.currentTimeMillis
    yield* Console.log(
      args.flags.has("--json")
        ? JSON.stringify({ storage: storageDescription(settings), ...diagnosis })
        : `${"storage:".padEnd(18)} ${storageDescription(settings)}\n${renderDiagnosis(diagnosis, now)}`
    )
    if (diagnosis.problems.length > 0) return yield* new NegativeResult()
  })
