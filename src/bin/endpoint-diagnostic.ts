/**
 * endpoint-diagnostic URL: decrypt an endpoint and show its user, channel and stored messages
 * (`endpoint-diagnostic --help`; src/tools/diagnostic.ts).
 */
import "../../bin/require-node.js" // first: a Node too old for the sources stops here, before the rest loads
import { runTool } from "../tools/cli.ts"
import { endpointDiagnostic } from "../tools/diagnostic.ts"

runTool("endpoint-diagnostic", endpointDiagnostic(process.argv.slice(2)))
