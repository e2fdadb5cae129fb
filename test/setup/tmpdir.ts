/**
 * Vitest global setup: every test run gets its own temp directory (TMPDIR, inherited by the test
 * workers and every process they start), removed when the run ends — a run leaves nothing in the
 * machine's temp directory, whichever test or child process wrote there.
 */
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"

export default function setup(): () => void {
  const dir = mkdtempSync(join(tmpdir(), "autopush-test-run-"))
  process.env["TMPDIR"] = dir
  return () => rmSync(dir, { recursive: true, force: true })
}
