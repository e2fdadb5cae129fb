/**
 * push: a Web Push client for trying the service — `listen`, `send`, `vapid-keys` (`push --help`; src/client/).
 */
import "../../bin/require-node.js" // first: a Node too old for the sources stops here, before the rest loads
import { pushCli } from "../client/cli.ts"
import { runTool } from "../tools/cli.ts"

runTool("push", pushCli(process.argv.slice(2)))
