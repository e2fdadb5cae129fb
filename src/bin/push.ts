/**
 * push: a Web Push client for trying the service — `listen`, `send`, `vapid-keys` (`push --help`; src/client/).
 */
import { pushCli } from "../client/cli.ts"
import { runTool } from "../tools/cli.ts"

runTool("push", pushCli(process.argv.slice(2)))
