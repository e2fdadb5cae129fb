/**
 * A rolling restart of three connection nodes behind HAProxy, under load: 3,000 clients that
 * reconnect after a random delay of up to a second and ack what they receive, pushes at 50/s to
 * random clients and a burst of 1,000 just before each SIGTERM (some reach the stopping node's
 * clients as it closes them), each node sent SIGTERM and started again in turn. Nothing a push was answered
 * 201 for is lost or delivered twice: a closing session takes the acks that arrive until its
 * client answers the close, and saves what is not acked.
 */
import { assert, expect, it } from "vitest"
import { describePostgres } from "../storage/postgresServer.ts"
import { figures, rollingRestart } from "./restart.ts"

const CLIENTS = 3_000

describePostgres("a rolling restart of three connection nodes behind HAProxy", (dsn) => {
  it(`${CLIENTS} clients, pushes flowing: every push answered 201, each delivered once, every client working again`, async () => {
    const result = await rollingRestart({ dsn, clients: CLIENTS, nodes: 3, workers: 1, balancers: 1, pushesPerSecond: 50, burstAtSigterm: 1_000, reconnectDelayMs: 1_000 })
    const f = figures(result)
    const failure = `figures ${JSON.stringify(f)}, statuses ${JSON.stringify(result.pushStatus)}, close codes ${JSON.stringify(result.report.closeCodes)}; the last lines:\n${result.output.slice(-30).join("\n")}`
    expect(result.pushStatus, failure).toEqual({ 201: result.pushesSent })
    assert.strictEqual(f.delivered, f.accepted, failure)
    assert.strictEqual(f.duplicates, 0, failure)
    assert.strictEqual(f.unexpected, 0, failure)
    assert.strictEqual(result.report.working, CLIENTS, failure)
    assert.strictEqual(result.report.uaidChanged, 0, failure)
    // Each node's clients were closed with 1001 (going away) and came back elsewhere.
    assert.isAtLeast(result.report.closeCodes["1001"] ?? 0, CLIENTS / 3, failure)
    assert.isAtLeast(f.reconnects, CLIENTS, failure)
    // Clients land on the other nodes while one restarts, and a restarted node takes clients again
    // (the last one gets them only as clients reconnect for other reasons: nothing moves them back).
    for (const [k, restart] of result.restarts.entries()) {
      assert.strictEqual(restart.connections.reduce((a, b) => a + b, 0), CLIENTS, failure)
      if (k > 0) assert.isAbove(restart.connections[k - 1] as number, 0, `${restart.node}'s restart: ${failure}`)
    }
  })
})
