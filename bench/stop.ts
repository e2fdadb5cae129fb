/**
 * `npm run bench:stop`: how long a node holding N connections takes to stop, and whether it loses
 * anything on the way.
 *
 * The real all-in-one entrypoint (`bin/autopush.js`, embedded SQLite, `--workers W` when asked) and
 * N clients in ⌈N / 15,000⌉ client processes (`stop-clients.ts`; a process here may open 20,000
 * files): each client says hello as a new user, registers one channel and stays connected. One push
 * is sent to each through the public API; the node delivers it directly (not stored) and the client
 * does not ack it. Then SIGTERM to the node, and the time until it (and its workers) have exited:
 * each session closes with 1001 and saves what its client did not ack, within `shutdown_timeout`.
 *
 * Then what was saved: the database file read directly (the node stopped) — which of the clients
 * have their message in the message table, not acked nor cancelled — and the node started again on
 * the same data directory, a sample of the clients coming back with their uaid and getting the
 * message they had not acked (the same version).
 *
 * With `--unacked` below 1, only that share of the clients gets a push (a node's clients mostly hold
 * nothing unacked): the others close without anything to save.
 *
 * Printed: N, workers, the stop time (SIGTERM to the last process gone), the CPU the node's processes
 * and the clients' spent meanwhile, the clients' close codes,
 * saved / expected (expected: the pushes that reached their client), the sample, and the target: the
 * node stops within `shutdown_timeout` (10 s by default), every unacked message saved.
 *
 * Options (flag or environment): --clients/BENCH_CLIENTS (10000), --workers/BENCH_WORKERS (1 up to
 * 15,000 clients, else one per 15,000: a process here may open 20,000 files), --unacked/BENCH_UNACKED
 * (the share of clients holding an unacked push, 1), BENCH_NODE_FLAGS (more
 * flags for the node, e.g. `--log-level info`: its last lines are printed after the stop):
 *
 *     npm run bench:stop -- --clients 100000 --workers 7
 */
import { type ChildProcess, fork } from "node:child_process"
import { join } from "node:path"
import { DatabaseSync } from "node:sqlite"
import { cpuMs, option } from "./harness.ts"
import { ask, startNode } from "./storm-node.ts"

const CLIENTS = Number(option("clients", "BENCH_CLIENTS", "10000"))
const CLIENTS_PER_PROCESS = 15_000
const WORKERS = Number(option("workers", "BENCH_WORKERS", String(CLIENTS <= CLIENTS_PER_PROCESS ? 1 : Math.ceil(CLIENTS / CLIENTS_PER_PROCESS))))
/** The share of clients that get a push and do not ack it. */
const UNACKED = Number(option("unacked", "BENCH_UNACKED", "1"))
/** More flags for the node (e.g. `--log-level info`, whose lines the run prints once the node has stopped). */
const NODE_FLAGS = (process.env["BENCH_NODE_FLAGS"] ?? "").split(" ").filter((flag) => flag !== "")
/** The node's `shutdown_timeout` (its default, 10 s, unless BENCH_NODE_FLAGS sets it): the target. */
const SHUTDOWN_TIMEOUT_S = NODE_FLAGS.includes("--shutdown-timeout") ? Number(NODE_FLAGS[NODE_FLAGS.indexOf("--shutdown-timeout") + 1]) : 10
/** Clients that come back after the restart to get their message. */
const SAMPLE = 1_000

type Message = readonly [uaid: string, version: string]

/** Which of `messages`' users have a stored message (a timestamp row, neither acked nor cancelled) in the database under `dataDir`. */
const savedIn = (dataDir: string, messages: ReadonlyArray<Message>): number => {
  const db = new DatabaseSync(join(dataDir, "autopush.sqlite"), { readOnly: true })
  try {
    const tables = (db.prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'message%'").all() as Array<{ name: string }>).map((t) => t.name)
    const queries = tables.map((table) =>
      db.prepare(`SELECT 1 FROM "${table}" WHERE uaid = ? AND chidmessageid >= '02:' AND chidmessageid < '02;' AND cancelled IS NULL AND data IS NOT NULL LIMIT 1`))
    return messages.filter(([uaid]) => queries.some((q) => q.get(uaid) !== undefined)).length
  } finally {
    db.close()
  }
}

const shareOf = (k: number, processes: number): readonly [number, number] => {
  const first = Math.floor((CLIENTS * k) / processes)
  return [first, Math.floor((CLIENTS * (k + 1)) / processes) - first]
}

const processes = Math.ceil(CLIENTS / CLIENTS_PER_PROCESS)
console.log(`bench:stop: ${CLIENTS} clients over ${processes} client process(es), a node of ${WORKERS} worker(s) on embedded SQLite`)
// The node's cap is shared by its workers, and the kernel spreads connections over them unevenly.
const node = await startNode(WORKERS, ["--max-connections", String(Math.ceil(CLIENTS * 1.5) + 1_000), ...NODE_FLAGS])
const children: Array<ChildProcess> = Array.from({ length: processes }, () =>
  fork(new URL("./stop-clients.ts", import.meta.url).pathname, [], { stdio: ["ignore", "inherit", "inherit", "ipc"] }))
try {
  let began = performance.now()
  const opened = (await Promise.all(children.map((child, k) => {
    const [first, count] = shareOf(k, processes)
    return ask<number>(child, { cmd: "open", wsUrl: node.wsUrl, first, count, inflight: Math.ceil(200 / processes) }, "opened")
  }))).reduce((a, b) => a + b, 0)
  console.log(`  ${opened} clients connected and registered (${((performance.now() - began) / 1000).toFixed(1)} s)`)

  began = performance.now()
  const pushed = await Promise.all(children.map((child) =>
    ask<{ accepted: number; arrived: number; messages: Array<Message> }>(child, { cmd: "push", inflight: Math.ceil(64 / processes), timeoutMs: 60_000, share: UNACKED }, "pushed")))
  const accepted = pushed.reduce((sum, p) => sum + p.accepted, 0)
  const messages = pushed.flatMap((p) => p.messages)
  console.log(`  ${accepted} pushes accepted, ${messages.length} arrived, none acked (${((performance.now() - began) / 1000).toFixed(1)} s)`)

  // CPU of the node's processes and of the clients while the node stops: each process's last reading
  // before it was gone (read every 20 ms: /proc counts in 10 ms ticks, and a process's last few ms are lost).
  const nodePids = node.pids()
  const clientPids = children.map((child) => child.pid as number)
  const cpuAt = new Map<number, number>()
  const readCpu = () => {
    for (const pid of [...nodePids, ...clientPids]) {
      try {
        cpuAt.set(pid, cpuMs(pid))
      } catch {
        // gone: its last reading stands
      }
    }
  }
  readCpu()
  const cpuBefore = new Map(cpuAt)
  const sampler = setInterval(readCpu, 20)
  began = performance.now()
  const sigterm = Date.now()
  await node.terminate()
  const stopSeconds = (performance.now() - began) / 1000
  clearInterval(sampler)
  readCpu()
  const spent = (pids: ReadonlyArray<number>) => pids.reduce((sum, pid) => sum + (cpuAt.get(pid) ?? 0) - (cpuBefore.get(pid) ?? 0), 0)
  const [nodeCpuMs, clientsCpuMs] = [spent(nodePids), spent(clientPids)]
  const closes = await Promise.all(children.map((child) => ask<{ codes: Record<string, number>; open: number }>(child, { cmd: "closed", timeoutMs: 5_000 }, "closed")))
  const codes: Record<string, number> = {}
  for (const c of closes) for (const [code, n] of Object.entries(c.codes)) codes[code] = (codes[code] ?? 0) + n
  console.log(`  SIGTERM: every process gone after ${stopSeconds.toFixed(2)} s; close codes ${Object.entries(codes).map(([code, n]) => `${code} × ${n}`).join(", ")}`)
  console.log(`  CPU meanwhile: the node ${(nodeCpuMs / 1000).toFixed(2)} s (${((nodeCpuMs * 1000) / CLIENTS).toFixed(0)} µs a connection), the clients ${(clientsCpuMs / 1000).toFixed(2)} s`)
  // Its own lines but the sessions' (one each), seconds after the SIGTERM.
  const said = node.output.filter((line) => !line.startsWith("[autopush") && !line.includes('"msg":"Session"')).map((line) => {
    const ns = /"Timestamp":(\d+)/.exec(line)?.[1]
    return ns === undefined ? line : `+${(Number(ns) / 1e6 - sigterm).toFixed(0)} ms ${line}`
  })
  const storageFailures = node.output.filter((line) => line.includes('"msg":"storage failed"')).length
  if (said.length > 0) console.log(`  the node said (${said.length} lines, ${storageFailures} of them \`storage failed\`; the last 40):\n    ${said.slice(-40).join("\n    ")}`)

  const saved = savedIn(node.dataDir, messages)
  console.log(`  saved (the database read directly): ${saved} of ${messages.length} unacked messages`)

  await node.restart()
  // A sample spread over the client processes, each client back from where it was.
  const step = Math.max(1, Math.floor(messages.length / SAMPLE))
  const sample = messages.filter((_, i) => i % step === 0).slice(0, SAMPLE)
  const perProcess = Math.ceil(sample.length / processes)
  const resumed = await Promise.all(children.map((child, k) =>
    ask<{ same: number; other: number; none: number }>(child, {
      cmd: "resume",
      wsUrl: node.wsUrl,
      clients: sample.slice(k * perProcess, (k + 1) * perProcess).map(([uaid, version], i) => [shareOf(k, processes)[0] + i, uaid, version]),
      timeoutMs: 10_000
    }, "resumed")))
  const same = resumed.reduce((sum, r) => sum + r.same, 0)
  const other = resumed.reduce((sum, r) => sum + r.other, 0)
  const none = resumed.reduce((sum, r) => sum + r.none, 0)
  console.log(`  restarted; ${sample.length} of them came back: ${same} got the message they had not acked, ${other} another, ${none} none within 10 s`)

  const met = stopSeconds <= SHUTDOWN_TIMEOUT_S && saved === messages.length && messages.length === accepted && same === sample.length
  console.log("")
  console.log("| clients | workers | holding an unacked push | stop s | node CPU µs a connection | unacked saved / expected | sample back after restart |")
  console.log("|---:|---:|---:|---:|---:|---:|---:|")
  console.log(`| ${CLIENTS} | ${WORKERS} | ${messages.length} | ${stopSeconds.toFixed(2)} | ${((nodeCpuMs * 1000) / CLIENTS).toFixed(0)} | ${saved} / ${messages.length} | ${same} / ${sample.length} |`)
  console.log(`target: stops within shutdown_timeout (${SHUTDOWN_TIMEOUT_S} s), every unacked message saved — ${met ? "met" : "NOT met"}`)
} finally {
  for (const child of children) child.kill()
  await node.stop()
}
