/**
 * The measuring side of every server process of `bench:delivery`: imported by the bench's own server
 * scripts, and preloaded (`node --import bench/delivery-probe.ts`) into the real entrypoints, so that
 * they need no change. Over the IPC channel it answers
 *
 * - `{ probe: "cpu" }` → `{ probe: "cpu", cpu, loopP99, loopMax, gcMs, gcMax }`: user + system CPU
 *   µs so far (`process.cpuUsage`), and since the previous request the event-loop delay p99 and max
 *   (ms, `monitorEventLoopDelay`) and the GC pauses, total and longest (ms);
 * - `{ probe: "gc" }` → `{ probe: "collected" }`, after a full garbage collection (when started with
 *   `--expose-gc`; else at once);
 * - `{ probe: "profile-start", intervalUs }` → starts the V8 sampling profiler and the sampling heap
 *   profiler (`node:inspector`; every allocation counted, also those the GC has collected since);
 * - `{ probe: "profile-stop", file }` → stops them, writes the `.cpuprofile` to `file` (and the
 *   `.heapprofile` beside it) and answers `{ probe: "profile", samples, top, byPackage, allocated,
 *   allocations }`: self time by function and by package, as shares of the samples, idle time and
 *   the probe's own inspector calls left out; the bytes allocated meanwhile (V8's estimate from its
 *   samples), and the functions that allocated most.
 *
 * The channel does not keep the process alive; when the bench goes away the process stops itself
 * (SIGTERM to itself, so the entrypoints shut down as they would under a supervisor).
 */
import { Session } from "node:inspector/promises"
import { writeFile } from "node:fs/promises"
import { monitorEventLoopDelay, PerformanceObserver } from "node:perf_hooks"

interface CallFrame {
  readonly functionName: string
  readonly url: string
  readonly lineNumber: number
}
interface ProfileNode {
  readonly id: number
  readonly callFrame: CallFrame
  readonly hitCount?: number
  readonly children?: ReadonlyArray<number>
}
interface Profile {
  readonly nodes: ReadonlyArray<ProfileNode>
}
/** A node of V8's sampling heap profile: the bytes allocated by the function itself, estimated. */
interface HeapNode {
  readonly callFrame: CallFrame
  readonly selfSize: number
  readonly children: ReadonlyArray<HeapNode>
}

export interface SelfTime {
  readonly name: string
  /** Share of the non-idle samples, 0–1. */
  readonly share: number
}

export interface ProfileSummary {
  readonly probe: "profile"
  /** Non-idle samples. */
  readonly samples: number
  readonly top: ReadonlyArray<SelfTime>
  readonly byPackage: ReadonlyArray<SelfTime>
  /** Share of the samples whose (synchronous) stack holds a frame of the package. */
  readonly inclusive: ReadonlyArray<SelfTime>
  /** Bytes allocated while profiled. */
  readonly allocated: number
  /** The functions that allocated most: `share` of the bytes allocated. */
  readonly allocations: ReadonlyArray<SelfTime>
}

const root = new URL("../", import.meta.url).href

/**
 * `node_modules/<pkg>` (scoped too; the AWS SDK's `@aws-sdk/*` and `@smithy/*` as one), `src/<dir>`,
 * `node:internal`, or the V8 pseudo-frames.
 */
const packageOf = (frame: CallFrame): string => {
  const url = frame.url
  if (url === "") return frame.functionName.startsWith("(") ? frame.functionName : "(native)"
  if (url.startsWith("node:")) return "node (internals)"
  const nm = url.lastIndexOf("/node_modules/")
  if (nm >= 0) {
    const rest = url.slice(nm + "/node_modules/".length).split("/")
    if (rest[0] === "@aws-sdk" || rest[0] === "@smithy") return "AWS SDK"
    return rest[0]?.startsWith("@") ? `${rest[0]}/${rest[1]}` : (rest[0] ?? url)
  }
  if (url.startsWith(root)) {
    const parts = url.slice(root.length).split("/")
    return parts.length > 2 ? `${parts[0]}/${parts[1]}` : parts.join("/")
  }
  return url
}

const shortUrl = (url: string): string => {
  const nm = url.lastIndexOf("/node_modules/")
  if (nm >= 0) return url.slice(nm + "/node_modules/".length)
  return url.startsWith(root) ? url.slice(root.length) : url
}

const functionName = (frame: CallFrame): string =>
  frame.url === ""
    ? frame.functionName || "(anonymous)"
    : `${frame.functionName || "(anonymous)"} ${shortUrl(frame.url)}:${frame.lineNumber + 1}`

/**
 * Self time as a share of the samples. Samples, not `timeDeltas`: on a machine shared with other
 * work the process is sometimes not scheduled, and the gap would be charged to the next sample.
 */
const summarise = (profile: Profile, heap: HeapNode, topN: number): ProfileSummary => {
  const byFunction = new Map<string, number>()
  const byPackage = new Map<string, number>()
  let total = 0
  for (const node of profile.nodes) {
    const frame = node.callFrame
    const hits = node.hitCount ?? 0
    // Idle is not CPU; `node:inspector` is this probe stopping the profiler.
    if (hits === 0 || frame.functionName === "(idle)" || frame.url === "node:inspector") continue
    total += hits
    const name = functionName(frame)
    byFunction.set(name, (byFunction.get(name) ?? 0) + hits)
    const pkg = packageOf(frame)
    byPackage.set(pkg, (byPackage.get(pkg) ?? 0) + hits)
  }
  // Inclusive: every package on the path from the root to each sampled node.
  const parentOf = new Map<number, ProfileNode>()
  for (const node of profile.nodes) for (const child of node.children ?? []) parentOf.set(child, node)
  const inclusive = new Map<string, number>()
  for (const node of profile.nodes) {
    const hits = node.hitCount ?? 0
    if (hits === 0 || node.callFrame.functionName === "(idle)" || node.callFrame.url === "node:inspector") continue
    const seen = new Set<string>()
    for (let n: ProfileNode | undefined = node; n !== undefined; n = parentOf.get(n.id)) {
      if (n.callFrame.url !== "" && !n.callFrame.url.startsWith("node:")) seen.add(packageOf(n.callFrame))
    }
    for (const pkg of seen) inclusive.set(pkg, (inclusive.get(pkg) ?? 0) + hits)
  }
  const sorted = (m: Map<string, number>) =>
    Array.from(m, ([name, hits]) => ({ name, share: hits / total })).sort((a, b) => b.share - a.share).slice(0, topN)
  const allocatedBy = new Map<string, number>()
  let allocated = 0
  const walk = (node: HeapNode): void => {
    if (node.selfSize > 0) {
      allocated += node.selfSize
      const name = functionName(node.callFrame)
      allocatedBy.set(name, (allocatedBy.get(name) ?? 0) + node.selfSize)
    }
    for (const child of node.children) walk(child)
  }
  walk(heap)
  const allocations = Array.from(allocatedBy, ([name, bytes]) => ({ name, share: bytes / allocated }))
    .sort((a, b) => b.share - a.share).slice(0, topN)
  return { probe: "profile", samples: total, top: sorted(byFunction), byPackage: sorted(byPackage), inclusive: sorted(inclusive), allocated, allocations }
}

let session: Session | undefined

const LOOP_RESOLUTION_MS = 5
const loop = monitorEventLoopDelay({ resolution: LOOP_RESOLUTION_MS })
let gc = { total: 0, max: 0 }
const gcObserver = new PerformanceObserver((list) => {
  for (const entry of list.getEntries()) {
    gc.total += entry.duration
    gc.max = Math.max(gc.max, entry.duration)
  }
})

const onMessage = async (message: unknown): Promise<void> => {
  if (typeof message !== "object" || message === null || !("probe" in message)) return
  const m = message as { probe: string; intervalUs?: number; file?: string; topN?: number }
  switch (m.probe) {
    case "cpu": {
      const { user, system } = process.cpuUsage()
      process.send?.({
        probe: "cpu",
        cpu: user + system,
        // The histogram holds whole timer intervals: the delay is what exceeds the resolution.
        loopP99: Math.max(0, loop.percentile(99) / 1e6 - LOOP_RESOLUTION_MS),
        loopMax: Math.max(0, loop.max / 1e6 - LOOP_RESOLUTION_MS),
        gcMs: gc.total,
        gcMax: gc.max
      })
      loop.reset()
      gc = { total: 0, max: 0 }
      return
    }
    case "gc": {
      // Only with `--expose-gc`; otherwise nothing.
      ;(globalThis as { gc?: () => void }).gc?.()
      process.send?.({ probe: "collected" })
      return
    }
    case "profile-start": {
      session = new Session()
      session.connect()
      await session.post("Profiler.enable")
      await session.post("Profiler.setSamplingInterval", { interval: m.intervalUs ?? 200 })
      await session.post("Profiler.start")
      await session.post("HeapProfiler.startSampling", {
        samplingInterval: 8192,
        includeObjectsCollectedByMajorGC: true,
        includeObjectsCollectedByMinorGC: true
      })
      process.send?.({ probe: "profiling" })
      return
    }
    case "profile-stop": {
      if (session === undefined) return
      const { profile } = (await session.post("Profiler.stop")) as unknown as { profile: Profile }
      const heap = (await session.post("HeapProfiler.stopSampling")) as unknown as { profile: { head: HeapNode } }
      session.disconnect()
      session = undefined
      if (m.file !== undefined) {
        await writeFile(m.file, JSON.stringify(profile))
        await writeFile(m.file.replace(/\.cpuprofile$/, "") + ".heapprofile", JSON.stringify(heap.profile))
      }
      process.send?.(summarise(profile, heap.profile.head, m.topN ?? 15))
      return
    }
  }
}

if (process.send !== undefined) {
  loop.enable()
  gcObserver.observe({ entryTypes: ["gc"] })
  process.on("message", (message) => void onMessage(message))
  process.channel?.unref()
  process.on("disconnect", () => process.kill(process.pid, "SIGTERM"))
}
