/**
 * Test access to a running deployment's receipt table: make every receipt subscription expire now,
 * as its idle time running out would (a subscription that is listened to is renewed, so a test
 * cannot wait for that).
 */
import { DatabaseSync } from "node:sqlite"
import { Effect, Stream } from "effect"
import { layerDynamoTableCopy } from "../../src/storage/dynamo/export.ts"
import { TableCopy } from "../../src/storage/tableCopy.ts"
import { N } from "../../src/storage/items.ts"
import { META_SORT_KEY } from "../../src/storage/model.ts"
import type { Deployment } from "./servers.ts"

export const expireReceiptSubscriptions = (deployment: Deployment, routerTable = "router"): Promise<number> => {
  if (deployment.storageFile !== undefined) {
    const db = new DatabaseSync(deployment.storageFile, { timeout: 5_000 })
    try {
      return Promise.resolve(Number(db.prepare(`UPDATE "${routerTable}_receipts" SET expiry = 1 WHERE message = ?`).run(META_SORT_KEY).changes))
    } finally {
      db.close()
    }
  }
  const storageEndpoint = deployment.storageEndpoint?.() ?? ""
  return Effect.runPromise(
    TableCopy.use((tables) =>
      Effect.gen(function*() {
        const table = `${routerTable}_receipts`
        const subscriptions = (yield* Stream.runCollect(tables.scan(table))).filter((item) => item.message?.S === META_SORT_KEY)
        yield* tables.putItems(table, subscriptions.map((item) => ({ ...item, expiry: N(1) })))
        return subscriptions.length
      })
    ).pipe(Effect.provide(layerDynamoTableCopy({ routerTable, messageTablePrefix: "message", noTableRotation: false, endpoint: storageEndpoint, region: "local" })))
  )
}
