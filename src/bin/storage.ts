/**
 * storage: the embedded storage as a server for nodes on other processes or hosts (`storage --help`; src/tools/).
 */
import "../../bin/require-node.js" // first: a Node too old for the sources stops here, before the rest loads
import { runTool } from "../tools/cli.ts"
import { storageServer } from "../tools/storageServer.ts"

runTool("storage", storageServer(process.argv.slice(2)))
