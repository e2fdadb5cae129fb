/** Writes config/*.ini from the option table: `node src/config/write-samples.ts`. */
import { writeFileSync } from "node:fs"
import { sampleIni } from "./docs.ts"
import { iniFile, scopeNames } from "./options.ts"

for (const scope of scopeNames) {
  const path = new URL(`../../config/${iniFile[scope]}`, import.meta.url)
  writeFileSync(path, sampleIni(scope))
  console.log(`wrote ${path.pathname}`)
}
