/**
 * `push listen | send | vapid-keys`: the command line of the push client (arguments, help, where
 * the subscription and VAPID keys come from). Exit codes as the other tools: 0 done, 1 failed
 * (refused push, lost connection), 2 bad arguments; `send --receipt` adds 3 (the receipt's outcome
 * is not acknowledged) and 4 (no receipt in time).
 */
import { existsSync } from "node:fs"
import { readFile } from "node:fs/promises"
import { text as readStream } from "node:stream/consumers"
import * as Effect from "effect/Effect"
import type { VapidDetails } from "web-push"
import { HelpRequested } from "../config/index.ts"
import { intFlag, type SplitArgs, splitArgs, type ToolError, type ToolFlags, usageRow, UsageError } from "../tools/cli.ts"
import { listen } from "./listen.ts"
import { URGENCIES } from "../domain/notification.ts"
import { followReceipt, RECEIPT_EXIT, subscribeReceipts } from "./receipt.ts"
import { type Encoding, parseSubscription, report, send, vapidKeys } from "./send.ts"

const DEFAULT_SERVER = "ws://localhost:8080/"
const DEFAULT_SUBJECT = "mailto:admin@localhost"
const DEFAULT_RECEIPT_WAIT = 60

const HELP = [
  "push: a Web Push client for trying the service.",
  "",
  "Usage:",
  "  npm run push -- listen [--server URL] [--vapid-key KEY|FILE] [--state FILE] [--count N] [--min-urgency U]",
  "  npm run push -- send [--subscription JSON|FILE|-] [options] [--receipt [--receipt-wait N]] [TEXT]",
  "  npm run push -- vapid-keys [--subject mailto:…] > vapid.json",
  "",
  "listen: connect, register and print the subscription JSON, the only line on stdout (listen > sub.json",
  "saves a subscription send takes); then report every push on stderr, with its text decrypted (or as",
  "it came: a push gateway's plaintext, such as Matrix's), and acknowledge it.",
  usageRow("--server URL", `the connection node's WebSocket (default ${DEFAULT_SERVER})`),
  usageRow("--vapid-key KEY|FILE", "register with this VAPID public key (or vapid-keys' JSON file): only pushes signed with it are accepted"),
  usageRow("--state FILE", "keep uaid, channel and keys in FILE (mode 0600): the same subscription on the next run,"),
  usageRow("", "with the VAPID key it was made with (another --vapid-key is refused: use another FILE)"),
  usageRow("--count N", "exit after N pushes"),
  usageRow("--min-urgency U", "only pushes at least this urgent (very-low, low, normal, high); the others wait on the server"),
  "",
  "send: encrypt TEXT for the subscription and POST it to its endpoint; prints the status line and",
  "Location. Without TEXT: a push without payload. Exit 1 when the push is not accepted.",
  usageRow("--subscription JSON|FILE|-", "the subscription: JSON text, a file holding it, or - for stdin (the default);"),
  usageRow("", "of lines of JSON (listen's stdout after it subscribed again), the last"),
  usageRow("--encoding aes128gcm|aesgcm", "content encoding (default aes128gcm)"),
  usageRow("--vapid FILE", "sign with these VAPID keys (vapid-keys' JSON)"),
  usageRow("--vapid-subject S", `VAPID subject, mailto: or https: (default: the file's, else ${DEFAULT_SUBJECT})`),
  usageRow("--ttl N", "seconds the service keeps it for an offline client (default 60)"),
  usageRow("--topic T", "replaces a stored push with the same topic (≤ 32 chars, base64url alphabet)"),
  usageRow("--urgency U", "very-low, low, normal or high"),
  usageRow("--receipt", "ask for a push receipt (RFC 8030): make a receipt subscription at the endpoint's"),
  usageRow("", "service, send with Push-Receipt (202 Accepted), wait for the receipt and print it: one line"),
  usageRow("", "(outcome, times after the push, the client's code), then its JSON. Exit 0 when the client"),
  usageRow("", `acknowledged it, ${RECEIPT_EXIT.notAcknowledged} for another outcome (rejected, expired, deleted, unsubscribed, bridged),`),
  usageRow("", `${RECEIPT_EXIT.none} when none came in time (then the line says where the message is)`),
  usageRow("--receipt-wait N", `seconds to wait for the receipt (default ${DEFAULT_RECEIPT_WAIT})`),
  "",
  "vapid-keys: print a new VAPID key pair as JSON {subject, publicKey, privateKey}.",
  usageRow("--subject S", `the subject to put in it (default ${DEFAULT_SUBJECT})`)
].join("\n")

const FLAGS: ToolFlags = {
  "--server": "value",
  "--vapid-key": "value",
  "--state": "value",
  "--count": "value",
  "--min-urgency": "value",
  "--subscription": "value",
  "--encoding": "value",
  "--vapid": "value",
  "--vapid-subject": "value",
  "--ttl": "value",
  "--topic": "value",
  "--urgency": "value",
  "--receipt": "boolean",
  "--receipt-wait": "value",
  "--subject": "value"
}

const ALLOWED: Readonly<Record<string, ReadonlyArray<string>>> = {
  listen: ["--server", "--vapid-key", "--state", "--count", "--min-urgency"],
  send: ["--subscription", "--encoding", "--vapid", "--vapid-subject", "--ttl", "--topic", "--urgency", "--receipt", "--receipt-wait"],
  "vapid-keys": ["--subject"]
}

const readText = (path: string, what: string): Effect.Effect<string, UsageError> =>
  Effect.tryPromise({
    try: () => (path === "-" ? readStream(process.stdin) : readFile(path, "utf8")),
    catch: (cause) => new UsageError({ message: `cannot read ${what} from ${path === "-" ? "stdin" : path}: ${String(cause)}` })
  })

interface VapidFile {
  readonly subject?: string
  readonly publicKey: string
  readonly privateKey: string
}

const readVapidFile = (path: string): Effect.Effect<VapidFile, UsageError> =>
  Effect.flatMap(readText(path, "the VAPID keys"), (text) => {
    try {
      const keys = JSON.parse(text) as Partial<VapidFile>
      if (typeof keys.publicKey === "string" && typeof keys.privateKey === "string") return Effect.succeed(keys as VapidFile)
    } catch {
      // reported below
    }
    return Effect.fail(new UsageError({ message: `${path} is not a VAPID key file ({"publicKey","privateKey"}; make one with vapid-keys)` }))
  })

const choice = <A extends string>(args: SplitArgs, flag: string, allowed: ReadonlyArray<A>): Effect.Effect<A | undefined, UsageError> => {
  const value = args.flags.get(flag)
  if (value === undefined || (allowed as ReadonlyArray<string>).includes(value)) return Effect.succeed(value as A | undefined)
  return Effect.fail(new UsageError({ message: `${flag} must be one of ${allowed.join(", ")}, not ${JSON.stringify(value)}` }))
}

const runListen = (args: SplitArgs) =>
  Effect.gen(function*() {
    const key = args.flags.get("--vapid-key")
    const vapidFile = key !== undefined && existsSync(key) ? key : undefined
    const vapidKey = vapidFile !== undefined ? (yield* readVapidFile(vapidFile)).publicKey : key
    const count = args.flags.has("--count") ? yield* intFlag(args, "--count", 1) : undefined
    const minUrgency = yield* choice(args, "--min-urgency", URGENCIES)
    yield* listen({ server: args.flags.get("--server") ?? DEFAULT_SERVER, vapidKey, vapidFile, stateFile: args.flags.get("--state"), count, minUrgency })
  })

const runSend = (args: SplitArgs) =>
  Effect.gen(function*() {
    if (args.positional.length > 1) return yield* new UsageError({ message: "send takes one TEXT argument (quote it)" })
    const encoding = (yield* choice<Encoding>(args, "--encoding", ["aes128gcm", "aesgcm"])) ?? "aes128gcm"
    const urgency = yield* choice(args, "--urgency", URGENCIES)
    const ttl = yield* intFlag(args, "--ttl", 0, 60)
    const receiptWait = yield* receiptWaitOf(args)
    const source = args.flags.get("--subscription") ?? "-"
    if (source === "-" && process.stdin.isTTY) {
      return yield* new UsageError({ message: "which subscription? give --subscription JSON|FILE, or pipe it in" })
    }
    const subscription = source.trimStart().startsWith("{")
      ? yield* parseSubscription(source, "--subscription")
      : yield* Effect.flatMap(readText(source, "the subscription"), (text) => parseSubscription(text, source === "-" ? "stdin" : source))
    const vapidPath = args.flags.get("--vapid")
    const vapidFile = vapidPath === undefined ? undefined : yield* readVapidFile(vapidPath)
    const vapid: VapidDetails | undefined = vapidFile === undefined ? undefined : {
      subject: args.flags.get("--vapid-subject") ?? vapidFile.subject ?? DEFAULT_SUBJECT,
      publicKey: vapidFile.publicKey,
      privateKey: vapidFile.privateKey
    }
    const receipt = receiptWait === undefined ? undefined : { url: yield* subscribeReceipts(subscription.endpoint), waitSeconds: receiptWait }
    const result = yield* send({
      subscription,
      payload: args.positional[0],
      encoding,
      vapid,
      ttl,
      topic: args.flags.get("--topic"),
      urgency,
      receipt: receipt?.url
    })
    yield* report(result)
    if (receipt !== undefined) yield* exitWith(yield* followReceipt(receipt.url, result, receipt.waitSeconds))
  })

/** How long `send --receipt` waits for the receipt (s); undefined without --receipt. */
const receiptWaitOf = (args: SplitArgs): Effect.Effect<number | undefined, UsageError> => {
  if (args.flags.has("--receipt")) return intFlag(args, "--receipt-wait", 0, DEFAULT_RECEIPT_WAIT)
  return args.flags.has("--receipt-wait")
    ? Effect.fail(new UsageError({ message: "--receipt-wait goes with --receipt" }))
    : Effect.succeed(undefined)
}

/** An exit code beyond runTool's (which only sets codes for failures): the command ran, its answer is "no". */
const exitWith = (code: number) =>
  Effect.sync(() => {
    if (code !== 0) process.exitCode = code
  })

export const pushCli = (argv: ReadonlyArray<string>): Effect.Effect<void, ToolError> =>
  Effect.gen(function*() {
    const args = yield* splitArgs(argv, FLAGS)
    const [command, ...rest] = args.positional
    if (args.help || command === undefined) {
      if (command === undefined && !args.help) return yield* new UsageError({ message: "a command is needed: listen, send or vapid-keys" })
      return yield* new HelpRequested({ text: HELP })
    }
    const allowed = ALLOWED[command]
    if (allowed === undefined) return yield* new UsageError({ message: `unknown command ${JSON.stringify(command)}` })
    const stray = [...args.flags.keys()].find((flag) => !allowed.includes(flag)) ?? args.config[0]
    if (stray !== undefined) return yield* new UsageError({ message: `${command} does not take ${stray}` })
    const own = { ...args, positional: rest }
    if (command === "listen") {
      if (rest.length > 0) return yield* new UsageError({ message: "listen takes no arguments" })
      return yield* runListen(own)
    }
    if (command === "send") return yield* runSend(own)
    return yield* vapidKeys(args.flags.get("--subject") ?? DEFAULT_SUBJECT)
  })

