/**
 * The push client on the command line, as a user runs it: `push listen` and `push send` as child
 * processes against the all-in-one server (a real process on embedded storage). Each push is sent
 * by `send` (web-push), decrypted by `listen` (http_ece) and acked: aes128gcm and aesgcm, with and
 * without VAPID, to a v1 and a VAPID-bound v2 endpoint; a push sent while the listener is away
 * arrives when it comes back with its `--state`, and once acked it is not sent again; a listener
 * connects again by itself after a server restart.
 */
import { afterAll, assert, beforeAll, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { pushCli } from "../../src/client/cli.ts"
import { type Deployment, startAllInOne } from "../e2e/servers.ts"
import { liveAgainst, type Listener, type Run, runPush, startListen } from "./harness.ts"

const scratch = mkdtempSync(join(tmpdir(), "autopush-push-cli-"))
const push = (args: ReadonlyArray<string>, input?: string, timeoutMs?: number): Promise<Run> => runPush(scratch, args, input, timeoutMs)
const listen = (args: ReadonlyArray<string>): Promise<Listener> => startListen(scratch, args)

/** Until `check` holds (the listener's messages arrive in their own time), at most 5 s. */
const eventually = async (check: () => boolean): Promise<void> => {
  for (const deadline = Date.now() + 5_000; !check(); await new Promise((r) => setTimeout(r, 20))) {
    if (Date.now() > deadline) throw new Error("not within 5 s")
  }
}

describe("push listen / send / vapid-keys", () => {
  let deployment: Deployment
  let vapidFile: string
  beforeAll(async () => {
    deployment = await startAllInOne()
    const keys = await push(["vapid-keys", "--subject", "mailto:ops@example.com"])
    assert.strictEqual(keys.code, 0, keys.stderr)
    vapidFile = join(scratch, "vapid.json")
    writeFileSync(vapidFile, keys.stdout)
  }, 60_000)
  afterAll(async () => {
    await deployment?.stop()
    rmSync(scratch, { recursive: true, force: true })
  })

  const live = liveAgainst(() => deployment)

  live("vapid-keys prints a P-256 key pair as JSON with the subject", async () => {
    const keys = JSON.parse(readFileSync(vapidFile, "utf8")) as { subject: string; publicKey: string; privateKey: string }
    assert.strictEqual(keys.subject, "mailto:ops@example.com")
    assert.strictEqual(Buffer.from(keys.publicKey, "base64url").length, 65)
    assert.strictEqual(Buffer.from(keys.privateKey, "base64url").length, 32)
  })

  live("a v1 subscription: aes128gcm and aesgcm, with and without VAPID, from an argument, a file and stdin, each decrypted", async () => {
    const listener = await listen(["--server", deployment.wsUrl])
    try {
      assert.match(listener.subscription.endpoint, new RegExp(`^${deployment.endpointUrl}/wpush/v1/`))
      assert.include(listener.stderr(), "npm run push -- send --subscription '")
      const file = join(scratch, "subscription.json")
      writeFileSync(file, listener.subscriptionText)
      const cases = [
        { args: ["--subscription", listener.subscriptionText], input: "", text: "aes128gcm from an argument" },
        { args: ["--subscription", file, "--encoding", "aesgcm"], input: "", text: "aesgcm from a file" },
        { args: ["--vapid", vapidFile, "--ttl", "120", "--topic", "news", "--urgency", "high"], input: listener.subscriptionText, text: "aes128gcm + VAPID from stdin" },
        { args: ["--subscription", "-", "--vapid", vapidFile, "--encoding", "aesgcm"], input: listener.subscriptionText, text: "aesgcm + VAPID ünïcode ✓" }
      ]
      for (const c of cases) {
        const sent = await push(["send", ...c.args, c.text], c.input)
        assert.strictEqual(sent.code, 0, sent.stdout + sent.stderr)
        const [status, location] = sent.stdout.trim().split("\n")
        assert.strictEqual(status, "201 Created")
        assert.match(location!, new RegExp(`^Location: ${deployment.endpointUrl}/m/`))
        assert.strictEqual(await listener.nextPush(), c.text)
      }
      const empty = await push(["send", "--subscription", listener.subscriptionText])
      assert.strictEqual(empty.code, 0, empty.stderr)
      assert.strictEqual(await listener.nextPush(), "", "a push without payload has no text")
      assert.include(listener.stderr(), "push received (aesgcm, ")
      assert.include(listener.stderr(), "push received (no payload), acked 100\n")
      // What `listen > FILE` saves is still a subscription after the pushes: they are reported on stderr.
      assert.deepStrictEqual(listener.lines(), [listener.subscriptionText], "stdout holds the subscription only")
      const saved = join(scratch, "listen-stdout.json")
      writeFileSync(saved, listener.lines().join("\n") + "\n")
      const again = await push(["send", "--subscription", saved, "to the saved stdout"])
      assert.strictEqual(again.code, 0, again.stdout + again.stderr)
      assert.strictEqual(await listener.nextPush(), "to the saved stdout")
    } finally {
      await listener.stop()
    }
  })

  live("a v2 subscription (listen --vapid-key) takes pushes signed with its key and refuses others with 401", async () => {
    const listener = await listen(["--server", deployment.wsUrl, "--vapid-key", vapidFile])
    try {
      assert.match(listener.subscription.endpoint, /\/wpush\/v2\//)
      assert.include(listener.stderr(), `--vapid '${vapidFile}'`, "the hint names the key file given")
      for (const encoding of ["aes128gcm", "aesgcm"]) {
        const sent = await push(["send", "--subscription", listener.subscriptionText, "--vapid", vapidFile, "--encoding", encoding, `signed ${encoding}`])
        assert.strictEqual(sent.code, 0, sent.stdout + sent.stderr)
        assert.strictEqual(await listener.nextPush(), `signed ${encoding}`)
        // The key file's subject is a real contact: only the drafts (aesgcm, signed as the draft's
        // WebPush scheme by web-push) are warned of, which Apple's service refuses.
        if (encoding === "aesgcm") assert.match(sent.stderr, /^Autopush-Warning: vapid-draft-scheme "[^"]+", aesgcm "/m, sent.stderr)
        else assert.notInclude(sent.stderr, "Autopush-Warning")
      }
      const unsigned = await push(["send", "--subscription", listener.subscriptionText, "not signed"])
      assert.strictEqual(unsigned.code, 1)
      assert.match(unsigned.stdout, /^401 Unauthorized\n/)
      assert.strictEqual((JSON.parse(unsigned.stdout.split("\n")[1]!) as { errno: number }).errno, 109)
      assert.include(unsigned.stderr, "push: the push was not accepted (401)")
    } finally {
      await listener.stop()
    }
  })

  live("listen --min-urgency high: less urgent pushes wait on the server (201), then come on the next run without the minimum", async () => {
    const state = join(scratch, "urgency-state.json")
    const listener = await listen(["--server", deployment.wsUrl, "--state", state, "--min-urgency", "high"])
    try {
      await eventually(() => listener.stderr().includes("only pushes at least as urgent as high come now"))
      for (const [urgency, text] of [["low", "can wait"], ["high", "urgent"]] as const) {
        const sent = await push(["send", "--subscription", listener.subscriptionText, "--urgency", urgency, text])
        assert.strictEqual(sent.code, 0, sent.stdout + sent.stderr)
      }
      assert.strictEqual(await listener.nextPush(), "urgent", "the low one is held")
    } finally {
      await listener.stop()
    }
    const next = await listen(["--server", deployment.wsUrl, "--state", state, "--min-urgency", "very-low"])
    try {
      assert.strictEqual(await next.nextPush(), "can wait")
    } finally {
      await next.stop()
    }
    const bad = await push(["listen", "--min-urgency", "soon"])
    assert.strictEqual(bad.code, 2)
    assert.include(bad.stderr, "--min-urgency must be one of very-low, low, normal, high")
  })

  live("a Matrix gateway push (plaintext by design) is reported as plaintext with its JSON, and acked 100", async () => {
    const listener = await listen(["--server", deployment.wsUrl])
    try {
      const notification = { event_id: "$event", room_id: "!room:example.com", counts: { unread: 1 }, prio: "high" }
      const res = await fetch(`${deployment.endpointUrl}/_matrix/push/v1/notify`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ notification: { ...notification, devices: [{ app_id: "im.example", pushkey: listener.subscription.endpoint }] } })
      })
      assert.deepStrictEqual([res.status, await res.json()], [200, { rejected: [] }])
      const text = await listener.nextPush()
      assert.deepStrictEqual(JSON.parse(text), { notification })
      assert.match(listener.stderr(), /^push received \(plaintext, \d+ chars: not encrypted, as a push gateway such as Matrix's sends it\), acked 100: \{/m)
      assert.notInclude(listener.stderr(), "not decrypted")
    } finally {
      await listener.stop()
    }
  })

  live("listen --server at an HTTP port says what --server takes", async () => {
    const wrong = await push(["listen", "--server", deployment.endpointUrl.replace("http", "ws")])
    assert.strictEqual(wrong.code, 1)
    assert.include(wrong.stderr, "answered HTTP 200 instead of opening a WebSocket: --server takes the connection node's WebSocket URL")
  })

  live("with --state: a push sent while away arrives on the next run of the same subscription, and once acked never again", async () => {
    const state = join(scratch, "state.json")
    const first = await listen(["--server", deployment.wsUrl, "--state", state])
    await first.stop()
    assert.strictEqual(statSync(state).mode & 0o777, 0o600, "the state file holds the private key")
    const sent = await push(["send", "--subscription", first.subscriptionText, "--ttl", "300", "while you were away"])
    assert.strictEqual(sent.code, 0, sent.stdout + sent.stderr)

    const second = await listen(["--server", deployment.wsUrl, "--state", state])
    try {
      assert.strictEqual(second.subscriptionText, first.subscriptionText)
      assert.include(second.stderr(), "subscription restored")
      assert.strictEqual(await second.nextPush(), "while you were away")
    } finally {
      await second.stop()
    }
    const third = await listen(["--server", deployment.wsUrl, "--state", state])
    try {
      await new Promise((resolve) => setTimeout(resolve, 1_000))
      assert.notInclude(third.stderr(), "push received", "the acked push is not sent again")
    } finally {
      await third.stop()
    }
  })

  live("listen --state FILE with another --vapid-key is refused (exit 2, FILE untouched); without --vapid-key FILE's subscription is used as it is", async () => {
    const state = join(scratch, "vapid-state.json")
    const first = await listen(["--server", deployment.wsUrl, "--state", state])
    await first.stop()
    const kept = readFileSync(state, "utf8")
    const refused = await push(["listen", "--server", deployment.wsUrl, "--state", state, "--vapid-key", vapidFile], "", 15_000)
    assert.strictEqual(refused.code, 2, refused.stdout + refused.stderr)
    assert.strictEqual(refused.stdout, "", "no subscription printed")
    assert.match(refused.stderr, new RegExp(`^push: the state file ${state} keeps a subscription made without a VAPID key; --vapid-key would replace it`))
    assert.include(refused.stderr, "Run without --vapid-key to use that subscription, or give another --state file for a new one")
    assert.strictEqual(readFileSync(state, "utf8"), kept, "the state file is left as it was")

    // Made with a VAPID key: kept with it, another key refused, no key given = the kept one.
    const bound = join(scratch, "vapid-bound-state.json")
    const v2 = await listen(["--server", deployment.wsUrl, "--state", bound, "--vapid-key", vapidFile])
    await v2.stop()
    assert.match(v2.subscription.endpoint, /\/wpush\/v2\//)
    const other = await push(["vapid-keys"])
    const otherKey = (JSON.parse(other.stdout) as { publicKey: string }).publicKey
    const changed = await push(["listen", "--server", deployment.wsUrl, "--state", bound, "--vapid-key", otherKey], "", 15_000)
    assert.strictEqual(changed.code, 2, changed.stdout + changed.stderr)
    assert.include(changed.stderr, `the state file ${bound} keeps a subscription made with another VAPID key (`)
    const again = await listen(["--server", deployment.wsUrl, "--state", bound])
    try {
      assert.strictEqual(again.subscriptionText, v2.subscriptionText)
      assert.include(again.stderr(), "subscription restored")
    } finally {
      await again.stop()
    }
  })

  live("listen connects again after a server restart, with the same subscription", async () => {
    const listener = await listen(["--server", deployment.wsUrl])
    try {
      await deployment.restart()
      const sent = await push(["send", "--subscription", listener.subscriptionText, "after the restart"])
      assert.strictEqual(sent.code, 0, sent.stdout + sent.stderr)
      assert.strictEqual(await listener.nextPush(20_000), "after the restart")
      assert.match(listener.stderr(), /connecting again in \d+\.\d s/)
      assert.deepStrictEqual(listener.lines(), [listener.subscriptionText], "the subscription is printed once")
    } finally {
      await listener.stop()
    }
  })

  // The command line's refusals, in this process (exit codes are runTool's: UsageError 2, ToolFailure 1).
  it.effect("bad arguments are usage errors; an unreachable server is a failure; --help", () =>
    Effect.gen(function*() {
      const refusal = (argv: ReadonlyArray<string>) => Effect.flip(pushCli(argv))
      const badEncoding = yield* refusal(["send", "--subscription", '{"endpoint":"http://127.0.0.1:1/wpush/v1/x","keys":{"p256dh":"x","auth":"y"}}', "--encoding", "aes256"])
      assert.strictEqual(badEncoding._tag, "UsageError")
      assert.include(badEncoding.message, "--encoding must be one of aes128gcm, aesgcm")
      const notJson = yield* refusal(["send", "--subscription", join(scratch, "missing.json")])
      assert.strictEqual(notJson._tag, "UsageError")
      assert.include(notJson.message, "cannot read the subscription from")
      const badTtl = yield* refusal(["send", "--ttl", "soon"])
      assert.strictEqual(badTtl._tag, "UsageError")
      assert.include(badTtl.message, "--ttl")
      const wrongFlag = yield* refusal(["listen", "--ttl", "5"])
      assert.strictEqual(wrongFlag.message, "listen does not take --ttl")
      const unknown = yield* refusal(["subscribe"])
      assert.strictEqual(unknown.message, 'unknown command "subscribe"')
      const down = yield* refusal(["listen", "--server", "ws://127.0.0.1:1/"])
      assert.strictEqual(down._tag, "ToolFailure")
      assert.include(down.message, "cannot connect to ws://127.0.0.1:1/")
      const help = yield* refusal(["--help"])
      assert.strictEqual(help._tag, "HelpRequested")
      assert.include(help._tag === "HelpRequested" ? help.text : "", "npm run push -- listen")
    }))

  live("a usage error exits 2 with one line pointing to --help (a refused push exits 1: above)", async () => {
    const usage = await push(["send", "--encoding", "aes256"], "{}")
    assert.strictEqual(usage.code, 2)
    assert.strictEqual(usage.stderr, 'push: --encoding must be one of aes128gcm, aesgcm, not "aes256" (see push --help)\n')
  })
})
