// Imported first by every entrypoint of src/bin/: on a Node too old for the sources that still
// loaded this far, one clear line and exit 1 before the entrypoint's other modules load.
import { tooOldNode } from "./node-version.js"

const problem = tooOldNode(process.argv[1] ?? "autopush", process.versions.node)
if (problem !== undefined) {
  process.stderr.write(`${problem}\n`)
  process.exit(1)
}
