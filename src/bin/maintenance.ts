/**
 * maintenance: create, list and drop tables, drop stale users (`maintenance --help`; src/tools/).
 */
import "../../bin/require-node.js" // first: a Node too old for the sources stops here, before the rest loads
import { runTool } from "../tools/cli.ts"
import { maintenance } from "../tools/maintenance.ts"

runTool("maintenance", maintenance(process.argv.slice(2)))
