// The Node.js the project's TypeScript sources need: 22.19 or later (type stripping, and what the
// sources use of it). Plain JavaScript, so that an older Node can read it: the launchers (run.js)
// decide with it which Node runs the sources, and every entrypoint of src/bin/ imports
// `require-node.js` first, which stops a Node that can load a `.ts` file but is too old (22.18, or
// 22.6 to 22.17 with --experimental-strip-types) with a message saying what to run instead. A Node
// that cannot load a `.ts` file at all (20, say) stops before any of this can run, with
// ERR_UNKNOWN_FILE_EXTENSION: that one needs the launchers.
import { basename } from "node:path"

export const MINIMUM_NODE = "22.19"

/** Whether a Node of `version` (`process.versions.node`) runs the sources itself. */
export const runsSources = (version) => {
  const [major, minor] = version.split(".").map(Number)
  return major > 22 || (major === 22 && minor >= 19)
}

/**
 * Why an entrypoint (`src/bin/NAME.ts`, the script Node was given) cannot run on a Node of
 * `version`, and what to run instead; undefined when it can.
 */
export const tooOldNode = (entrypoint, version) => {
  if (runsSources(version)) return undefined
  const name = basename(entrypoint).replace(/\.[cm]?[jt]s$/, "")
  return `${basename(entrypoint)} needs Node.js ${MINIMUM_NODE} or later, and this is Node ${version}. ` +
    `Run it as node bin/${name}.js (or through npm: npm start, npm run …), which runs it on the project's own Node 24 ` +
    `(installed by npm install) when this one is older; or install Node ${MINIMUM_NODE}+.`
}
