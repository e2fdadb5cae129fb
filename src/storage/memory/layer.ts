/**
 * In-memory Storage: the DynamoDB layer's semantics without a server, for tests of the services
 * above storage. Tables must be created (`createTables`) before use, exactly as with DynamoDB; an
 * operation on a missing table fails with a `StorageError` whose reason is `MissingTable`. Each
 * operation runs without yielding, so conditional writes are atomic as they are on the server.
 *
 * The operations by table, as for SQLite and DynamoDB: the tables and rows `memory/rows.ts`; the
 * router table (users, the broadcast set) `memory/users.ts`; channel sets `memory/channels.ts`;
 * messages `memory/messages.ts`; receipts `memory/receipts.ts`; creating, checking and dropping tables
 * and stale users `memory/maintenance.ts`.
 */
import * as Layer from "effect/Layer"
import { makeMemoryChannels } from "./channels.ts"
import { makeMemoryMaintenance } from "./maintenance.ts"
import { makeMemoryMessages } from "./messages.ts"
import { makeMemoryReceipts } from "./receipts.ts"
import { makeMemoryStore } from "./rows.ts"
import { makeMemoryUsers } from "./users.ts"
import { Storage } from "../Storage.ts"
import { type StorageOptions, tablesByClock } from "../tables.ts"

export const layerMemory = (options: StorageOptions): Layer.Layer<Storage> =>
  Layer.sync(Storage, () => {
    const store = makeMemoryStore(options)
    return Storage.of({
      ...makeMemoryUsers(store),
      ...tablesByClock(options),
      ...makeMemoryChannels(store),
      ...makeMemoryMessages(store),
      ...makeMemoryReceipts(store),
      ...makeMemoryMaintenance(store)
    })
  })
