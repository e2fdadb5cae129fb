/**
 * Whole tables out and in, for `maintenance export` and `import`: a service each backend provides,
 * reading and writing rows as the DynamoDB items of `items.ts` (the export format), so a copy keeps
 * every attribute a row has and an export file moves between backends.
 */
import * as Context from "effect/Context"
import type * as Effect from "effect/Effect"
import type * as Stream from "effect/Stream"
import type { Item } from "./items.ts"
import type { StorageError } from "./Storage.ts"

interface TableCopyService {
  /** Every item of `table`, a chunk per Scan page (eventually consistent, as any Scan). */
  readonly scan: (table: string) => Stream.Stream<Item, StorageError>
  /** The users in a router table (its items but the broadcasts item); 0 when the table is missing. */
  readonly countUsers: (routerTable: string) => Effect.Effect<number, StorageError>
  /** Put items into `table`, replacing items with the same key (batches of 25, unprocessed ones resubmitted). */
  readonly putItems: (table: string, items: ReadonlyArray<Item>) => Effect.Effect<void, StorageError>
}

export class TableCopy extends Context.Service<TableCopy, TableCopyService>()("autopush/storage/TableCopy") {}
