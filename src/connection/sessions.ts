/**
 * The node's sessions: what a session talks to (`sessionPorts`, its storage bounded per node) and
 * the fiber that turns each accepted socket into a running session.
 */
import * as Cause from "effect/Cause"
import * as Deferred from "effect/Deferred"
import * as Effect from "effect/Effect"
import * as Exit from "effect/Exit"
import * as Pull from "effect/Pull"
import * as Queue from "effect/Queue"
import { Broadcasts } from "../broadcast/Broadcasts.ts"
import { EndpointCrypto } from "../crypto/endpoint.ts"
import { EventLog } from "../observability/EventLog.ts"
import { Permits } from "../platform/permits.ts"
import {
  makeSession,
  protocolFor,
  SessionHandle,
  type SessionOptions,
  type SessionPorts,
  type SessionRunner
} from "../protocol/session.ts"
import type { Notification } from "../domain/notification.ts"
import type { MessageSave } from "../storage/manySaves.ts"
import { mapStorageOperations, Storage, type StorageError, type StorageService } from "../storage/Storage.ts"
import { PeerNodes } from "./peers.ts"
import { NodeRegistry, type NodeRegistryService } from "./registry.ts"
import type { PushSocket, TransportLimits } from "./socket.ts"

/**
 * Storage operations of a node's sessions in flight at once. Beyond, they wait here: a reconnect
 * storm queues in the node, not in the store, and an operation's `storage_timeout` starts when it is
 * sent, so it measures the store rather than a queue of the node's own making (which failed the
 * hellos of a storm that a busy store would still have answered in time).
 */
export const SESSION_STORAGE_CONCURRENCY = 128

export const sessionStorage = (storage: StorageService) =>
  Effect.sync(() => {
    const inFlight = new Permits(SESSION_STORAGE_CONCURRENCY)
    const bounded = mapStorageOperations(storage, () => (operation) => inFlight.withPermit(operation), { values: false })
    // A gathered save holds a permit of its own, as every other operation: a batch is made of
    // saves in flight (SESSION_STORAGE_CONCURRENCY at most; on SQL stores a transaction holding the
    // write lock a few ms), so the store's queue stays what it can answer within `storage_timeout`.
    const saves = batchedSaves(storage)
    const saveMessages: StorageService["saveMessages"] = (uaid, table, messages) => inFlight.withPermit(saves(uaid, table, messages))
    return { ...bounded, saveMessages }
  })

interface WaitingSave {
  readonly save: MessageSave
  readonly done: Deferred.Deferred<ReadonlyArray<Notification>, StorageError>
}

const nextTurn = Effect.callback<void>((resume) => {
  const turn = setImmediate(() => resume(Effect.void))
  return Effect.sync(() => clearImmediate(turn))
})

/**
 * `saveMessages` of the node's sessions, gathered: the saves asked for in one turn of the event loop
 * go to the store as one `saveManyMessages` — a node that stops, or loses
 * many clients at once, saves them in a few large writes instead of one each. A save alone in its
 * turn goes as it is. The first save of a turn makes the write, uninterruptibly (the others wait for
 * it); after a failed batch each save is made alone, so a failure is only its own.
 */
const batchedSaves = (storage: Pick<StorageService, "saveMessages" | "saveManyMessages">): StorageService["saveMessages"] => {
  let open: Array<WaitingSave> | undefined
  const write = (batch: Array<WaitingSave>) =>
    Effect.gen(function*() {
      yield* nextTurn
      if (open === batch) open = undefined
      if (batch.length === 1) {
        const [{ done, save }] = batch as [WaitingSave]
        return yield* Deferred.done(done, yield* Effect.exit(storage.saveMessages(save.uaid, save.table, save.messages)))
      }
      const exit = yield* Effect.exit(storage.saveManyMessages(batch.map((waiting) => waiting.save)))
      if (Exit.isSuccess(exit)) return batch.forEach((waiting, i) => Deferred.doneUnsafe(waiting.done, Exit.succeed(exit.value[i] ?? [])))
      // A store too busy to answer in time (or unavailable) is no save's own failure: each save
      // is told so and retries, in the batches of its next turn. Made alone, the batch's saves
      // would each take the write lock where once was too slow.
      const busy = Cause.findErrorOption(exit.cause)
      if (busy._tag === "Some" && busy.value.isRetryable) return batch.forEach((waiting) => Deferred.doneUnsafe(waiting.done, Exit.failCause(exit.cause)))
      // One save that fails must not fail the others with it (nor keep failing the batches its
      // retries join): after a failed batch each save goes alone and gets its own outcome.
      yield* Effect.forEach(batch, ({ done, save }) =>
        Effect.flatMap(Effect.exit(storage.saveMessages(save.uaid, save.table, save.messages)), (alone) => Deferred.done(done, alone)), { concurrency: 8 })
    })
  return (uaid, table, messages) =>
    Effect.suspend(() => {
      const waiting: WaitingSave = { save: { uaid, table, messages }, done: Deferred.makeUnsafe() }
      if (open !== undefined) {
        open.push(waiting)
        return Deferred.await(waiting.done)
      }
      const batch = open = [waiting]
      return Effect.andThen(Effect.uninterruptible(write(batch)), Deferred.await(waiting.done))
    })
}

/** What a session talks to, from the node's services: the one place the session's ports are assembled. */
export const sessionPorts = (options: SessionOptions, logFrames: boolean) =>
  Effect.gen(function*() {
    return {
      storage: yield* sessionStorage(yield* Storage),
      events: yield* EventLog,
      registry: yield* NodeRegistry,
      peers: yield* PeerNodes,
      endpoints: yield* EndpointCrypto,
      broadcasts: (yield* Broadcasts).current,
      options,
      protocol: protocolFor(options),
      logFrames
    } satisfies SessionPorts
  })

/**
 * Run a session for every socket `accept` takes, until `stopAccepting`; `ended` is told of each
 * session whose fiber ended (`this`: its runner), closed or not. `done` ends once the sessions did.
 *
 * Every session fiber is a child of one fiber: a child costs its parent one Set entry, where a
 * FiberSet would put an exit observer of its own (a closure) beside the session's (memory per
 * connection).
 */
export const runSessions = (
  ports: SessionPorts,
  registry: NodeRegistryService,
  channelCapacity: number,
  ended: (this: SessionRunner) => void
) =>
  Effect.gen(function*() {
    const accepted = yield* Queue.unbounded<PushSocket, Cause.Done>()
    const done = yield* Effect.forkScoped(Effect.awaitAllChildren(
      Queue.take(accepted).pipe(
        Effect.flatMap((socket) => makeSession(ports, socket, socket.handle as SessionHandle)),
        Effect.flatMap((session) =>
          Effect.map(
            Effect.forkChild(session.run(), { startImmediately: true }),
            (fiber) => fiber.addObserver(ended.bind(session))
          )
        ),
        Effect.forever,
        Pull.catchDone(() => Effect.void)
      )
    ))
    const accept = (socket: PushSocket): void => {
      const handle = new SessionHandle(channelCapacity, Number.POSITIVE_INFINITY, (socket.limits as TransportLimits).inbox)
      handle.mailbox.gate = socket
      socket.handle = handle
      // The session's cleanup takes it out of the registry.
      registry.track(handle)
      if (Queue.offerUnsafe(accepted, socket)) return
      // Draining: no new sessions.
      registry.remove(handle)
      socket.terminate()
    }
    return { accept, stopAccepting: (): void => void Queue.endUnsafe(accepted), done }
  })
