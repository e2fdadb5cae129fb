/**
 * Many users' saves at once (`Storage.saveManyMessages`): what one save is, the operation, and the
 * operation for stores without transactions, made of `saveMessages`.
 */
import * as Effect from "effect/Effect"
import type { Notification } from "../domain/notification.ts"

/** One user's save, as `saveMessages` takes it. */
export interface MessageSave {
  readonly uaid: string
  readonly table: string
  readonly messages: ReadonlyArray<Notification>
}

/** The `Storage` operation (`E`: the store's error). */
export interface ManySaves<E> {
  /**
   * `saveMessages` for many users at once (the sessions of a node that stops save together: on SQL
   * stores in one transaction, where one each would cost a commit and a round of the write lock
   * each); the messages as stored, save by save. A failure fails them all.
   */
  readonly saveManyMessages: (saves: ReadonlyArray<MessageSave>) => Effect.Effect<ReadonlyArray<ReadonlyArray<Notification>>, E>
}

/** `saveManyMessages` as one `saveMessages` per save, `concurrency` at once. */
export const saveManyMessagesEach = <E>(
  saveMessages: (uaid: string, table: string, messages: ReadonlyArray<Notification>) => Effect.Effect<ReadonlyArray<Notification>, E>,
  concurrency: number
): ManySaves<E>["saveManyMessages"] =>
(saves) => Effect.forEach(saves, (save) => saveMessages(save.uaid, save.table, save.messages), { concurrency })
