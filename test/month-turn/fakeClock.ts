/**
 * A wall clock shared by the processes of a deployment and moved by the test while they run, with
 * libfaketime (Debian's `faketime` package): the processes are started with `LD_PRELOAD` of the
 * library and read their offset from real time in a file that the test rewrites.
 *
 * - `FAKETIME_TIMESTAMP_FILE`: the file, holding an offset such as `+123456.789s`.
 * - `FAKETIME_NO_CACHE=1`: the file is read again at every clock read, so a move is seen at once
 *   (libfaketime otherwise keeps what it read for 10 s).
 * - `FAKETIME_DONT_FAKE_MONOTONIC=1`: only the wall clock moves; the monotonic clock, which a real
 *   machine never jumps and which Node's timers run on, stays real.
 *
 * Offsets are worked out from the real `Date.now()` of the test process (which is not faked), so
 * the processes' clock reads the instant asked for at the moment of the move, and runs on at real
 * speed from there.
 */
import { existsSync, mkdtempSync, renameSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"

/**
 * The library: `LIBFAKETIME` from the environment, else where Debian's `faketime` package puts it
 * (`/usr/lib/<multiarch triplet>/faketime/libfaketime.so.1`).
 */
export const LIBFAKETIME = process.env["LIBFAKETIME"] ??
  [
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1"
  ].find((path) => existsSync(path)) ??
  "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"

export interface FakeClock {
  /** The environment that puts a process on this clock. */
  readonly env: Readonly<Record<string, string>>
  /** Moves the clock of every process on it: it reads `instantMs` now. */
  readonly setTo: (instantMs: number) => void
  /** What the processes' clock reads now. */
  readonly now: () => number
  /** Resolves once the processes' clock reads `instantMs` or later (real time passing); fails after `timeoutMs`. */
  readonly waitUntil: (instantMs: number, timeoutMs: number) => Promise<void>
  /** Removes the offset file's directory. */
  readonly dispose: () => void
}

/** Whether libfaketime is installed where `LIBFAKETIME` says. */
export const libfaketimeInstalled = (): boolean => existsSync(LIBFAKETIME)

/** A clock that starts by reading `instantMs` (real time until `setTo` when not given). */
export const makeFakeClock = (instantMs?: number): FakeClock => {
  if (!libfaketimeInstalled()) {
    throw new Error(`libfaketime is not installed at ${LIBFAKETIME} (Debian: apt-get install faketime; or set LIBFAKETIME to the library's path)`)
  }
  const dir = mkdtempSync(join(tmpdir(), "autopush-fake-clock-"))
  const file = join(dir, "offset")
  let offsetMs = 0
  const write = (ms: number): void => {
    offsetMs = ms
    const seconds = (ms / 1000).toFixed(3)
    // Written aside and renamed over the file: a process reading it meanwhile sees the old offset or
    // the new one, never a half-written line.
    const next = join(dir, "offset.next")
    writeFileSync(next, `${ms < 0 ? "" : "+"}${seconds}s\n`)
    renameSync(next, file)
  }
  write(0)
  const clock: FakeClock = {
    env: {
      LD_PRELOAD: LIBFAKETIME,
      FAKETIME_TIMESTAMP_FILE: file,
      FAKETIME_NO_CACHE: "1",
      FAKETIME_DONT_FAKE_MONOTONIC: "1"
    },
    setTo: (at) => write(at - Date.now()),
    now: () => Date.now() + offsetMs,
    waitUntil: async (at, timeoutMs) => {
      const deadline = Date.now() + timeoutMs
      while (clock.now() < at) {
        if (Date.now() >= deadline) {
          throw new Error(`the fake clock did not reach ${new Date(at).toISOString()} within ${timeoutMs} ms (it reads ${new Date(clock.now()).toISOString()})`)
        }
        await new Promise((resolve) => setTimeout(resolve, Math.min(100, Math.max(1, at - clock.now()))))
      }
    },
    dispose: () => rmSync(dir, { recursive: true, force: true })
  }
  if (instantMs !== undefined) clock.setTo(instantMs)
  return clock
}

/** The `Date` header of a response of `url`: the clock of the process that answered, to the second. */
export const clockOf = async (url: string): Promise<number> => {
  const res = await fetch(url)
  await res.arrayBuffer()
  const date = res.headers.get("date")
  if (date === null) throw new Error(`${url} answered without a Date header`)
  return Date.parse(date)
}
