/** The contract against dynalite on disk (the embedded default), started by this file on a free port. */
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect, Exit, Scope } from "effect"
import { afterAll, beforeAll } from "vitest"
import { layerDynamo } from "../../src/storage/dynamo/layer.ts"
import { startDynalite } from "../../src/storage/dynalite/embedded.ts"
import { storageContract } from "./contract.ts"
import { schemaSuite } from "./schema.ts"

const dataDir = mkdtempSync(join(tmpdir(), "autopush-dynalite-"))
const scope = Effect.runSync(Scope.make())
let endpoint = ""

beforeAll(async () => {
  endpoint = await Effect.runPromise(Scope.provide(startDynalite(dataDir), scope))
})

afterAll(async () => {
  await Effect.runPromise(Scope.close(scope, Exit.void))
  rmSync(dataDir, { recursive: true, force: true })
})

storageContract("dynalite", (options) => layerDynamo({ ...options, endpoint, region: "local" }))
schemaSuite("dynalite", () => endpoint, { ttl: false })
