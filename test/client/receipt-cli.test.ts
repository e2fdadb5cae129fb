/**
 * `push send --receipt` as a user runs it, against the all-in-one server: a push to a `push listen`
 * client is acknowledged (exit 0); a TTL 0 push to a client that is away expires at once (exit 3);
 * a push waiting for a client that is away has no receipt within --receipt-wait (exit 4, and where
 * the message is); a subscription that expires while the CLI waits (made to, in storage: waiting
 * renews it) is explained (exit 1).
 */
import { afterAll, assert, beforeAll, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { pushCli } from "../../src/client/cli.ts"
import { expireReceiptSubscriptions } from "../e2e/receiptStore.ts"
import { type Deployment, startAllInOne } from "../e2e/servers.ts"
import { liveAgainst, type Listener, type Run, runPush, startListen } from "./harness.ts"

const scratch = mkdtempSync(join(tmpdir(), "autopush-receipt-cli-"))
const push = (args: ReadonlyArray<string>): Promise<Run> => runPush(scratch, args)

/** What `send --receipt` printed on stdout: status, Location, the receipt line and the document. */
const printed = (run: Run) => {
  const [status, location, line, document, ...rest] = run.stdout.trimEnd().split("\n")
  assert.deepStrictEqual(rest, [], run.stdout)
  return { status, location: location?.replace(/^Location: /, ""), line, document: JSON.parse(document ?? "null") as Record<string, unknown> | null }
}

describe("push send --receipt", () => {
  let deployment: Deployment
  beforeAll(async () => {
    deployment = await startAllInOne()
  }, 60_000)
  afterAll(async () => {
    await deployment?.stop()
    rmSync(scratch, { recursive: true, force: true })
  })

  const live = liveAgainst(() => deployment)

  /** A `push listen` client that is away: its subscription, the listener stopped. */
  const away = async (): Promise<Listener> => {
    const listener = await startListen(scratch, ["--server", deployment.wsUrl])
    await listener.stop()
    return listener
  }

  live("a listening client acknowledges it: 202, the message, the receipt in one line and as JSON, exit 0", async () => {
    const listener = await startListen(scratch, ["--server", deployment.wsUrl])
    try {
      const sent = await push(["send", "--subscription", listener.subscriptionText, "--receipt", "with a receipt"])
      assert.strictEqual(sent.code, 0, sent.stdout + sent.stderr)
      const { status, location, line, document } = printed(sent)
      assert.strictEqual(status, "202 Accepted")
      assert.match(location ?? "", new RegExp(`^${deployment.endpointUrl}/m/`))
      assert.match(line ?? "", /^Receipt: acknowledged — delivered \d+ ms, acknowledged \d+ ms after the push \(code 100\)$/)
      assert.deepStrictEqual([document?.["message"], document?.["state"], document?.["status"], document?.["code"]], [location, "acknowledged", 410, 100])
      assert.match(sent.stderr, new RegExp(`waiting up to 60 s for the receipt \\(at ${deployment.endpointUrl}/receipts/`))
      assert.strictEqual(await listener.nextPush(), "with a receipt")
    } finally {
      await listener.stop()
    }
  })

  live("TTL 0 to a client that is away: expired at once, exit 3", async () => {
    const listener = await away()
    const sent = await push(["send", "--subscription", listener.subscriptionText, "--ttl", "0", "--receipt", "nobody there"])
    assert.strictEqual(sent.code, 3, sent.stdout + sent.stderr)
    const { status, line, document } = printed(sent)
    assert.strictEqual(status, "202 Accepted")
    assert.match(line ?? "", /^Receipt: expired — expired \d+ ms after the push, never delivered$/)
    assert.deepStrictEqual([document?.["state"], document?.["status"]], ["expired", 200])
  })

  live("no receipt within --receipt-wait: exit 4, and the line says where the message is (stored)", async () => {
    const listener = await away()
    const sent = await push(["send", "--subscription", listener.subscriptionText, "--ttl", "300", "--receipt", "--receipt-wait", "1"])
    assert.strictEqual(sent.code, 4, sent.stdout + sent.stderr)
    const { line, document } = printed(sent)
    assert.match(line ?? "", /^Receipt: none within 1 s; the message is stored — stored \d+ ms after the push$/)
    assert.strictEqual(document?.["state"], "stored")
  })

  live("the receipt subscription expires while it waits (404, errno 118): explained, exit 1", async () => {
    const listener = await away()
    const sending = push(["send", "--subscription", listener.subscriptionText, "--ttl", "300", "--receipt", "--receipt-wait", "30"])
    await new Promise((resolve) => setTimeout(resolve, 2_000))
    assert.isAtLeast(await expireReceiptSubscriptions(deployment), 1)
    const sent = await sending
    assert.strictEqual(sent.code, 1, sent.stdout + sent.stderr)
    assert.match(sent.stderr, /push: the receipt subscription http:\S+ is gone \(404, errno 118\): it expired, so no receipt will come/)
  })

  it.effect("--receipt-wait without --receipt, or not a number, is a usage error", () =>
    Effect.gen(function*() {
      const alone = yield* Effect.flip(pushCli(["send", "--receipt-wait", "5"]))
      assert.deepStrictEqual([alone._tag, alone.message], ["UsageError", "--receipt-wait goes with --receipt"])
      const soon = yield* Effect.flip(pushCli(["send", "--receipt", "--receipt-wait", "soon"]))
      assert.strictEqual(soon._tag, "UsageError")
      assert.include(soon.message, "--receipt-wait")
    }))
})
