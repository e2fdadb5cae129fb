/**
 * `npm run bench:rolling`: the rolling restart of the rolling-restart lane (`test/rolling/`) at
 * scale, and the same storm against one node, in one run.
 *
 * - fleet: three connection nodes (`autoconnect`) behind HAProxy (TCP, leastconn, health checks;
 *   ⌈N / 9,000⌉ HAProxy processes on one port: one holds two descriptors a connection, and a
 *   process here may open 20,000), an endpoint node, all on one PostgreSQL schema; N clients,
 *   pushes at 50/s to random clients; each connection node sent SIGTERM and started again in turn;
 * - one node: one connection node (⌈N / 15,000⌉ workers, for the same reason), reached directly,
 *   the same N clients and pushes; the node sent SIGTERM and started again: all its clients
 *   reconnect to it.
 *
 * Clients wait up to --delay ms (uniformly at random) before they connect again, as a browser
 * does. Printed for each: pushes sent / answered 201 / delivered / delivered more than once, the
 * reconnects, the connection nodes' storage operations (their `/metrics`) from the first SIGTERM
 * until every client was working again, per reconnect, and the time from a client's close to its
 * next working session (hello answered, then its ping): p50 / p99 / max.
 *
 * Just before each SIGTERM, --burst pushes (1000) are sent at once to random clients: some reach the
 * stopping node's clients as it closes them, their acks in flight.
 *
 * Options (flag or environment): --clients/BENCH_CLIENTS (30000), --delay/BENCH_DELAY (1000),
 * --only/BENCH_ONLY (fleet or node; both by default), BENCH_NODE_FLAGS (more flags for the connection
 * nodes, e.g. `--close-grace 0`). PostgreSQL: AUTOPUSH_TEST_POSTGRES_DSN, or
 * a throwaway cluster (`.ci/postgres.sh`) as the tests start one.
 */
import { option } from "./harness.ts"
import { testPostgres } from "../test/storage/postgresServer.ts"
import { CONNECTIONS_PER_BALANCER } from "../test/rolling/fleet.ts"
import { figures, rollingRestart } from "../test/rolling/restart.ts"

const CLIENTS = Number(option("clients", "BENCH_CLIENTS", "30000"))
const DELAY_MS = Number(option("delay", "BENCH_DELAY", "1000"))
const ONLY = option("only", "BENCH_ONLY", "")
const PUSHES_PER_SECOND = 50
const BURST = Number(option("burst", "BENCH_BURST", "1000"))
/** More flags for the connection nodes, e.g. `--close-grace 0`. */
const NODE_FLAGS = (process.env["BENCH_NODE_FLAGS"] ?? "").split(" ").filter((flag) => flag !== "")

const server = testPostgres()
if ("missing" in server) throw new Error(server.missing)

const runs = [
  { name: "fleet: 3 nodes behind HAProxy", key: "fleet", nodes: 3, workers: 1, balancers: Math.ceil(CLIENTS / CONNECTIONS_PER_BALANCER) },
  { name: "one node", key: "node", nodes: 1, workers: Math.ceil(CLIENTS / 15_000), balancers: 0 }
].filter((run) => ONLY === "" || run.key === ONLY)

console.log(`bench:rolling: ${CLIENTS} clients, pushes at ${PUSHES_PER_SECOND}/s, reconnect delay up to ${DELAY_MS} ms, on PostgreSQL`)
const rows: Array<string> = []
const header = [
  "| run | pushes sent / 201 / delivered / duplicates | reconnects | storage operations a reconnect | close → working session s, p50 / p99 / max | SIGTERM → all working s, each node |",
  "|---|---:|---:|---:|---:|---:|"
]
for (const run of runs) {
  console.log(`${run.name} (${run.workers} worker(s) a node${run.balancers > 0 ? `, ${run.balancers} HAProxy process(es)` : ""}):`)
  const result = await rollingRestart({
    dsn: server.dsn,
    clients: CLIENTS,
    nodes: run.nodes,
    workers: run.workers,
    balancers: run.balancers,
    pushesPerSecond: PUSHES_PER_SECOND,
    burstAtSigterm: BURST,
    reconnectDelayMs: DELAY_MS,
    connectionFlags: NODE_FLAGS,
    log: (line) => console.log(`  ${line}`)
  })
  const f = figures(result)
  console.log(`  push answers ${JSON.stringify(result.pushStatus)}; close codes ${JSON.stringify(result.report.closeCodes)}; hellos answered with another uaid ${result.report.uaidChanged}`)
  console.log(`  attempts that failed before a hello's answer ${result.report.failedAttempts}: ${JSON.stringify(result.report.failures)}`)
  // The nodes' warnings and errors (they log nothing below), by message.
  const said = new Map<string, number>()
  for (const line of result.output) {
    const msg = /"msg":"([^"]+)"/.exec(line)?.[1]
    if (msg !== undefined) said.set(msg, (said.get(msg) ?? 0) + 1)
  }
  console.log(`  the nodes' warnings and errors: ${said.size === 0 ? "none" : [...said].map(([msg, n]) => `${msg} × ${n}`).join("; ")}`)
  console.log(`  storage operations: ${Object.entries(result.storageOperations).sort(([, a], [, b]) => b - a).map(([op, n]) => `${op} ${n}`).join(", ")}`)
  rows.push(`| ${run.name} | ${f.pushesSent} / ${f.accepted} / ${f.delivered} / ${f.duplicates} | ${f.reconnects} | ${f.operationsPerReconnect.toFixed(2)} | ${(f.p50Ms / 1000).toFixed(2)} / ${(f.p99Ms / 1000).toFixed(2)} / ${(f.maxMs / 1000).toFixed(2)} | ${result.restarts.map((r) => (r.recoveredMs / 1000).toFixed(1)).join(", ")} |`)
  console.log(`  ${rows.at(-1)}`)
}
console.log("")
for (const line of [...header, ...rows]) console.log(line)
